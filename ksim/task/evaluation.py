"""Evaluation: deterministic episodes from fresh envs, stopping as soon as every episode has ended.

Besides return and length, each episode yields what locomotion is judged by: the base's mean world-x
velocity, whether a termination (not the time limit) ended it, and with a velocity command the mean
distance between the heading-frame base velocity and the commanded (forward, lateral) velocity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ksim.commands import VelocityCommand
from ksim.rewards import heading_velocity

if TYPE_CHECKING:
    from ksim.engine import PhysicsEngine, StepContext
    from ksim.task.env import Episode
    from ksim.task.rl import Program, RLConfig, RLTask, SharedState, TrainState

Array = jax.Array


class EpisodeStats(struct.PyTreeNode):
    """Per evaluated episode (leading episode axis): sums over its steps and how it ended."""

    returns: Array
    lengths: Array
    speed_x_sum: Array  # base world-x velocity summed over the episode's control steps
    command_error_sum: Array  # |heading-frame velocity xy - command xy| summed over the steps (0: no command)
    terminated: Array  # ended by a termination rather than by the time limit


class EvalResult(NamedTuple):
    """One evaluation's episodes (host arrays) and env 0's poses, one per control step of its episode."""

    returns: np.ndarray
    lengths: np.ndarray
    speed_x: np.ndarray  # each episode's mean base world-x velocity, m/s
    fell: np.ndarray  # each episode ended by a termination
    command_error: np.ndarray | None  # each episode's mean velocity-tracking error, m/s; None without a command
    qpos: np.ndarray


def tracks_velocity(task: RLTask[Any]) -> bool:
    return isinstance(task.command, VelocityCommand)


def step_measures(task: RLTask[Any], ctx: StepContext) -> tuple[Array, Array]:
    """(base world-x velocity, velocity-command tracking error) after one control step of one env."""
    speed_x = ctx.base_lin_vel_world[0]
    if not tracks_velocity(task):
        return speed_x, jnp.zeros(())
    return speed_x, jnp.linalg.norm(heading_velocity(ctx)[:2] - ctx.command[:2])


def make_eval_program(task: RLTask[Any]) -> Callable[[SharedState, Array], tuple[EpisodeStats, Array, Array]]:
    """A jitted program: (shared, env_keys) -> (per-episode stats, env 0's qpos per step, steps run).

    Each env plays its first episode with the mean action; a `while_loop` ends when all have ended
    (or at the episode limit), so a policy that fails fast is evaluated fast.
    """
    max_steps = task.max_episode_steps

    def step_one(shared: SharedState, episode: Episode) -> tuple[Episode, Array, Array, Array, Array, Array]:
        stepped, transition = task.step_env(shared, episode, deterministic=True)
        ctx = task.engine.context(
            stepped.data, episode.data, stepped.last_action, episode.last_action, stepped.data.ctrl, episode.command
        )
        speed_x, command_error = step_measures(task, ctx)
        trajectory = transition.trajectory
        return stepped, trajectory.reward, trajectory.terminated, trajectory.truncated, speed_x, command_error

    step_all = jax.vmap(step_one, in_axes=(None, 0))

    def run_episodes(shared: SharedState, env_keys: Array) -> tuple[EpisodeStats, Array, Array]:
        num_envs = env_keys.shape[0]
        episode = jax.vmap(task.start_episode)(env_keys)
        qpos_log = jnp.zeros((max_steps, episode.data.qpos.shape[-1]))

        def running_any(carry: tuple[Any, ...]) -> Array:
            t, _, _, running, _ = carry
            return (t < max_steps) & jnp.any(running)

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            t, episode, stats, running, qpos_log = carry
            qpos_log = qpos_log.at[t].set(episode.data.qpos[0])
            episode, reward, terminated, truncated, speed_x, command_error = step_all(shared, episode)
            stats = EpisodeStats(
                returns=stats.returns + jnp.where(running, reward, 0.0),
                lengths=stats.lengths + running,
                speed_x_sum=stats.speed_x_sum + jnp.where(running, speed_x, 0.0),
                command_error_sum=stats.command_error_sum + jnp.where(running, command_error, 0.0),
                terminated=stats.terminated | (running & terminated),
            )
            running = running & ~(terminated | truncated)
            return t + 1, episode, stats, running, qpos_log

        zeros = jnp.zeros(num_envs)
        stats = EpisodeStats(zeros, jnp.zeros(num_envs, jnp.int32), zeros, zeros, jnp.zeros(num_envs, bool))
        init = (jnp.zeros((), jnp.int32), episode, stats, jnp.ones(num_envs, bool), qpos_log)
        steps, _, stats, _, qpos_log = jax.lax.while_loop(running_any, body, init)
        return stats, qpos_log, steps

    return jax.jit(run_episodes)


def first_episode(qpos_log: Any, lengths: Any) -> Any:
    """Env 0's recorded poses, cut at the end of its episode."""
    return qpos_log[: int(lengths[0])]


def summary_scalars(result: EvalResult) -> dict[str, float]:
    """Means over the episodes: return, length, base world-x speed, fall rate (and command error)."""
    scalars = {
        "eval/return": float(np.mean(result.returns)),
        "eval/length": float(np.mean(result.lengths)),
        "eval/base_speed_x": float(np.mean(result.speed_x)),
        "eval/fall_rate": float(np.mean(result.fell)),
    }
    if result.command_error is not None:
        scalars["eval/command_error"] = float(np.mean(result.command_error))
    return scalars


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

    def evaluation(self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None) -> EvalResult:
        """Deterministic episodes from fresh envs, with their locomotion measures."""
        inputs = self.eval_inputs(shared, num_episodes, seed)
        precompiled_shape = num_episodes in (None, self.config.eval_episodes)
        program = self.program("eval", self._eval_program) if precompiled_shape else self._eval_program
        stats, qpos, _ = jax.device_get(program(*inputs))
        steps = np.maximum(stats.lengths, 1)
        error = stats.command_error_sum / steps if tracks_velocity(cast("RLTask[Any]", self)) else None
        return EvalResult(
            stats.returns,
            stats.lengths,
            stats.speed_x_sum / steps,
            stats.terminated,
            error,
            first_episode(qpos, stats.lengths),
        )

    def evaluate(
        self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Deterministic episodes from fresh envs: returns, lengths, and env 0's qpos per control step."""
        result = self.evaluation(shared, num_episodes, seed)
        return result.returns, result.lengths, result.qpos

    def eval_due(self, step: int) -> bool:
        every = self.config.eval_every_n_steps
        return every > 0 and (step % every == 0 or step == self.config.num_steps)

    def eval_scalars(self, state: TrainState) -> dict[str, float]:
        return summary_scalars(self.evaluation(self.fetch_replicated(state.shared)))

    def run_eval(self) -> np.ndarray:
        contents = self.load_contents(self.config.load_from_ckpt_path)
        result = self.evaluation(contents["shared"], self.config.eval_episodes, self.config.seed)
        returns, scalars = result.returns, summary_scalars(result)
        measures = ", ".join(f"{key.removeprefix('eval/')} {scalars[key]:.3g}" for key in list(scalars)[2:])
        print(
            f"{self.task_name}: {len(returns)} episodes, mean return {returns.mean():.4g} "
            f"(std {returns.std():.3g}, min {returns.min():.4g}, max {returns.max():.4g}), {measures}",
            flush=True,
        )
        if self.config.video_path:
            from ksim.render import write_video

            size = (self.config.video_width, self.config.video_height)
            path = write_video(self.engine.mj_model, result.qpos, self.config.ctrl_dt, self.config.video_path, size)
            print(f"wrote {path}", flush=True)
        return returns
