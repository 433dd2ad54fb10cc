"""The walking example's GPU preset under each physics implementation, each for the same wall time.

    python -m benchmarks.gpu_walking                                   # jax, warp and mujoco, 300 s each
    python -m benchmarks.gpu_walking --impls jax --seconds 600

Each implementation runs `python -m examples.walking preset=gpu sim2real=false physics_impl=IMPL` (the plain
forward-walking task at the GPU preset's 2048 envs, evaluations of 64 episodes every 40 train steps) in its own
process, stopped with SIGTERM after `--seconds` from launch (it saves a checkpoint and exits). `mujoco` runs with
JAX on the CPU (`JAX_PLATFORMS=cpu`): C MuJoCo on the machine's cores, the update there too. Printed per
implementation: the launcher's compile line, the median of the logged training env-steps/s, and the first
evaluation that walks (no falls, base speed >= 0.9 m/s against the 1.0 m/s target: seconds from launch, train
step, env steps), then every evaluation's speed in order.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WALKS_AT = 0.9  # m/s, with no falls: "walks" against the 1.0 m/s target
STEP_LINE = re.compile(r"^step (\d+)/\d+ .*\| env_steps (\d+) \| env_steps_per_s ([0-9.e+]+)")
EVAL_LINE = re.compile(r"^eval step (\d+) .*eval/base_speed_x (-?[0-9.e+-]+) \| eval/fall_rate ([0-9.e+-]+)")
COMPILE_LINE = re.compile(r"^startup and compilation: ([0-9.]+) s")


@dataclass
class Run:
    """What one launch logged, each line with its seconds from launch."""

    impl: str
    compile_s: float | None = None
    rates: list[float] = field(default_factory=list)
    env_steps_per_step: int = 0  # the same every train step: envs x rollout length
    evals: list[tuple[float, int, float, float]] = field(default_factory=list)  # (s, step, speed, fall rate)

    def read(self, seconds: float, line: str) -> None:
        if match := COMPILE_LINE.match(line):
            self.compile_s = float(match[1])
        elif match := STEP_LINE.match(line):
            self.env_steps_per_step = int(match[2]) // int(match[1])
            self.rates.append(float(match[3]))
        elif match := EVAL_LINE.match(line):
            self.evals.append((seconds, int(match[1]), float(match[2]), float(match[3])))

    def first_walk(self) -> tuple[float, int] | None:
        """Seconds from launch and train step of the first evaluation that walks."""
        for seconds, step, speed, falls in self.evals:
            if falls == 0.0 and speed >= WALKS_AT:
                return seconds, step
        return None

    def summary(self) -> str:
        rate = f"{statistics.median(self.rates[1:] or self.rates):,.0f}" if self.rates else "-"
        walk = self.first_walk()
        walked = "not within the run"
        if walk is not None:
            seconds, step = walk
            walked = f"{seconds:.0f} s, step {step}, {step * self.env_steps_per_step / 1e6:.1f}M env steps"
        compiled = f"{self.compile_s:.1f} s" if self.compile_s is not None else "-"
        return f"| {self.impl} | {compiled} | {rate} | {walked} | {len(self.evals)} |"


def launch(impl: str, seconds: float, run_dir: Path) -> Run:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if impl == "mujoco":
        env["JAX_PLATFORMS"] = "cpu"
    command = [
        sys.executable,
        "-m",
        "examples.walking",
        "preset=gpu",
        "sim2real=false",
        f"physics_impl={impl}",
        "num_steps=1000000",
        "eval_every_n_steps=40",
        "eval_episodes=64",
        f"run_dir={run_dir}",
    ]
    run = Run(impl)
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    stopped = False
    for line in process.stdout:
        now = time.monotonic() - start
        run.read(now, line.strip())
        if not stopped and now > seconds:
            process.send_signal(signal.SIGTERM)
            stopped = True
    process.wait()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", nargs="+", default=["jax", "warp", "mujoco"])
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for impl in args.impls:
            runs.append(launch(impl, args.seconds, Path(scratch) / impl))
            print(f"{impl}: done", flush=True)
    print("\n| physics_impl | startup and compilation | training env-steps/s | first walks | evaluations |")
    print("|---|---:|---:|---|---:|")
    for run in runs:
        print(run.summary())
    for run in runs:
        speeds = ", ".join(f"{speed:.2f}" for _, _, speed, _ in run.evals)
        print(f"{run.impl} evaluation speeds (m/s): {speeds}")


if __name__ == "__main__":
    main()
