"""The native engine's XLA FFI path against its Python callbacks (issue 37), side by side in one run:

1. Launch to exit of `python -m examples.<task> num_steps=2` with an empty compilation cache, then the same
   command again (the second start, which may load the programs from the cache): both times, their ratio and
   the train step's compile line, per path (the callbacks through KSIM_NATIVE_FFI=0).
2. Training env-steps/s of the example's config (1 device, no compilation cache), one task per path in this
   process, train steps alternating between the paths (medians), with the time the physics' host work took
   inside them; and the physics alone (benchmarks.native_vs_mjx's: the envs stepped from the default pose with
   random actions through the task's actuators).

    .venv/bin/python -m benchmarks.ffi_startup [--tasks cartpole hopper] [--train hopper] [--repeats 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("ffi", "callback")
OFF = "KSIM_NATIVE_FFI"


def launch(task: str, cache_dir: str, path: str) -> tuple[float, str]:
    """Seconds from launch to exit of a 2-step run, and its train step's compile line."""
    env = dict(os.environ)
    if path == "callback":
        env[OFF] = "0"
    else:
        env.pop(OFF, None)
    command = [sys.executable, "-m", f"examples.{task}", "num_steps=2", f"compilation_cache_dir={cache_dir}"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip().splitlines()[-1:]}")
    line = next((s.strip() for s in result.stdout.splitlines() if s.strip().startswith("train step:")), "?")
    return elapsed, line


def startup(task: str) -> None:
    """First and second start of the example on each path, each pair from its own empty cache."""
    print(f"\n`python -m examples.{task} num_steps=2`, launch to exit (s), empty cache then the same again")
    print("| path | first start | second start | second / first | train step, first | train step, second |")
    print("|---|---:|---:|---:|---|---|")
    for path in PATHS:
        with tempfile.TemporaryDirectory(prefix="ksim-ffi-cache-") as cache_dir:
            (first, first_line), (second, second_line) = (launch(task, cache_dir, path) for _ in range(2))
        print(f"| {path} | {first:.1f} | {second:.1f} | {second / first:.2f} | {first_line} | {second_line} |")


@dataclasses.dataclass
class Trainer:
    """One path's task and train state, and its train steps' times."""

    task: Any
    state: Any
    physics_program: Any
    data: Any
    seconds: list[float] = dataclasses.field(default_factory=list)
    physics: list[float] = dataclasses.field(default_factory=list)
    alone: list[float] = dataclasses.field(default_factory=list)

    def physics_alone(self, index: int) -> None:
        import jax

        start = time.perf_counter()
        self.data = jax.block_until_ready(self.physics_program(self.data, jax.random.PRNGKey(index)))
        self.alone.append(time.perf_counter() - start)

    def train_step(self) -> None:
        import jax

        clock = self.task.engine.host_clock
        before = clock.seconds
        start = time.perf_counter()
        self.state, metrics = self.task.train_step(self.state)
        jax.block_until_ready(metrics)
        self.seconds.append(time.perf_counter() - start)
        self.physics.append(clock.seconds - before)


def trainer(name: str, path: str) -> Trainer:
    """The example's task on one path, its first train step run (compiled without the cache)."""
    import jax

    from benchmarks.native_vs_mjx import example, physics_program, start_data
    from ksim.physics.native import FfiCalls

    task_class, config = example(name)
    overrides: dict[str, Any] = {"physics_impl": "mujoco", "compilation_cache_dir": ""}
    if hasattr(config, "num_devices"):
        overrides["num_devices"] = 1
    previous = os.environ.pop(OFF, None)
    if path == "callback":
        os.environ[OFF] = "0"
    try:
        task = task_class(dataclasses.replace(config, **overrides))
    finally:
        os.environ.pop(OFF, None)
        if previous is not None:
            os.environ[OFF] = previous
    assert isinstance(task.engine.transport, FfiCalls) == (path == "ffi"), f"the {path} path was not built"
    state, metrics = task.train_step(task.init_train_state())
    jax.block_until_ready(metrics)
    program = physics_program(task)
    data = jax.block_until_ready(program(start_data(task), jax.random.PRNGKey(0)))
    return Trainer(task, state, program, data)


def training(name: str, repeats: int) -> None:
    """Train env-steps/s on each path, the train steps alternating between them."""
    trainers = {path: trainer(name, path) for path in PATHS}
    for index in range(repeats):
        for path in PATHS if index % 2 == 0 else PATHS[::-1]:
            trainers[path].train_step()
            trainers[path].physics_alone(index + 1)
    task = trainers["ffi"].task
    env_steps = task.config.num_envs * task.config.rollout_length_frames
    print(f"\n{name} training, {task.config.num_envs} envs x {task.config.rollout_length_frames} steps, 1 device")
    print("| path | train step (ms) | train env-steps/s | physics host work in it (ms) | physics alone env-steps/s |")
    print("|---|---:|---:|---:|---:|")
    rates, alone = {}, {}
    for path, runner in trainers.items():
        step, physics = statistics.median(runner.seconds), statistics.median(runner.physics)
        rates[path], alone[path] = env_steps / step, env_steps / statistics.median(runner.alone)
        print(f"| {path} | {1e3 * step:.1f} | {rates[path]:,.0f} | {1e3 * physics:.1f} | {alone[path]:,.0f} |")
    print(f"ffi / callback, train env-steps/s: {rates['ffi'] / rates['callback']:.2f}x", end="")
    print(f", physics alone: {alone['ffi'] / alone['callback']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="*", default=["cartpole", "hopper"], help="examples whose starts to time")
    parser.add_argument("--train", nargs="*", default=["hopper"], help="examples whose training to time")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for task in args.tasks:
        startup(task)
    for name in args.train:
        training(name, args.repeats)


if __name__ == "__main__":
    main()
