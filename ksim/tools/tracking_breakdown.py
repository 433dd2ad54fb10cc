"""Where a velocity-command policy's tracking error comes from: transients, a steady bias, or oscillation.

    .venv/bin/python -m ksim.tools.tracking_breakdown examples.kbot:KBotTask RUN/checkpoints/ckpt_latest.bin
    .venv/bin/python -m ksim.tools.tracking_breakdown examples.kbot:KBotTask CKPT gait_period_s=0.6  # as trained
    .venv/bin/python -m ksim.tools.tracking_breakdown examples.kbot:KBotTask CKPT --nominal  # no randomization

`mode=eval`'s `eval/command_error` and `eval/yaw_rate_error` average the per-step error over whole episodes. This
plays the same deterministic episodes (the task's module's `DEFAULT_CONFIG` with the `key=value` settings the
run was trained with, commands drawn as in training),
records the heading-frame velocity, yaw rate and command at every control step, and splits the error:

- the error once `--settle-s` has passed since the command last changed (what is left when transients are out),
  and the part of the every-step error spent in those first seconds (and of it, at episode starts);
- with `--window-s`, the settled error of the velocity averaged over that window (a gait period takes the
  sway within a step out, leaving the velocity's slower wander about the command);
- per steady stretch of one command (at least `--settle-s` long after it settles): the bias, |mean velocity -
  command|, and the oscillation, the mean distance of the velocity from its own mean (a gait's sway and twist);
- the tracking gain per axis: the slope of the achieved mean against the commanded value over the stretches
  (1: it goes as fast as told; 0.8: it reaches 80% of every command);
- per band of forward command (`--forward-bands`, m/s; "stand" is the zero command): its share of the steps, its
  settled error and its part of the every-step error (the parts add up to it), which says where the error is;
- with `--nominal`, the same episodes without the task's randomizations and events (the robot as modelled,
  never pushed): what the policy's own gait leaves, against what randomization and pushes add.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from ksim.config import ConfigError, parse_overrides
from ksim.rewards import heading_velocity
from ksim.task.evaluation import deterministic_step, tracks_velocity
from ksim.task.reference import task_and_default_config

AXES = ("forward", "lateral", "yaw")


class Trace(NamedTuple):
    """Per control step (leading axis) and episode: achieved (forward, lateral, yaw rate), the command, and
    whether the episode was still running (its first step after an end and later ones are not)."""

    achieved: np.ndarray  # (steps, episodes, 3)
    command: np.ndarray  # (steps, episodes, 3)
    running: np.ndarray  # (steps, episodes)


class Breakdown(NamedTuple):
    command_error: float  # mean |velocity xy - command xy| over running steps, m/s
    yaw_rate_error: float  # mean |yaw rate - command|, rad/s
    settled_command_error: float  # the same over steps at least settle_s after a command change
    settled_yaw_rate_error: float
    transient_part: float  # the part of command_error from steps within settle_steps of a change, m/s
    start_part: float  # of transient_part, the steps after each episode's start
    window_error: float  # settled error of the velocity averaged over window_steps (NaN without a window), m/s
    stretches: int  # steady stretches of one command
    bias: float  # mean over stretches of |mean velocity xy - command xy|, m/s
    oscillation: float  # mean over stretches of the velocity's mean distance from its own mean, m/s
    yaw_bias: float
    yaw_oscillation: float
    gain: tuple[float, float, float]  # slope of achieved against commanded, per axis


def steps_since_change(command: np.ndarray) -> np.ndarray:
    """Per step and episode, the control steps since the command last changed (0 at the first step)."""
    changed = np.concatenate([np.ones((1, command.shape[1]), bool), np.any(command[1:] != command[:-1], -1)])
    since = np.zeros(changed.shape, int)
    for t in range(1, len(changed)):
        since[t] = np.where(changed[t], 0, since[t - 1] + 1)
    return since


def centred_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of `values` over `window` steps (the leading axis) around each step; NaN where it runs off an end."""
    sums = np.cumsum(np.concatenate([np.zeros_like(values[:1]), values]), axis=0)
    means = np.full(values.shape, np.nan)
    start = window // 2
    means[start : start + len(values) + 1 - window] = (sums[window:] - sums[:-window]) / window
    return means


def windowed_error(
    achieved: np.ndarray, command: np.ndarray, settled: np.ndarray, stretch_id: np.ndarray, window: int
) -> float:
    """Mean xy error of the velocity averaged over `window` steps, where the whole window is settled on one command."""
    if window < 1 or window > len(achieved):
        return float("nan")
    first, last = window // 2, window - 1 - window // 2  # steps before and after the centre
    valid = np.zeros(settled.shape, bool)
    ends_settled = settled[: len(settled) - window + 1] & settled[window - 1 :]
    same_stretch = stretch_id[: len(settled) - window + 1] == stretch_id[window - 1 :]
    valid[first : len(settled) - last] = ends_settled & same_stretch
    if not valid.any():
        return float("nan")
    averaged = centred_mean(achieved[..., :2], window)
    return float(np.linalg.norm(averaged - command[..., :2], axis=-1)[valid].mean())


def settled_error(trace: Trace, settle_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step and episode: the xy command error (m/s), the steps since the command changed, and whether the
    step is running and at least `settle_steps` after that change."""
    achieved, command, running = trace
    error = np.linalg.norm(achieved[..., :2] - command[..., :2], axis=-1)
    since = steps_since_change(command)
    return error, since, running & (since >= settle_steps)


def breakdown(trace: Trace, settle_steps: int, window_steps: int = 0) -> Breakdown:
    """The error of `trace` split into transients, steady bias and oscillation, and the gain per axis."""
    achieved, command, running = trace
    error, since, settled = settled_error(trace, settle_steps)
    yaw_error = np.abs(achieved[..., 2] - command[..., 2])
    stretch_id = np.cumsum(since == 0, axis=0)  # per episode, which command the step belongs to
    transient = running & ~settled
    means, commands, oscillations = [], [], []
    for episode in range(running.shape[1]):
        for stretch in np.unique(stretch_id[:, episode]):
            steps = settled[:, episode] & (stretch_id[:, episode] == stretch)
            if steps.sum() < settle_steps:
                continue
            values = achieved[steps, episode]
            means.append(values.mean(0))
            commands.append(command[steps, episode][0])
            oscillations.append(np.abs(values - values.mean(0)))
    mean, commanded = np.asarray(means).reshape(-1, 3), np.asarray(commands).reshape(-1, 3)
    sway = [np.linalg.norm(values[:, :2], axis=-1).mean() for values in oscillations]
    twist = [values[:, 2].mean() for values in oscillations]

    def gain(axis: int) -> float:
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(np.sum(mean[:, axis] * commanded[:, axis]) / np.sum(commanded[:, axis] ** 2))

    return Breakdown(
        float(error[running].mean()),
        float(yaw_error[running].mean()),
        float(error[settled].mean()),
        float(yaw_error[settled].mean()),
        float(error[transient].sum() / running.sum()),
        float(error[transient & (stretch_id == 1)].sum() / running.sum()),
        windowed_error(achieved, command, settled, stretch_id, window_steps),
        len(mean),
        float(np.linalg.norm(mean[:, :2] - commanded[:, :2], axis=-1).mean()) if len(mean) else float("nan"),
        float(np.mean(sway)) if sway else float("nan"),
        float(np.abs(mean[:, 2] - commanded[:, 2]).mean()) if len(mean) else float("nan"),
        float(np.mean(twist)) if twist else float("nan"),
        (gain(0), gain(1), gain(2)),
    )


def play(
    task: Any, shared: Any, episodes: int, seed: int, measure: Callable[[Any], jax.Array]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plays `episodes` deterministic episodes for the task's episode length: per control step (leading axis)
    and episode, `measure(ctx)` of the step's context, the command, and whether the episode was still running
    (its first step after an end and later ones are not)."""
    environment = task.environment
    steps = environment.settings.max_episode_steps

    def step_one(shared: Any, episode: Any) -> tuple[Any, tuple[jax.Array, jax.Array, jax.Array]]:
        stepped, trajectory, ctx = deterministic_step(environment, shared, episode)
        return stepped, (measure(ctx), episode.command, trajectory.terminated | trajectory.truncated)

    def play_all(shared: Any, keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        start = jax.vmap(environment.start_episode)(keys)
        _, outputs = jax.lax.scan(lambda ep, _: jax.vmap(step_one, in_axes=(None, 0))(shared, ep), start, None, steps)
        return outputs

    keys = jax.random.split(jax.random.PRNGKey(seed), episodes)
    measured, command, ended = jax.device_get(jax.jit(play_all)(jax.device_put(shared, jax.local_devices()[0]), keys))
    running = np.cumsum(np.concatenate([np.zeros((1, episodes)), ended[:-1]]), axis=0) == 0
    return np.asarray(measured), np.asarray(command), running


def record(task: Any, shared: Any, episodes: int, seed: int) -> Trace:
    """Plays `episodes` deterministic episodes and records the heading-frame velocity and yaw rate."""

    def achieved(ctx: Any) -> jax.Array:
        return jax.numpy.concatenate([heading_velocity(ctx)[:2], ctx.base_ang_vel_world[2:]])

    return Trace(*play(task, shared, episodes, seed, achieved))


def task_class_and_config(name: str) -> tuple[type, Any]:
    """The class `module:Class` (or `FILE.py:Class`) and its module's DEFAULT_CONFIG; ValueError naming what is
    missing or wrong."""
    try:
        return task_and_default_config(name)
    except ConfigError as error:
        raise ValueError(f"task={name!r}: {error}") from None


def class_and_settings(name: str, overrides: Sequence[str]) -> tuple[type, Any]:
    """The class `module:Class` and its module's DEFAULT_CONFIG with the `key=value` settings applied;
    ValueError naming what is missing or wrong."""
    task_class, config = task_class_and_config(name)
    try:
        return task_class, parse_overrides(config, overrides)
    except ConfigError as error:
        raise ValueError(str(error)) from None


def build_task(name: str, checkpoint: str, overrides: Sequence[str] = (), as_modelled: bool = False) -> Any:
    """The task `module:Class` built from its module's DEFAULT_CONFIG and the run's `key=value` settings (with
    `as_modelled`, without randomizations and events); ValueError naming what is missing or wrong."""
    task_class, config = class_and_settings(name, overrides)
    task_class = nominal(task_class) if as_modelled else task_class
    return task_class(dataclasses.replace(config, load_from_ckpt_path=checkpoint))


def load_tracking_task(
    parser: argparse.ArgumentParser, args: argparse.Namespace, as_modelled: bool = False
) -> tuple[Any, Any]:
    """The task of `args.task` with the run's settings and its checkpoint's deployed state; parser.error (one
    line) when it cannot be built or has no velocity command to track."""
    try:
        task = build_task(args.task, args.checkpoint, args.settings, as_modelled=as_modelled)
    except ValueError as error:
        parser.error(str(error))
    if not tracks_velocity(task.environment.components.command):
        parser.error(f"{args.task} has no velocity command (get_command returns no VelocityCommand): nothing to track")
    return task, task.checkpoints.load(args.checkpoint)["shared"].deployed()


class Band(NamedTuple):
    name: str
    share: float  # of the running steps
    settled_error: float  # mean xy error over its settled steps (NaN without any), m/s
    part: float  # its steps' share of the every-step command error, m/s


def band_errors(trace: Trace, settle_steps: int, edges: Sequence[float]) -> list[Band]:
    """The every-step command error split by the forward command: "stand" (a zero command), then one band
    between each pair of `edges` (sorted, m/s), the first and last open-ended. The parts add up to the error."""
    _, command, running = trace
    error, _, settled = settled_error(trace, settle_steps)
    standing = np.all(command == 0, axis=-1)
    bounds = [-np.inf, *edges, np.inf]
    bands = [("stand", running & standing)]
    for low, high in itertools.pairwise(bounds):
        in_band = running & ~standing & (command[..., 0] >= low) & (command[..., 0] < high)
        bands.append((f"forward {low:g}..{high:g} m/s", in_band))
    total = max(int(running.sum()), 1)
    return [
        Band(
            name,
            float(steps.sum() / total),
            float(error[steps & settled].mean()) if (steps & settled).any() else float("nan"),
            float(error[steps].sum() / total),
        )
        for name, steps in bands
    ]


def nominal(task_class: type) -> type:
    """`task_class` without its randomizations and events: the robot as modelled, never pushed."""
    return type(
        f"Nominal{task_class.__name__}",
        (task_class,),
        {"get_randomizations": lambda self: [], "get_events": lambda self: []},
    )


def report_bands(bands: Sequence[Band]) -> str:
    lines = [
        f"  {band.name}: {band.share:.0%} of steps, settled {band.settled_error:.3f} m/s, "
        f"{band.part:.3f} m/s of the every-step error"
        for band in bands
        if band.share > 0
    ]
    return "\n".join(["  by forward command:", *lines])


def report(result: Breakdown, settle_s: float, window_s: float = 0.0) -> str:
    gains = ", ".join(f"{axis} {gain:.2f}" for axis, gain in zip(AXES, result.gain, strict=True))
    averaged = f"  the velocity averaged over {window_s:g} s, once settled: {result.window_error:.3f} m/s"
    window = [averaged] if window_s else []
    return "\n".join(
        [
            f"command error {result.command_error:.3f} m/s, "
            f"yaw-rate error {result.yaw_rate_error:.3f} rad/s (every step)",
            f"  of the command error, {result.transient_part:.3f} m/s within {settle_s:g} s of a change "
            f"({result.start_part:.3f} after episode starts)",
            f"  {settle_s:g} s after a command change: {result.settled_command_error:.3f} m/s, "
            f"{result.settled_yaw_rate_error:.3f} rad/s",
            *window,
            f"  over {result.stretches} steady stretches: bias {result.bias:.3f} m/s, "
            f"oscillation {result.oscillation:.3f} m/s; yaw bias {result.yaw_bias:.3f} rad/s, "
            f"yaw oscillation {result.yaw_oscillation:.3f} rad/s",
            f"  tracking gain (achieved / commanded): {gains}",
        ]
    )


def parse_edges(text: str) -> list[float] | None:
    """`--forward-bands`' edges, or None where they are not increasing numbers."""
    try:
        edges = [float(value) for value in text.split(",")]
    except ValueError:
        return None
    increasing = all(low < high for low, high in itertools.pairwise(edges))
    return edges if increasing and all(np.isfinite(edges)) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="the task class as module:Class or FILE.py:Class, e.g. examples.kbot:KBotTask")
    parser.add_argument("checkpoint")
    parser.add_argument("settings", nargs="*", help="the run's key=value settings, as given to its training")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle-s", type=float, default=1.0, help="seconds after a command change left out")
    parser.add_argument(
        "--window-s", type=float, default=0.0, help="also the error of the velocity averaged over this many seconds"
    )
    parser.add_argument(
        "--forward-bands",
        default="-0.2,0.4,0.8",
        help="comma-separated forward commands (m/s) between which the error is split by band",
    )
    parser.add_argument(
        "--nominal", action="store_true", help="play without the task's randomizations and events (no pushes)"
    )
    args = parser.parse_args()
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} must be >= 1")
    if args.settle_s <= 0:
        parser.error(f"--settle-s={args.settle_s:g} must be > 0")
    if args.window_s < 0:
        parser.error(f"--window-s={args.window_s:g} must be >= 0")
    edges = parse_edges(args.forward_bands)
    if edges is None:
        parser.error(f"--forward-bands={args.forward_bands}: give increasing numbers, comma-separated (m/s)")
    task, shared = load_tracking_task(parser, args, as_modelled=args.nominal)
    settle_steps = max(1, round(args.settle_s / task.config.ctrl_dt))
    window_steps = round(args.window_s / task.config.ctrl_dt)
    trace = record(task, shared, args.episodes, args.seed)
    print(report(breakdown(trace, settle_steps, window_steps), args.settle_s, args.window_s))
    print(report_bands(band_errors(trace, settle_steps, edges)))


if __name__ == "__main__":
    main()
