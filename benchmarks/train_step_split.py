"""Where a train step's time goes (physics calls, the rest of the rollout, the update), variants side by side.

    .venv/bin/python -m benchmarks.train_step_split examples.kbot:KBotTask
    .venv/bin/python -m benchmarks.train_step_split examples.kbot:KBotTask "examples.kbot:KBotTask dt=0.00666666667"

Each variant is `module:Class` (or `FILE.py:Class`) followed by `key=value` settings on its module's
DEFAULT_CONFIG, built on one device. After every variant's first train step (compilation), the timed repeats
alternate between the variants (a, b, b, a, ...), each one rollout alone and then one train step; with the native
engine, also the time its physics calls took inside that train step (the engine's `host_clock`). Prints medians
per variant: the train step, env-steps/s (and its ratio to the first variant's), the rollout, the physics calls
and the update (the train step less the rollout).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from ksim.tools.tracking_breakdown import class_and_settings


@dataclass
class Timings:
    """One variant's timed repeats, seconds each."""

    env_steps: int  # per train step
    train: list[float] = field(default_factory=list)
    rollout: list[float] = field(default_factory=list)
    physics: list[float] = field(default_factory=list)  # empty where the engine has no host clock


@dataclass(frozen=True)
class Split:
    train_s: float
    env_steps_per_s: float
    rollout_s: float
    physics_s: float | None
    update_s: float


def split(timings: Timings) -> Split:
    """The medians of a variant's repeats."""
    train, rollout = statistics.median(timings.train), statistics.median(timings.rollout)
    physics = statistics.median(timings.physics) if timings.physics else None
    return Split(train, timings.env_steps / train, rollout, physics, train - rollout)


def table(names: Sequence[str], splits: Sequence[Split]) -> str:
    """A markdown table, one row per variant; env-steps/s also as a ratio to the first variant's."""
    lines = [
        "| variant | train step (s) | env-steps/s | vs the first | rollout (s) | physics calls (s) | update (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in zip(names, splits, strict=True):
        physics = "-" if row.physics_s is None else f"{row.physics_s:.3f}"
        ratio = row.env_steps_per_s / splits[0].env_steps_per_s
        lines.append(
            f"| {name} | {row.train_s:.3f} | {row.env_steps_per_s:,.0f} | {ratio:.2f}x | {row.rollout_s:.3f} "
            f"| {physics} | {row.update_s:.3f} |"
        )
    return "\n".join(lines)


def one_device(config: Any, **overrides: Any) -> Any:
    """The config with `overrides`, on one device where it has a device count."""
    if hasattr(config, "num_devices"):
        overrides["num_devices"] = 1
    return dataclasses.replace(config, **overrides)


def first_train_step(task: Any) -> Any:
    """The state after the task's first (compiling) train step."""
    import jax

    state, metrics = task.train_step(task.init_train_state())
    jax.block_until_ready(metrics)
    return state


def compile_rollout(task: Any, state: Any) -> None:
    """Compiles the rollout on its own, as `repeat` times it."""
    import jax

    jax.block_until_ready(task.programs["rollout"](state.shared, state.env))


def empty_timings(task: Any) -> Timings:
    return Timings(task.config.num_envs * task.config.rollout_length_frames)


def prepare(variant: str) -> tuple[Any, Any, Timings]:
    """The variant's task on one device, its state after a first (compiling) train step, and empty timings."""
    name, *overrides = variant.split()
    task_class, config = class_and_settings(name, overrides)
    task = task_class(one_device(config))
    state = first_train_step(task)
    compile_rollout(task, state)
    return task, state, empty_timings(task)


def repeat(task: Any, state: Any, timings: Timings) -> Any:
    """One timed rollout and one timed train step; the state after the train step."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(task.programs["rollout"](state.shared, state.env))
    timings.rollout.append(time.perf_counter() - start)
    clock = getattr(task.engine, "host_clock", None)
    before = clock.seconds if clock else 0.0
    start = time.perf_counter()
    state, metrics = task.train_step(state)
    jax.block_until_ready(metrics)
    timings.train.append(time.perf_counter() - start)
    if clock:
        timings.physics.append(clock.seconds - before)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "variants", nargs="+", help='"module:Class key=value ...", e.g. "examples.kbot:KBotTask dt=0.01"'
    )
    parser.add_argument("--repeats", type=int, default=12, help="timed repeats per variant (default 12)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} must be at least 1")
    try:
        prepared = [list(prepare(variant)) for variant in args.variants]
    except ValueError as error:
        parser.error(str(error))
    for index in range(args.repeats):
        order = prepared if index % 2 == 0 else prepared[::-1]
        for entry in order:
            entry[1] = repeat(*entry)
    print(table(args.variants, [split(timings) for _, _, timings in prepared]))


if __name__ == "__main__":
    main()
