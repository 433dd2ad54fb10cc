"""Export: the deterministic policy (mean action, observation normalisation included) as ONNX, described for a robot.

`policy.onnx` maps a batch of raw observation vectors (float32, shape (batch, observation_size)) to
actions (batch, action_size). A policy with memory also takes its memory and returns the next one:
`recurrent_state` (batch, recurrent_size) -> `next_recurrent_state` with `recurrent_size > 0`, then
`past_observations` (batch, observation_history - 1, observation_size) -> `next_past_observations` with
`observation_history > 1`. `policy.json` beside it (ksim.policy_spec) says how each observation component is
computed from a robot's readings, the memory inputs with their reset rule, how an action becomes actuator
targets, the command, ctrl_dt, the task and the library versions; `policy.mjb` beside it is the MuJoCo model the
policy was trained on, for sim-to-sim (ksim.sim2sim).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import mujoco
import numpy as np

from ksim.checkpoint import MEMORYLESS
from ksim.config import ConfigError
from ksim.deploy.robot_side import RobotSide
from ksim.policy_spec import (
    INPUT_NAME,
    OUTPUT_NAME,
    SPEC_FORMAT,
    PolicyInput,
    PolicySpec,
    load_policy_spec,
    memory_inputs,
)

__all__ = ["SPEC_FORMAT", "PolicyInput", "PolicySpec", "export_policy", "load_policy_spec", "policy_spec"]

# (a batch of raw observations, *memory) -> (a batch of actions, *next memory), memory as in `memory_inputs`
Policy = Callable[..., tuple[jax.Array, ...]]


def policy_spec(metadata: dict[str, Any], action_meaning: str, onnx_file: str, checkpoint: str = "") -> PolicySpec:
    """The JSON description of an exported policy, from its checkpoint metadata (task, observations, actions)."""
    actions = metadata["actions"]
    memory = metadata.get("policy_memory", MEMORYLESS)
    observation_size = sum(size for _, size in metadata["observations"])
    return PolicySpec(
        task=metadata["task"],
        onnx_file=onnx_file,
        inputs=[PolicyInput(name, size) for name, size in metadata["observations"]],
        actuators=list(actions["names"]),
        actuator_type=actions["type"],
        action_meaning=action_meaning,
        action_scale=actions["scale"],
        ctrl_dt=metadata["ctrl_dt"],
        versions=metadata["versions"],
        checkpoint=checkpoint,
        recurrent_size=memory["recurrent_size"],
        observation_history=memory["observation_history"],
        memory=memory_inputs(memory, observation_size),
    )


def with_robot_side(spec: PolicySpec, robot: RobotSide, model_file: str, task: dict[str, str]) -> PolicySpec:
    """`spec` with how a robot computes each input, what its actuators take, the command and the model file."""
    layout = [(item.name, item.size) for item in spec.inputs]
    described = [(item.name, item.size) for item in robot.inputs]
    if described != layout:
        raise ConfigError(f"the task's observations {described} are not the checkpoint's {layout}")
    return replace(
        spec,
        inputs=list(robot.inputs),
        joints=list(robot.joints),
        feet=list(robot.feet),
        actuation=robot.actuation,
        command=robot.command,
        model_file=model_file,
        episode_steps=robot.episode_steps,
        base_body=robot.base_body,
        start_qpos=list(robot.start_qpos),
        foot_geoms=[list(geoms) for geoms in robot.foot_geoms],
        task_class=task.get("task_class", ""),
        config_class=task.get("config_class", ""),
        task_config=task.get("task_config", ""),
    )


def to_onnx_model(policy: Policy, spec: PolicySpec) -> Any:
    """Converts `policy` to an ONNX ModelProto with jax2onnx (a dynamic batch dimension)."""
    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ConfigError("mode='export' needs jax2onnx and onnx: pip install 'ksim[export]'") from None
    shapes = [("batch", spec.observation_size), *(("batch", *item.shape) for item in spec.memory)]
    return to_onnx(
        policy,
        shapes,
        model_name="ksim_policy",
        input_names=[INPUT_NAME, *(item.input_name for item in spec.memory)],
        output_names=[OUTPUT_NAME, *(item.output_name for item in spec.memory)],
    )


def export_policy(
    policy: Policy,
    metadata: dict[str, Any],
    action_meaning: str,
    path: str | Path,
    checkpoint: str = "",
    robot: RobotSide | None = None,
    task: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    """Writes `policy` to `path` (.onnx) and its description to the JSON beside it (same name, .json); with
    `robot` (the task's robot-side description), also the model it was trained on (same name, .mjb) and a motion
    command's frames (same name, .motion.npz: the runtime plays them); `task`:
    its task_class, config_class and task_config (YAML), for sim-to-sim.

    `metadata` is what a checkpoint says about its writer (its task, observation layout, actions and the
    policy's memory); returns the ONNX and JSON paths.
    """
    onnx_path = Path(path)
    json_path, model_path = onnx_path.with_suffix(".json"), onnx_path.with_suffix(".mjb")
    motion_path = onnx_path.with_suffix(".motion.npz")
    spec = policy_spec(metadata, action_meaning, onnx_path.name, checkpoint)
    if robot is not None:
        spec = with_robot_side(spec, robot, model_path.name, task or {})
        if robot.motion is not None and spec.command is not None:
            spec = replace(spec, command={**spec.command, "file": motion_path.name})
    model = to_onnx_model(policy, spec)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    onnx_path.write_bytes(model.SerializeToString())
    if robot is not None:
        mujoco.mj_saveModel(robot.mj_model, str(model_path), None)
        if robot.motion is not None:
            np.savez(motion_path, **robot.motion)  # type: ignore[arg-type]  # mypy matches them to allow_pickle
    json_path.write_text(spec.to_json() + "\n")
    return onnx_path, json_path
