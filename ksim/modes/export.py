"""mode=export: a checkpoint's deterministic policy as ONNX, with the JSON that says what it reads and drives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import xax
from omegaconf import OmegaConf

from ksim.config import ConfigError
from ksim.deploy.onnx import export_policy
from ksim.deploy.robot_side import RobotSide, describe_robot
from ksim.learner.memory import PolicyState
from ksim.policy_spec import SIMULATOR
from ksim.task.reference import class_reference
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig, SharedState

Array = jax.Array


@dataclass
class Settings:
    export_path: str = xax.field("", help="Write the deterministic policy to this .onnx file.")


def check(config: RLConfig, settings: Settings) -> None:
    if not config.load_from_ckpt_path:
        raise ConfigError("mode='export' needs load_from_ckpt_path=<checkpoint file>")
    if not settings.export_path:
        raise ConfigError("mode='export' needs export_path=<file>.onnx")
    if not settings.export_path.endswith(".onnx"):
        raise ConfigError(f"export_path={settings.export_path!r} must end in .onnx")


def exported_policy(task: RLTask[Any], shared: SharedState) -> Callable[..., tuple[Array, ...]]:
    """The exported policy: (observations, *memory) -> (actions, *next memory), a batch of robots, acting with
    `shared`'s deployed parameters (the moving average where one is kept).

    The memory inputs are the actor's GRU state (recurrent_size > 0) and the past observation frames
    (observation_history > 1); the ONNX file takes and returns them in that order (ksim.deploy.onnx).
    """
    memory = task.memory_settings()
    recurrent, history = memory["recurrent_size"] > 0, memory["observation_history"] > 1
    observation_dim, critic_dim = task.environment.observation_dim, task.environment.critic_observation_dim
    key = jax.random.PRNGKey(0)  # unused by the deterministic policy
    shared = shared.deployed()

    def step(obs: Array, *memory_inputs: Array) -> tuple[Array, ...]:
        inputs, batch = list(memory_inputs), obs.shape[0]
        actor_carry = inputs.pop(0) if recurrent else jnp.zeros((batch, 0))
        past_frames = inputs.pop(0) if history else jnp.zeros((batch, 0, observation_dim))
        carry = jnp.stack([actor_carry, jnp.zeros_like(actor_carry)], axis=-2)  # the critic does not run here
        state = PolicyState(past_frames=past_frames, carry=carry)
        no_critic_obs = jnp.zeros((batch, critic_dim))
        out = task.act(shared, state, obs, no_critic_obs, jnp.asarray(False), key, deterministic=True)
        next_carry, next_past = out.state.carry[:, 0], out.state.past_frames
        return (out.action, *([next_carry] if recurrent else []), *([next_past] if history else []))

    return step


def robot_side(task: RLTask[Any]) -> RobotSide:
    """The task's policy inputs as a robot computes them, its actuation, command and model (ksim.deploy.robot_side)."""
    environment = task.environment
    parts, engine = environment.components, environment.engine
    return describe_robot(
        parts.observations,
        environment.observation_layout(),
        engine.layout,
        engine.mj_model,
        parts.actuators,
        parts.command,
        environment.settings.max_episode_steps,
        engine.default_qpos,
    )


def task_identity(task: RLTask[Any], export_folder: Path) -> dict[str, str]:
    """What rebuilds the task elsewhere (ksim.sim2sim judges episodes with it): its class, config class (each
    "module:Class", or a script's "FILE.py:Class" relative to the export's folder) and config."""
    return {
        "task_class": class_reference(type(task), export_folder),
        "config_class": class_reference(type(task.config), export_folder),
        "task_config": OmegaConf.to_yaml(OmegaConf.structured(task.config)),
    }


def simulator_inputs_line(robot: RobotSide, refuse: bool) -> str:
    """One line naming the inputs only a simulator knows ("" when there are none); ConfigError if `refuse`."""
    inputs = [item for item in robot.inputs if item.source == SIMULATOR]
    if not inputs:
        return ""
    named = ", ".join(f"{item.name} (reading {item.reading!r})" for item in inputs)
    if refuse:
        raise ConfigError(f"robot_inputs_only=true: the policy reads what only a simulator knows: {named}")
    return f"note: only a simulator knows {named}; ksim.runtime needs these readings from its caller"


def run(task: RLTask[Any], settings: Settings) -> Path:
    """Writes the checkpoint's deterministic policy to export_path (ONNX), a JSON beside it saying how a robot
    runs it, and the model it was trained on (MJB); `check` has passed on the task's config and `settings`."""
    checkpoint = task.config.load_from_ckpt_path
    robot = robot_side(task)
    note = simulator_inputs_line(robot, task.config.robot_inputs_only)
    shared = jax.device_get(task.checkpoints.load(checkpoint)["shared"])
    doc = (type(task.actuators).__doc__ or "").strip().splitlines()
    onnx_path, json_path = export_policy(
        exported_policy(task, shared),
        task.checkpoints.metadata,
        doc[0] if doc else "",
        settings.export_path,
        checkpoint,
        robot,
        task_identity(task, Path(settings.export_path).parent),
    )
    if note:
        print(note, flush=True)
    written = [onnx_path, json_path, onnx_path.with_suffix(".mjb")]
    if robot.motion is not None:
        written.append(onnx_path.with_suffix(".motion.npz"))
    print(f"wrote {', '.join(map(str, written[:-1]))} and {written[-1]}", flush=True)
    return onnx_path
