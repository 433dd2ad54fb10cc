"""Evaluation: deterministic episodes from fresh envs, stopping as soon as every episode has ended."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from ksim.engine import PhysicsEngine
    from ksim.task.rl import Program, RLConfig, RLTask, SharedState, TrainState

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


class EvaluationMixin:
    """Evaluation of an `RLTask` during training and in `mode=eval` (the task provides what is declared below)."""

    if TYPE_CHECKING:
        config: RLConfig
        engine: PhysicsEngine

        @property
        def task_name(self) -> str: ...
        def program(self, name: str, fallback: Program) -> Program: ...
        def fetch_replicated(self, tree: Any) -> Any: ...
        def load_contents(self, path: str) -> dict[str, Any]: ...

    @functools.cached_property
    def _eval_program(self) -> Program:
        return make_eval_program(cast("RLTask[Any]", self))

    def eval_inputs(self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None) -> tuple:
        """(shared state on this process's first device, env keys) for the evaluation program; `shared` is a host
        copy (unreplicated)."""
        num_episodes = self.config.eval_episodes if num_episodes is None else num_episodes
        seed = self.config.seed if seed is None else seed
        keys = jax.random.split(jax.random.PRNGKey(seed), num_episodes)
        return jax.device_put(shared, jax.local_devices()[0]), keys

    def evaluate(
        self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Deterministic episodes from fresh envs: returns, lengths, and env 0's qpos per control step."""
        inputs = self.eval_inputs(shared, num_episodes, seed)
        precompiled_shape = num_episodes in (None, self.config.eval_episodes)
        program = self.program("eval", self._eval_program) if precompiled_shape else self._eval_program
        returns, lengths, qpos, _ = jax.device_get(program(*inputs))
        return returns, lengths, first_episode(qpos, lengths)

    def eval_due(self, step: int) -> bool:
        every = self.config.eval_every_n_steps
        return every > 0 and (step % every == 0 or step == self.config.num_steps)

    def eval_scalars(self, state: TrainState) -> dict[str, float]:
        returns, lengths, _ = self.evaluate(self.fetch_replicated(state.shared))
        return {"eval/return": float(np.mean(returns)), "eval/length": float(np.mean(lengths))}

    def run_eval(self) -> np.ndarray:
        contents = self.load_contents(self.config.load_from_ckpt_path)
        returns, _, qpos = self.evaluate(contents["shared"], self.config.eval_episodes, self.config.seed)
        print(
            f"{self.task_name}: {len(returns)} episodes, mean return {returns.mean():.4g} "
            f"(std {returns.std():.3g}, min {returns.min():.4g}, max {returns.max():.4g})",
            flush=True,
        )
        if self.config.video_path:
            from ksim.render import write_video

            size = (self.config.video_width, self.config.video_height)
            path = write_video(self.engine.mj_model, qpos, self.config.ctrl_dt, self.config.video_path, size)
            print(f"wrote {path}", flush=True)
        return returns
