"""Train steps, env steps and wall time to a target as the env count grows: what more devices buy.

    python -m benchmarks.batch_scaling examples.kbot --envs 256 1024 2048 \
        --target "command_error<=0.25,fall_rate<=0.05" --max-steps 1500
    python -m benchmarks.batch_scaling examples.walking_distributed --envs 128 2048 \
        --target "base_speed_x>=0.9,fall_rate<=0" --devices 2

Each env count runs the task's own command (`python -m MODULE`, or `python FILE.py`) with `num_envs=N` and the
`--settings`, in a process of its own, and is stopped (SIGTERM: it saves a checkpoint and exits) at the first
evaluation that meets every clause of `--target` (`name<=value` or `name>=value` over the evaluation's metrics,
`eval/` implied) or at `--max-steps`. Printed per count: train steps, env steps and wall time from launch to the
target, startup and compilation, the median train step's wall time, each as a ratio to the first count's; with
`--devices D` (a distributed task's `num_devices=D`; forced CPU devices on a CPU) also the envs per device. Then
the update's diagnostics side by side at the same train steps: entropy, KL from the rollout's policy per
minibatch, the adaptive rate, clip fraction, value loss, explained variance and gradient norm.

Train-step and env-step counts do not depend on the machine's load, wall times do: `--jobs K` runs K counts at
once (the counts stay exact, the table says the wall times were shared). `--reuse` reads the logs a previous
run left in `--out` instead of running those counts again.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"^step (\d+)/\d+ .*\| env_steps (\d+) \| env_steps_per_s ([0-9.e+]+)")
EVAL_LINE = re.compile(r"^eval step (\d+) \| (.*)$")
COMPILE_LINE = re.compile(r"^startup and compilation: ([0-9.]+) s")
OPERATORS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}
DIAGNOSTICS = ("entropy", "kl", "learning_rate", "clip_fraction", "value_loss", "explained_variance", "local_grad_norm")


@dataclass(frozen=True)
class Clause:
    metric: str  # e.g. "eval/command_error"
    op: str
    value: float

    def met(self, metrics: dict[str, float]) -> bool:
        return self.metric in metrics and OPERATORS[self.op](metrics[self.metric], self.value)

    def __str__(self) -> str:
        return f"{self.metric.removeprefix('eval/')} {self.op} {self.value:g}"


def parse_target(text: str) -> list[Clause]:
    """ "a<=1,b>=2" as clauses; ValueError naming a clause that is not name<=value or name>=value."""
    clauses = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([\w/]+)\s*(<=|>=)\s*(-?[0-9.e+-]+)\s*", part)
        if match is None:
            raise ValueError(f"--target clause {part.strip()!r} must be name<=value or name>=value")
        name = match[1] if match[1].startswith("eval/") else f"eval/{match[1]}"
        clauses.append(Clause(name, match[2], float(match[3])))
    return clauses


def eval_metrics(text: str) -> dict[str, float]:
    """The `name value` pairs of an evaluation line's tail."""
    pairs = (item.strip().split(" ", 1) for item in text.split("|"))
    return {name: float(value) for name, value in (pair for pair in pairs if len(pair) == 2)}


@dataclass
class Run:
    """One env count's launch: what its lines said, each with its seconds from launch."""

    num_envs: int
    run_dir: Path
    target: list[Clause]
    compile_s: float | None = None
    step_s: list[float] = field(default_factory=list)  # each logged train step's wall time
    env_steps_per_step: int = 0
    last_step: int = 0
    reached: tuple[int, float] | None = None  # (train step, seconds from launch) of the first evaluation that met it
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    returncode: int | None = None
    tail: list[str] = field(default_factory=list)

    def read(self, seconds: float, line: str) -> None:
        self.tail = [*self.tail[-20:], line]
        if match := COMPILE_LINE.match(line):
            self.compile_s = float(match[1])
        elif match := STEP_LINE.match(line):
            self.last_step, env_steps, rate = int(match[1]), int(match[2]), float(match[3])
            self.env_steps_per_step = env_steps // self.last_step
            self.step_s.append(self.env_steps_per_step / rate)
        elif match := EVAL_LINE.match(line):
            step, metrics = int(match[1]), eval_metrics(match[2])
            self.evaluations.append((step, metrics))
            if self.reached is None and all(clause.met(metrics) for clause in self.target):
                self.reached = (step, seconds)

    def diagnostics(self) -> dict[int, dict[str, float]]:
        """The update's metrics by train step, from the run's scalars.jsonl."""
        path = self.run_dir / "scalars.jsonl"
        if not path.exists():
            return {}
        rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return {row["step"]: row for row in rows if "entropy" in row}


def command(task: str, num_envs: int, settings: Sequence[str], max_steps: int, run_dir: Path) -> list[str]:
    launch = [sys.executable, task] if task.endswith(".py") else [sys.executable, "-m", task]
    return [*launch, f"num_envs={num_envs}", *settings, f"num_steps={max_steps}", f"run_dir={run_dir}"]


def device_environment(devices: int | None) -> dict[str, str]:
    """The runs' environment: with `devices`, that many forced CPU devices (what a CPU-only JAX uses; an
    accelerator's JAX ignores it and the runs' num_devices picks its first ones)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if devices is not None:
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def launch(run: Run, argv: list[str], env: dict[str, str], log: Path) -> None:
    """Runs `argv` to the target (then SIGTERM: the run saves and exits) or to its last step."""
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        stopped = False
        for line in process.stdout:
            out.write(line)
            run.read(time.monotonic() - start, line.strip())
            if run.reached is not None and not stopped:
                process.send_signal(signal.SIGTERM)
                stopped = True
        run.returncode = process.wait()


def replay(run: Run, log: Path) -> None:
    """Reads a finished launch's log (its lines carry no times: wall times to the target stay unknown)."""
    for line in log.read_text().splitlines():
        run.read(float("nan"), line.strip())
    run.returncode = 0


def ratio(value: float | None, first: float | None) -> str:
    known = value is not None and first and value == value and first == first  # NaN: a replayed log's times
    return f"{value / first:.2f}x" if known else "-"  # type: ignore[operator]


def table(runs: list[Run], devices: int | None, shared: bool) -> list[str]:
    """The scaling table, one row per env count."""
    first = runs[0]
    per_device = f" ({devices} devices)" if devices else ""
    wall = "wall time to target" + (" (shared)" if shared else "")
    lines = [
        f"| envs{per_device} | train steps to target | env steps | {wall} | startup | train step (median) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]

    def reached(run: Run) -> tuple[float | None, float | None, float | None]:
        if run.reached is None:
            return None, None, None
        step, seconds = run.reached
        return float(step), float(step * run.env_steps_per_step), seconds

    first_steps, first_env_steps, first_seconds = reached(first)
    first_step_s = statistics.median(first.step_s[1:] or first.step_s) if first.step_s else None
    for run in runs:
        steps, env_steps, seconds = reached(run)
        step_s = statistics.median(run.step_s[1:] or run.step_s) if run.step_s else None
        envs = f"{run.num_envs}" + (f" ({run.num_envs // devices}/device)" if devices else "")
        if steps is None:
            counts = f"not by step {run.last_step}", "-", "-"
        else:
            counts = (
                f"{steps:.0f} ({ratio(steps, first_steps)})",
                f"{env_steps / 1e6:.2f}M ({ratio(env_steps, first_env_steps)})",
                f"{seconds / 60:.1f} min ({ratio(seconds, first_seconds)})" if seconds == seconds else "-",
            )
        startup = f"{run.compile_s:.0f} s" if run.compile_s is not None else "-"
        step_text = f"{step_s:.2f} s ({ratio(step_s, first_step_s)})" if step_s is not None else "-"
        lines.append(f"| {envs} | {' | '.join(counts)} | {startup} | {step_text} |")
    return lines


def diagnostics_table(runs: list[Run], every: int) -> list[str]:
    """The update's metrics of every count at the same train steps (every `every`, up to the shortest run)."""
    logged = [run.diagnostics() for run in runs]
    last = min((max(rows) for rows in logged if rows), default=0)
    header = " | ".join(DIAGNOSTICS)
    lines = [f"| train step | envs | {header} |", "|---:|---:|" + "---:|" * len(DIAGNOSTICS)]
    for step in range(every, last + 1, every):
        for run, rows in zip(runs, logged, strict=True):
            near = min(rows, key=lambda logged_step: abs(logged_step - step)) if rows else None
            if near is None:
                continue
            values = " | ".join(f"{rows[near].get(name, float('nan')):.4g}" for name in DIAGNOSTICS)
            lines.append(f"| {near} | {run.num_envs} | {values} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="the task's module (examples.kbot) or file (my_robot.py), run as its command")
    parser.add_argument("--envs", type=int, nargs="+", required=True, help="env counts, the first the reference")
    parser.add_argument("--target", required=True, help='e.g. "command_error<=0.25,fall_rate<=0.05"')
    parser.add_argument("--max-steps", type=int, default=2000, help="stop a count that has not reached it here")
    parser.add_argument("--devices", type=int, help="num_devices of a distributed task (forced CPU devices on a CPU)")
    parser.add_argument("--settings", nargs="*", default=[], help="key=value settings for every count")
    parser.add_argument("--jobs", type=int, default=1, help="counts run at once (wall times then shared)")
    parser.add_argument("--every", type=int, default=100, help="train steps between rows of the diagnostics")
    parser.add_argument("--out", default="", help="folder for the runs and their logs (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="read a count's log in --out instead of running it again")
    args = parser.parse_args(argv)
    try:
        target = parse_target(args.target)
    except ValueError as error:
        parser.error(str(error))
    if args.jobs < 1 or args.max_steps < 1 or any(envs < 1 for envs in args.envs):
        parser.error("--jobs, --max-steps and every --envs must be >= 1")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="batch_scaling_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"target: {', '.join(map(str, target))}; runs and logs in {out}", flush=True)
    runs = [Run(envs, out / f"envs_{envs}", target) for envs in args.envs]
    env = device_environment(args.devices)
    settings = [*args.settings, *([f"num_devices={args.devices}"] if args.devices else [])]
    pending = list(runs)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not pending:
                    return
                run = pending.pop(0)
            log = out / f"envs_{run.num_envs}.log"
            if args.reuse and log.exists():
                replay(run, log)
            else:
                launch(run, command(args.task, run.num_envs, settings, args.max_steps, run.run_dir), env, log)
            reached = f"target at step {run.reached[0]}" if run.reached else f"no target by step {run.last_step}"
            print(f"{run.num_envs} envs: {reached} (exit {run.returncode})", flush=True)
            if run.returncode not in (0, -signal.SIGTERM) and run.reached is None:
                print("\n".join(run.tail[-5:]), flush=True)

    workers = [threading.Thread(target=work) for _ in range(min(args.jobs, len(runs)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print()
    print("\n".join(table(runs, args.devices, args.jobs > 1)))
    print()
    print("\n".join(diagnostics_table(runs, args.every)))


if __name__ == "__main__":
    main()
