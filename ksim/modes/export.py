"""mode=export: a checkpoint's deterministic policy as ONNX, with the JSON that says what it reads and drives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ksim.config import ConfigError
from ksim.export import export_policy
from ksim.task.rl import RLTask
from ksim.task.types import PolicyState, RLConfig, SharedState

Array = jax.Array


def check(config: RLConfig) -> None:
    if not config.load_from_ckpt_path:
        raise ConfigError("mode='export' needs load_from_ckpt_path=<checkpoint file>")
    if not config.export_path:
        raise ConfigError("mode='export' needs export_path=<file>.onnx")


def deterministic_step(task: RLTask[Any], shared: SharedState) -> Callable[..., tuple[Array, ...]]:
    """The exported policy: (observations, *memory) -> (actions, *next memory), a batch of robots.

    The memory inputs are the actor's GRU state (recurrent_size > 0) and the past observation frames
    (observation_history > 1); the ONNX file takes and returns them in that order (ksim.export).
    """
    memory = task.memory_settings()
    recurrent, history = memory["recurrent_size"] > 0, memory["observation_history"] > 1
    observation_dim, critic_dim = task.environment.observation_dim, task.environment.critic_observation_dim
    key = jax.random.PRNGKey(0)  # unused by the deterministic policy

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


def run(task: RLTask[Any]) -> Path:
    """Writes the checkpoint's deterministic policy to export_path (ONNX) and a JSON beside it."""
    checkpoint = task.config.load_from_ckpt_path
    shared = jax.device_get(task.checkpoints.load(checkpoint)["shared"])
    doc = (type(task.actuators).__doc__ or "").strip().splitlines()
    onnx_path, json_path = export_policy(
        deterministic_step(task, shared),
        task.checkpoints.metadata,
        doc[0] if doc else "",
        task.config.export_path,
        checkpoint,
    )
    print(f"wrote {onnx_path} and {json_path}", flush=True)
    return onnx_path
