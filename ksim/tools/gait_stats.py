"""How a walking policy uses its feet: whether they lift, take turns, and stay down when it is told to stand.

    .venv/bin/python -m ksim.tools.gait_stats examples.kbot:KBotTask RUN/checkpoints/ckpt_latest.bin \
        --feet LFootBushing_GPF_1517_12,RFootBushing_GPF_1517_12

Plays deterministic episodes as `tracking_breakdown` does (the task's module's `DEFAULT_CONFIG` with the run's
`key=value` settings, commands drawn as in training) and records at every control step whether each foot
(`--feet`: a geom, or a body and its colliding geoms) touches the ground, from the simulator's contacts, and
the height of its frame; a foot is "up" when it touches nothing, and its lift is its frame's height above the
median height at which it touched the ground. Over the steps of walking (a command whose
forward and lateral part is at least `--walking-speed`, from `--settle-s` after it was given) it reports, per
foot, the share of gait windows (`--window-s`, one gait period) in which it was up at some step (a foot that
never leaves the ground shuffles), the share of steps it is up and the 95th percentile of its lift; the share of
steps with every foot up at once (a hop or a run, also as the share of windows with such a step); and the share
of windows in which the feet take turns (each foot up at some step). Told to stand (a zero command, from
`--settle-s` on), the share of steps with a foot up says whether it steps in place.
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ksim.config import ConfigError
from ksim.engine import Point
from ksim.observations import feet_geoms
from ksim.rewards import feet_points
from ksim.tools.tracking_breakdown import load_tracking_task, play, steps_since_change


class FeetTrace(NamedTuple):
    """Per control step (leading axis) and episode: whether each foot touches the ground, its frame's height (m),
    the command, and whether the episode was still running."""

    contact: np.ndarray  # (steps, episodes, feet), bool
    heights: np.ndarray  # (steps, episodes, feet)
    command: np.ndarray  # (steps, episodes, 3)
    running: np.ndarray  # (steps, episodes)


class GaitStats(NamedTuple):
    up_in_windows: tuple[float, ...]  # per foot, the share of walking windows in which it is up at some step
    up: tuple[float, ...]  # per foot, the share of walking steps it is up
    lift_p95: tuple[float, ...]  # per foot, the 95th percentile of its lift over walking steps, m
    all_up: float  # the share of walking steps with every foot up
    turns: float  # the share of walking windows in which each foot is up at some step
    flight_windows: float  # the share of walking windows with a step in which every foot is up
    stand_up: float  # the share of settled standing steps with a foot up (NaN without any)
    walking_windows: int


def settled_steps(trace: FeetTrace, settle_steps: int) -> np.ndarray:
    """Per step and episode: running and at least `settle_steps` after the command last changed."""
    return trace.running & (steps_since_change(trace.command) >= settle_steps)


def walking_windows(walking: np.ndarray, window: int) -> list[tuple[int, int]]:
    """(first step, episode) of each back-to-back window of `window` steps in which every step is walking."""
    starts = []
    for episode in range(walking.shape[1]):
        first = 0
        while first + window <= walking.shape[0]:
            if walking[first : first + window, episode].all():
                starts.append((first, episode))
                first += window
            else:
                first += 1
    return starts


def lift_heights(trace: FeetTrace) -> np.ndarray:
    """Per step, episode and foot: its frame's height above the median height at which that foot touched."""
    grounded = trace.contact & trace.running[..., None]
    ground = [np.median(trace.heights[..., foot][grounded[..., foot]]) for foot in range(trace.heights.shape[-1])]
    return trace.heights - np.asarray(ground)


def gait_stats(trace: FeetTrace, walking_speed: float, settle_steps: int, window: int) -> GaitStats:
    """The statistics of `trace`: walking from `walking_speed` (m/s), over back-to-back windows of `window` steps."""
    settled = settled_steps(trace, settle_steps)
    speed = np.linalg.norm(trace.command[..., :2], axis=-1)
    walking = settled & (speed >= walking_speed)
    standing = settled & np.all(trace.command == 0, axis=-1)
    up = ~trace.contact
    lift = lift_heights(trace)
    starts = walking_windows(walking, window)
    in_windows = [up[first : first + window, episode] for first, episode in starts]
    window_up = np.array([steps.any(0) for steps in in_windows]).reshape(-1, up.shape[-1])
    together = np.array([steps.all(-1).any() for steps in in_windows], bool)
    feet = range(up.shape[-1])

    def share(values: np.ndarray) -> float:
        return float(values.mean()) if values.size else float("nan")

    def percentile_95(values: np.ndarray) -> float:
        return float(np.percentile(values, 95)) if values.size else float("nan")

    return GaitStats(
        tuple(share(window_up[:, foot]) for foot in feet),
        tuple(share(up[..., foot][walking]) for foot in feet),
        tuple(percentile_95(lift[..., foot][walking]) for foot in feet),
        share(up[walking].all(-1)),
        share(np.asarray(window_up.all(-1))),
        share(together),
        share(up[standing].any(-1)),
        len(starts),
    )


def record_feet(
    task: Any, shared: Any, geoms: tuple[tuple[int, ...], ...], points: tuple[Point, ...], episodes: int, seed: int
) -> FeetTrace:
    """Plays deterministic episodes and records, per foot, whether its `geoms` touch the ground and its height."""

    def contact_and_height(ctx: Any) -> jax.Array:
        contact = jnp.stack([ctx.in_contact(foot) for foot in geoms]).astype(jnp.float32)
        return jnp.concatenate([contact, jnp.stack([ctx.point_pos(point)[2] for point in points])])

    measured, command, running = play(task, shared, episodes, seed, contact_and_height)
    return FeetTrace(measured[..., : len(geoms)] > 0.5, measured[..., len(geoms) :], command, running)


def report(stats: GaitStats, feet: tuple[str, ...], window_s: float) -> str:
    per_foot = [
        f"  {name}: up in {window_share:.0%} of {window_s:g} s windows, {up:.0%} of steps; 95th percentile lift "
        f"{height * 100:.1f} cm"
        for name, window_share, up, height in zip(feet, stats.up_in_windows, stats.up, stats.lift_p95, strict=True)
    ]
    return "\n".join(
        [
            f"walking ({stats.walking_windows} windows of {window_s:g} s; up: touching nothing):",
            *per_foot,
            f"  every foot up at some step: {stats.turns:.0%} of windows; every foot up at once: {stats.all_up:.1%} "
            f"of steps, in {stats.flight_windows:.0%} of windows",
            f"told to stand: a foot up in {stats.stand_up:.1%} of steps",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="the task class as module:Class or FILE.py:Class, e.g. examples.kbot:KBotTask")
    parser.add_argument("checkpoint")
    parser.add_argument("settings", nargs="*", help="the run's key=value settings, as given to its training")
    parser.add_argument("--feet", required=True, help="comma-separated feet: geoms, or bodies with colliding geoms")
    parser.add_argument("--walking-speed", type=float, default=0.3, help="the least xy command that is walking, m/s")
    parser.add_argument("--window-s", type=float, default=0.6, help="a gait window (one gait period), s")
    parser.add_argument("--settle-s", type=float, default=1.0, help="seconds after a command change left out")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    feet = tuple(name for name in args.feet.split(",") if name)
    for option, value in (("--window-s", args.window_s), ("--settle-s", args.settle_s)):
        if value <= 0:
            parser.error(f"{option}={value:g} must be > 0")
    if args.walking_speed < 0:
        parser.error(f"--walking-speed={args.walking_speed:g} must be >= 0")
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} must be >= 1")
    task, shared = load_tracking_task(parser, args)
    try:
        geoms = feet_geoms(task.engine.layout, feet, "--feet")
        points = feet_points(task.engine.layout, feet, "--feet")
    except ConfigError as error:
        parser.error(str(error))
    trace = record_feet(task, shared, geoms, points, args.episodes, args.seed)
    window = max(1, round(args.window_s / task.config.ctrl_dt))
    settle = max(1, round(args.settle_s / task.config.ctrl_dt))
    print(report(gait_stats(trace, args.walking_speed, settle, window), feet, args.window_s))


if __name__ == "__main__":
    main()
