"""Evaluation: deterministic episodes from fresh envs, stopping as soon as every episode has ended.

Besides return and length, each episode yields what locomotion is judged by: the base's mean world-x
velocity, whether a termination (not the time limit) ended it, and with a velocity command the mean
distance between the heading-frame base velocity and the commanded (forward, lateral) velocity, the mean
|yaw rate - commanded yaw rate|, and over the steps whose command is zero (stand still) how fast the base
drifts: its net horizontal displacement per second (swaying in place is not drift). Each episode also says which
of the task's terminations ended it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ksim.commands import Command, VelocityCommand
from ksim.engine import StepContext
from ksim.reporting import clip_success_rates
from ksim.rewards import linear_velocity_error, yaw_rate_error
from ksim.task.env import Environment, termination_flags
from ksim.task.types import Episode, Trajectory
from ksim.terrain import TerrainCells
from ksim.tracking import MotionCommand

# below one episode of a clip up to a million episodes: all clips' success only orders equal weakest clips
CLIP_TIE_BREAK = 1e-6

Array = jax.Array
# (shared, env keys, terrain levels) -> stats, qpos, steps
EvalProgram = Callable[[Any, Array, Array], tuple["EpisodeStats", Array, Array]]


class EpisodeStats(struct.PyTreeNode):
    """Per evaluated episode (leading episode axis): sums over its steps and how it ended."""

    returns: Array
    lengths: Array
    speed_x_sum: Array  # base world-x velocity summed over the episode's control steps
    command_error_sum: Array  # |heading-frame velocity xy - command xy| summed over the steps (0: no command)
    terminated: Array  # ended by a termination rather than by the time limit
    yaw_rate_error_sum: Array  # |world yaw rate - command yaw rate| summed over the steps (0: no command)
    standing_steps: Array  # steps whose command was zero
    drift_sum: Array  # (2,) per env: the base's horizontal velocity summed over those steps
    command_measure_sums: dict[str, Array]  # the command's own measures (a motion's errors) summed over the steps
    start_state: Array  # the command's state at the episode's start (a motion's first frame)
    ended_by: Array  # (T,) per env: which of the task's terminations ended the episode (none: it ran out)


class EvalResult(NamedTuple):
    """One evaluation's episodes (host arrays) and env 0's poses, one per control step of its episode."""

    returns: np.ndarray
    lengths: np.ndarray
    speed_x: np.ndarray  # each episode's mean base world-x velocity, m/s
    fell: np.ndarray  # each episode ended by a termination
    command_error: np.ndarray | None  # each episode's mean velocity-tracking error, m/s; None without a command
    qpos: np.ndarray  # env 0's pose per control step (then, with a motion, the reference's: see `poses`)
    terrain_level: int | None = None  # the terrain level the episodes ran on; None without a terrain
    yaw_rate_error: np.ndarray | None = None  # each episode's mean |yaw rate - command|, rad/s; None without one
    drift: np.ndarray | None = None  # each episode's drift speed under a zero command (nan: none), m/s
    command_measures: dict[str, np.ndarray] | None = None  # each episode's mean of the command's own measures
    clip: np.ndarray | None = None  # a motion's clip that each episode played; None without a motion
    clip_names: tuple[str, ...] = ()
    ended_by: dict[str, np.ndarray] | None = None  # per termination: whether it ended each episode

    def poses(self, nq: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Env 0's recorded poses and, where its command had one, the reference's at each step."""
        if self.qpos.shape[-1] == 2 * nq:
            return self.qpos[:, :nq], self.qpos[:, nq:]
        return self.qpos, None


class StepMeasures(NamedTuple):
    """What one control step of one env tells about locomotion (zeros where there is no velocity command)."""

    speed_x: Array  # base world-x velocity
    command_error: Array  # |heading-frame velocity xy - command xy|
    yaw_rate_error: Array  # |world yaw rate - command yaw rate|
    standing: Array  # the command is zero
    drift: Array  # (2,): the base's horizontal velocity where the command is zero, else 0
    command: dict[str, Array]  # the command's own measures (`measures(ctx)`: a motion's tracking errors)


def tracks_velocity(command: Command | None) -> bool:
    return isinstance(command, VelocityCommand)


def step_measures(command: Command | None, ctx: StepContext) -> StepMeasures:
    """The locomotion measures after one control step of one env."""
    speed_x, zero = ctx.base_lin_vel_world[0], jnp.zeros(())
    own = command_measures(command, ctx)
    if not tracks_velocity(command):
        return StepMeasures(speed_x, zero, zero, jnp.zeros((), bool), jnp.zeros(2), own)
    standing = jnp.all(ctx.command == 0)
    return StepMeasures(
        speed_x,
        linear_velocity_error(ctx),
        yaw_rate_error(ctx),
        standing,
        jnp.where(standing, ctx.base_lin_vel_world[:2], 0.0),
        own,
    )


def command_measures(command: Command | None, ctx: StepContext) -> dict[str, Array]:
    """What the command itself says about a control step (a motion: its tracking errors); empty for others."""
    return {} if command is None else command.measures(ctx)


def deterministic_step(
    environment: Environment, shared: Any, episode: Episode
) -> tuple[Episode, Trajectory, StepContext]:
    """One env's step with the mean action: the stepped episode, its trajectory and the context that judges it."""
    stepped, transition = environment.step_env(shared, episode, deterministic=True)
    ctx = environment.engine.context(
        stepped.data, episode.data, stepped.last_action, episode.last_action, stepped.data.ctrl, episode.command
    )
    return stepped, transition.trajectory, ctx


def make_eval_program(environment: Environment, terrain_column: int | None = None) -> EvalProgram:
    """A jitted program: (shared, env_keys, levels) -> (per-episode stats, env 0's qpos per step, steps run).

    Each env plays its first episode with the mean action (with a terrain, episode i on the tile of its level
    and of column `terrain_column`, or i modulo the number of columns); a `while_loop` ends when all have ended
    (or at the episode limit), so a policy that fails fast is evaluated fast.
    """
    max_steps = environment.settings.max_episode_steps
    command = environment.components.command

    def step_one(shared: Any, episode: Episode) -> tuple[Episode, Array, Array, Array, StepMeasures, Array]:
        stepped, trajectory, ctx = deterministic_step(environment, shared, episode)
        flags = termination_flags(environment.components, ctx, episode.component_state)
        measures = step_measures(command, ctx)
        return stepped, trajectory.reward, trajectory.terminated, trajectory.truncated, measures, flags

    step_all = jax.vmap(step_one, in_axes=(None, 0))

    def reference_of(episode: Episode) -> Array:
        """Env 0's reference pose (the command's; empty without one), logged after its own pose for videos."""
        reference = None if command is None else command.reference_qpos(episode.command_state[0])
        return jnp.zeros(0) if reference is None else reference

    def run_episodes(shared: Any, env_keys: Array, levels: Array) -> tuple[EpisodeStats, Array, Array]:
        num_envs = env_keys.shape[0]
        start = functools.partial(environment.start_episode, from_beginning=True)
        if environment.terrain is None:
            episode = jax.vmap(start)(env_keys)
        else:
            columns = jnp.arange(num_envs, dtype=jnp.int32) % len(environment.terrain.grid.types)
            if terrain_column is not None:
                columns = jnp.full(num_envs, terrain_column, jnp.int32)
            episode = jax.vmap(start)(env_keys, TerrainCells(level=levels, column=columns))
        qpos_log = jnp.zeros((max_steps, episode.data.qpos.shape[-1] + reference_of(episode).shape[0]))

        def running_any(carry: tuple[Any, ...]) -> Array:
            t, _, _, running, _ = carry
            return (t < max_steps) & jnp.any(running)

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            t, episode, stats, running, qpos_log = carry
            qpos_log = qpos_log.at[t].set(jnp.concatenate([episode.data.qpos[0], reference_of(episode)]))
            episode, reward, terminated, truncated, measures, flags = step_all(shared, episode)
            stats = EpisodeStats(
                returns=stats.returns + jnp.where(running, reward, 0.0),
                lengths=stats.lengths + running,
                speed_x_sum=stats.speed_x_sum + jnp.where(running, measures.speed_x, 0.0),
                command_error_sum=stats.command_error_sum + jnp.where(running, measures.command_error, 0.0),
                terminated=stats.terminated | (running & terminated),
                yaw_rate_error_sum=stats.yaw_rate_error_sum + jnp.where(running, measures.yaw_rate_error, 0.0),
                standing_steps=stats.standing_steps + (running & measures.standing),
                drift_sum=stats.drift_sum + jnp.where(running[:, None], measures.drift, 0.0),
                command_measure_sums={
                    name: total + jnp.where(running, measures.command[name], 0.0)
                    for name, total in stats.command_measure_sums.items()
                },
                start_state=stats.start_state,
                ended_by=stats.ended_by | ((running & terminated)[:, None] & flags),
            )
            running = running & ~(terminated | truncated)
            return t + 1, episode, stats, running, qpos_log

        zeros = jnp.zeros(num_envs)
        counts = jnp.zeros(num_envs, jnp.int32)
        names = jax.eval_shape(lambda episode: step_all(shared, episode)[4].command, episode)
        stats = EpisodeStats(
            zeros,
            counts,
            zeros,
            zeros,
            jnp.zeros(num_envs, bool),
            zeros,
            counts,
            jnp.zeros((num_envs, 2)),
            {name: zeros for name in names},
            episode.command_state,
            jnp.zeros((num_envs, len(environment.components.terminations)), bool),
        )
        init = (jnp.zeros((), jnp.int32), episode, stats, jnp.ones(num_envs, bool), qpos_log)
        steps, _, stats, _, qpos_log = jax.lax.while_loop(running_any, body, init)
        return stats, qpos_log, steps

    return jax.jit(run_episodes)


def first_episode(qpos_log: Any, lengths: Any) -> Any:
    """Env 0's recorded poses, cut at the end of its episode."""
    return qpos_log[: int(lengths[0])]


def summary_scalars(result: EvalResult) -> dict[str, float]:
    """Means over the episodes: return, length, base world-x speed, fall rate (with a velocity command: its xy
    and yaw-rate errors, and the drift over the episodes that had a zero command), the share of episodes each
    termination ended (`ended_by/NAME`; two may end the same one)."""
    scalars = {
        "eval/return": float(np.mean(result.returns)),
        "eval/length": float(np.mean(result.lengths)),
        "eval/base_speed_x": float(np.mean(result.speed_x)),
        "eval/fall_rate": float(np.mean(result.fell)),
    }
    if result.command_error is not None:
        scalars["eval/command_error"] = float(np.mean(result.command_error))
    if result.yaw_rate_error is not None:
        scalars["eval/yaw_rate_error"] = float(np.mean(result.yaw_rate_error))
    if result.drift is not None and np.any(np.isfinite(result.drift)):
        scalars["eval/drift"] = float(np.nanmean(result.drift))
    if result.terrain_level is not None:
        scalars["eval/terrain_level"] = float(result.terrain_level)
    for name, values in (result.command_measures or {}).items():
        scalars[f"eval/{name}"] = float(np.mean(values))
    if result.clip is not None:
        scalars["eval/success_rate"] = 1.0 - scalars["eval/fall_rate"]
    for name, ended in (result.ended_by or {}).items():
        scalars[f"eval/ended_by/{name}"] = float(np.mean(ended))
    if len(result.clip_names) > 1:
        scalars |= per_clip_scalars(result)
    return scalars


def default_evaluation_score(scalars: dict[str, float]) -> float:
    """`RLTask.evaluation_score`'s default: a motion's success rate (over several clips, its weakest clip's, ties
    broken by all of them together), else the mean return."""
    if clip_rates := clip_success_rates(scalars):
        # a policy that fails one clip is not the one to deploy, however well it plays the others
        return min(clip_rates.values()) + CLIP_TIE_BREAK * scalars["eval/success_rate"]
    return scalars.get("eval/success_rate", scalars["eval/return"])


def per_clip_scalars(result: EvalResult) -> dict[str, float]:
    """A motion's evaluation per clip: how many episodes played it, their success rate (reaching the clip's end)
    and each measure's mean over them."""
    scalars: dict[str, float] = {}
    if result.clip is None:
        return scalars
    for index, clip in enumerate(result.clip_names):
        mine = result.clip == index
        if not np.any(mine):
            continue
        scalars[f"eval/{clip}/episodes"] = float(np.sum(mine))
        scalars[f"eval/{clip}/success_rate"] = float(1.0 - np.mean(result.fell[mine]))
        for name, values in (result.command_measures or {}).items():
            scalars[f"eval/{clip}/{name}"] = float(np.mean(values[mine]))
    return scalars


class Evaluator:
    """Evaluates a policy in an `Environment`: `num_episodes` deterministic episodes from fresh envs drawn from
    `seed`, on this process's first device (one jitted program, `program`)."""

    def __init__(
        self,
        environment: Environment,
        num_episodes: int,
        seed: int,
        terrain_level: int = 0,
        terrain_column: int | None = None,
    ) -> None:
        self.environment = environment
        self.num_episodes = num_episodes
        self.seed = seed
        self.terrain_level = terrain_level
        self.terrain_column = terrain_column

    @functools.cached_property
    def program(self) -> EvalProgram:
        return make_eval_program(self.environment, self.terrain_column)

    def inputs(
        self, shared: Any, num_episodes: int | None = None, seed: int | None = None, level: int | None = None
    ) -> tuple[Any, Array, Array]:
        """(shared state on this process's first device, env keys, terrain levels) for the program; `shared` is a
        host copy; `level` defaults to `terrain_level` (unused without a terrain)."""
        num_episodes = self.num_episodes if num_episodes is None else num_episodes
        seed = self.seed if seed is None else seed
        keys = jax.random.split(jax.random.PRNGKey(seed), num_episodes)
        levels = jnp.full(num_episodes, self.terrain_level if level is None else level, jnp.int32)
        return jax.device_put(shared, jax.local_devices()[0]), keys, levels

    def run(
        self,
        shared: Any,
        num_episodes: int | None = None,
        seed: int | None = None,
        program: EvalProgram | None = None,
        level: int | None = None,
    ) -> EvalResult:
        """Deterministic episodes from fresh envs, with their locomotion measures (`program`: a compiled one)."""
        inputs = self.inputs(shared, num_episodes, seed, level)
        stats, qpos, _ = jax.device_get((program or self.program)(*inputs))
        steps = np.maximum(stats.lengths, 1)
        command = self.environment.components.command
        tracking = tracks_velocity(command)
        motion = command if isinstance(command, MotionCommand) else None
        return EvalResult(
            stats.returns,
            stats.lengths,
            stats.speed_x_sum / steps,
            stats.terminated,
            stats.command_error_sum / steps if tracking else None,
            first_episode(qpos, stats.lengths),
            int(inputs[2][0]) if self.environment.terrain is not None and len(inputs[2]) else None,
            stats.yaw_rate_error_sum / steps if tracking else None,
            mean_drift(stats.drift_sum, stats.standing_steps) if tracking else None,
            {name: total / steps for name, total in stats.command_measure_sums.items()} or None,
            None if motion is None else np.asarray(jax.vmap(motion.clip_of)(stats.start_state)),
            () if motion is None else motion.clip_names,
            dict(zip(self.environment.components.termination_names, stats.ended_by.T, strict=True)),
        )


def mean_drift(drift_sum: np.ndarray, standing_steps: np.ndarray) -> np.ndarray:
    """Per episode, the norm of the base's mean horizontal velocity over its zero-command steps (the distance it
    drifted per second told to stand; nan for an episode without such steps). `drift_sum` is (episodes, 2)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        speed = np.linalg.norm(drift_sum, axis=-1) / np.maximum(standing_steps, 1)
        return np.where(standing_steps > 0, speed, np.nan)


def eval_line(task_name: str, result: EvalResult) -> str:
    """What `mode=eval` prints: the episodes' return statistics and locomotion measures."""
    returns, scalars = result.returns, summary_scalars(result)
    measures = ", ".join(f"{key.removeprefix('eval/')} {scalars[key]:.3g}" for key in list(scalars)[2:])
    return (
        f"{task_name}: {len(returns)} episodes, mean return {returns.mean():.4g} "
        f"(std {returns.std():.3g}, min {returns.min():.4g}, max {returns.max():.4g}), {measures}"
    )
