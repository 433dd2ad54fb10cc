"""A shard's envs with automatic resets: each env keeps the start of its next episode ready (the pool),
and an env whose episode ended starts it at its next control step.

The pool is refilled only at a control step where some env starts while its start is already used (a real
branch, so most control steps skip reset physics); a refill computes only the starts that were used. Episode
k of env i starts from `fold_in(key_i, k)`, so its start depends on its own global key only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ksim.task.env import Environment
from ksim.task.terrain_use import TerrainUse
from ksim.task.types import EnvState, Episode, Trajectory, Transition

Array = jax.Array
Metrics = dict[str, Array]


def select_envs(mask: Array, if_true: Any, if_false: Any) -> Any:
    """Per env (leading axis), the leaves of `if_true` where `mask` holds, else those of `if_false`."""

    def pick(a: Array, b: Array) -> Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)

    return jax.tree.map(pick, if_true, if_false)


def reduce_rollout_metrics(
    metrics: Metrics, cross_device_mean: Callable[[Any], Any], cross_device_sum: Callable[[Any], Any]
) -> Metrics:
    """Episode counts and sums add up over shards; per-step reward means average."""
    averaged = ("reward/", "terrain/")
    sums = {k: v for k, v in metrics.items() if not k.startswith(averaged)}
    means = {k: v for k, v in metrics.items() if k.startswith(averaged)}
    return cross_device_sum(sums) | cross_device_mean(means)


@dataclass(frozen=True)
class EnvPool:
    """Steps a shard of envs (leading env axis) of `environment`, on the tiles `terrain` gives them."""

    environment: Environment
    terrain: TerrainUse

    def reset(self, env_keys: Array, env_offset: Array) -> EnvState:
        """Envs with no episode yet (zeros of an episode's shape): their first control step starts one.
        `env_offset`: the global index of the shard's first env."""
        num_envs = env_keys.shape[0]
        no_episode = jax.tree.map(
            lambda leaf: jnp.zeros((num_envs, *leaf.shape), leaf.dtype), self.environment.episode_shape
        )
        return EnvState(
            current=no_episode,
            ended=jnp.ones(num_envs, bool),
            next_start=no_episode,
            next_start_ready=jnp.zeros(num_envs, bool),
            episodes_started=jnp.zeros(num_envs, jnp.int32),
            reset_key=env_keys,
            terrain=self.terrain.first_cells(env_keys, env_offset),
            start_failures=jnp.zeros((num_envs, self.start_bins)),
        )

    @property
    def start_bins(self) -> int:
        command = self.environment.components.command
        return 0 if command is None else command.start_bins

    def refill_next_starts(self, env: EnvState) -> EnvState:
        """Computes the next episode start of every env whose start was used, a chunk of envs at a time (the
        engine's `refill_fraction` of them).

        Only envs that need a start are reset (gathered by index), so with MJX the reset work is about one per
        ended episode, not one per env.
        """
        num_envs = env.next_start_ready.shape[0]
        chunk = max(1, int(num_envs * self.environment.engine.refill_fraction))  # MJX: num_envs // 8

        def refill_chunk(env: EnvState) -> EnvState:
            (index,) = jnp.nonzero(~env.next_start_ready, size=chunk, fill_value=num_envs)  # num_envs: no env
            safe = jnp.minimum(index, num_envs - 1)
            keys = jax.vmap(jax.random.fold_in)(env.reset_key[safe], env.episodes_started[safe])
            cells = jax.tree.map(lambda cells: cells[safe], env.terrain)
            failures = jnp.sum(env.start_failures, axis=0)  # the shard's: one env fails too rarely to tell
            fresh = jax.vmap(self.environment.start_episode, in_axes=(0, 0, None, None))(keys, cells, None, failures)
            next_start = jax.tree.map(lambda pool, new: pool.at[index].set(new, mode="drop"), env.next_start, fresh)
            ready = env.next_start_ready.at[index].set(True, mode="drop")
            return env.replace(next_start=next_start, next_start_ready=ready)

        return jax.lax.while_loop(lambda env: jnp.any(~env.next_start_ready), refill_chunk, env)

    def refill_if(self, needed: Array, env: EnvState) -> EnvState:
        """Refills only when some env needs it: a real branch, so most control steps skip reset physics."""
        return jax.lax.cond(jnp.any(needed), self.refill_next_starts, lambda env: env, env)

    def step(self, shared: Any, env: EnvState) -> tuple[EnvState, Transition]:
        """One control step of every env; an env whose episode ended at the last step first starts its next."""
        starting = env.ended
        env = self.refill_if(starting & ~env.next_start_ready, env)
        current = select_envs(starting, env.next_start, env.current)
        stepped, transition = jax.vmap(self.environment.step_env, in_axes=(None, 0))(shared, current)
        ended = transition.trajectory.terminated | transition.trajectory.truncated
        env = env.replace(
            episodes_started=env.episodes_started + starting,
            start_failures=self.record_failures(env.start_failures, stepped, transition.trajectory.terminated),
        )
        cells = self.terrain.next_cells(env.terrain, env.reset_key, env.episodes_started, stepped, ended)
        moved = cells.level != env.terrain.level  # a start computed ahead for the old tile is computed again
        env = env.replace(
            current=stepped,
            ended=ended,
            next_start_ready=env.next_start_ready & ~starting & ~moved,
            terrain=cells,
        )
        return env, transition

    def record_failures(self, failures: Array, stepped: Episode, terminated: Array) -> Array:
        command = self.environment.components.command
        if command is None or command.start_bins == 0:
            return failures
        record = functools.partial(command.record_failures, ctrl_dt=self.environment.settings.ctrl_dt)
        return jax.vmap(record)(failures, stepped.command_state, terminated)

    def rollout(self, shared: Any, env: EnvState, length: int) -> tuple[EnvState, Trajectory, Metrics]:
        """`length` control steps of every env (episodes carry over into the next rollout), the time-major
        trajectory and this shard's episode and reward metrics (`reduce_rollout_metrics` adds up shards)."""
        env, transitions = jax.lax.scan(lambda env, _: self.step(shared, env), env, None, length=length)
        trajectory = transitions.trajectory
        done = trajectory.terminated | trajectory.truncated
        metrics = {
            "episodes_finished": jnp.sum(done, dtype=jnp.float32),
            "episode_return_sum": jnp.sum(jnp.where(done, transitions.episode_return, 0.0)),
            "episode_length_sum": jnp.sum(jnp.where(done, transitions.episode_length, 0), dtype=jnp.float32),
            "terminations": jnp.sum(trajectory.terminated, dtype=jnp.float32),
        }
        metrics |= {f"reward/{name}": jnp.mean(term) for name, term in transitions.reward_terms.items()}
        if self.terrain.terrain is not None:
            metrics["terrain/mean_level"] = jnp.mean(env.terrain.level.astype(jnp.float32))
        metrics["reward/total"] = jnp.mean(trajectory.reward)
        return env, trajectory, metrics
