"""Evaluation: deterministic episodes from fresh envs, stopping as soon as every episode has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from ksim.task.rl import RLTask, SharedState

Array = jax.Array


def make_eval_program(task: RLTask[Any]) -> Callable[[SharedState, Array], tuple[Array, Array, Array, Array]]:
    """A jitted program: (shared, env_keys) -> (returns, lengths, env 0's qpos per step, steps run).

    Each env plays its first episode with the mean action; a `while_loop` ends when all have ended
    (or at the episode limit), so a policy that fails fast is evaluated fast.
    """
    max_steps = task.max_episode_steps
    step_all = jax.vmap(lambda shared, episode: task.step_env(shared, episode, deterministic=True), in_axes=(None, 0))

    def run_episodes(shared: SharedState, env_keys: Array) -> tuple[Array, Array, Array, Array]:
        num_envs = env_keys.shape[0]
        episode = jax.vmap(task.start_episode)(env_keys)
        qpos_log = jnp.zeros((max_steps, episode.data.qpos.shape[-1]))

        def running_any(carry: tuple[Any, ...]) -> Array:
            t, _, _, _, running, _ = carry
            return (t < max_steps) & jnp.any(running)

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            t, episode, returns, lengths, running, qpos_log = carry
            qpos_log = qpos_log.at[t].set(episode.data.qpos[0])
            episode, transition = step_all(shared, episode)
            trajectory = transition.trajectory
            returns = returns + jnp.where(running, trajectory.reward, 0.0)
            lengths = lengths + running
            running = running & ~(trajectory.terminated | trajectory.truncated)
            return t + 1, episode, returns, lengths, running, qpos_log

        init: tuple[Any, ...] = (
            jnp.zeros((), jnp.int32),
            episode,
            jnp.zeros(num_envs),
            jnp.zeros(num_envs, jnp.int32),
            jnp.ones(num_envs, bool),
            qpos_log,
        )
        steps, _, returns, lengths, _, qpos_log = jax.lax.while_loop(running_any, body, init)
        return returns, lengths, qpos_log, steps

    return jax.jit(run_episodes)


def first_episode(qpos_log: Any, lengths: Any) -> Any:
    """Env 0's recorded poses, cut at the end of its episode."""
    return qpos_log[: int(lengths[0])]
