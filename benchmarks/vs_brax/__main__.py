"""ksim vs Brax on the same hopper MDP, side by side: steady env-steps/s, compile time and return.

    make bench-brax                                     # or: .venv/bin/python -m benchmarks.vs_brax
    .venv/bin/python -m benchmarks.vs_brax --devices 1 --train-steps 12   # a quick look

ksim runs examples/hopper.py:HopperTask in this interpreter's environment. Brax (0.14.2, MJX pipeline) runs a
mirror of that task on the same MJCF (ksim/assets/hopper.xml) in its own virtual environment,
benchmarks/vs_brax/.venv, which this script builds on first use from requirements.txt (git-ignored; not the
project's .venv). For each device count both frameworks run at once, each in a fresh process with that many
forced CPU devices and the same PPO settings and env-step budget, but they take turns (turns.py): one works
while the other waits, in the order A B B A A B ..., a turn being one of `timing_chunks` equal chunks of
training (Brax's epochs), so a drift in the machine's speed falls on both alike; runs one after the other gave
ratios that moved by 0.15 with the machine's state. `--rounds N` repeats that N times, alternating which
framework goes first, and shows the medians, then each round's ratios. Both count time the same way, on a
clock that stops while the worker waits: steady env-steps/s is the median of the chunks after the first, and
compile time is the whole training's time (from building the env or task) minus what its env steps take at
steady speed (Brax compiles part of its loop after the first epoch).
Env-steps per CPU-second (all threads of the process, median over the chunks after the first) is printed too:
on a shared machine it moves less with other load than wall-clock rates. The return is the mean over
`eval_episodes` deterministic episodes after the whole budget, on both sides at the same env-step count.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.vs_brax.turns import GO, TURN_DONE, turn_order

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BRAX_VENV = HERE / ".venv"
REQUIREMENTS = HERE / "requirements.txt"

SETTINGS: dict[str, Any] = {
    "num_envs": 256,
    "rollout_length": 32,  # Brax's unroll_length
    "batch_size": 32,  # envs per minibatch: 8 minibatches (Brax: batch_size 32 x num_minibatches 8)
    "num_passes": 4,  # Brax's num_updates_per_batch
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,  # policy and value clipping on both sides
    "entropy_coef": 1e-3,
    "max_grad_norm": 1.0,
    "init_log_std": -0.5,
    "hidden": [64, 64],  # actor and critic, tanh
    "ctrl_dt": 0.02,
    "dt": 0.005,
    "episode_steps": 500,
    "train_steps": 36,  # x 8,192 env steps = 294,912 env steps
    "timing_chunks": 12,  # turns of 3 train steps (1-2 s each)
    "eval_episodes": 16,
    "seed": 0,
}

# What the Brax env mirrors of HopperTask; the ksim worker reports the components that no longer match
# (ksim_worker.mirrored_components) and the table warns of them (examples/hopper.py is being tuned).
MIRRORED: dict[str, Any] = {
    "min_height": 0.8,
    "max_pitch": 0.2,
    "reset_noise": 0.005,
    "ctrl_cost_scale": -1e-3,  # ksim's sign convention: a negative scale is a cost
}


def brax_python() -> Path:
    """Brax's interpreter, (re)building its venv when requirements.txt changed."""
    python = BRAX_VENV / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = BRAX_VENV / ".requirements-sha256"
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    print(f"building Brax's virtual environment in {BRAX_VENV} ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(BRAX_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(digest)
    return python


def worker_command(framework: str, devices: int, settings: dict[str, Any], python: Path) -> list[str]:
    if framework == "ksim":
        return [str(python), "-m", "benchmarks.vs_brax.ksim_worker", json.dumps(settings)]
    xml = ROOT / "ksim" / "assets" / "hopper.xml"
    return [str(python), str(HERE / "brax_worker.py"), str(xml), json.dumps(settings | MIRRORED)]


class Worker:
    """A worker process (ksim_worker or brax_worker) with `devices` forced CPU devices."""

    def __init__(self, name: str, command: list[str], devices: int) -> None:
        env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        self.name = name
        # A file, not a pipe, for stderr: a full pipe would stall the worker. Closed by `close`.
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.report: dict[str, Any] | None = None

    def take_turn(self) -> None:
        """Lets the worker run until it waits again, or until it ends with its report."""
        assert self.process.stdin is not None
        self.process.stdin.write(GO + "\n")
        self.process.stdin.flush()
        self.run_until_it_waits()

    def run_until_it_waits(self) -> None:
        assert self.process.stdout is not None
        last = ""
        for line in self.process.stdout:
            if line.strip() == TURN_DONE:
                return
            last = line
        if self.process.wait() != 0:
            self.stderr.seek(0)
            raise RuntimeError(f"{self.name} failed:\n{self.stderr.read()[-3000:]}")
        self.report = json.loads(last)
        print(f"{self.name}: {self.report}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def run_side_by_side(devices: int, settings: dict[str, Any], pythons: dict[str, Path], first: str) -> dict[str, Any]:
    """Trains with both frameworks at once, taking turns; {framework: report}."""
    commands = {name: worker_command(name, devices, settings, python) for name, python in pythons.items()}
    return take_turns(
        {name: Worker(f"{name} x{devices}", command, devices) for name, command in commands.items()}, first
    )


def take_turns(workers: dict[str, Worker], first: str) -> dict[str, Any]:
    """Gives two waiting workers turns (`turns.turn_order`) until both have ended; {name: report}."""
    second = next(name for name in workers if name != first)
    try:
        for worker in workers.values():  # starting up (imports) is not timed, so both may do it at once
            worker.run_until_it_waits()
        turn = 0
        while any(worker.report is None for worker in workers.values()):
            name = turn_order(first, second, turn)
            if workers[name].report is not None:  # it has ended: the other one finishes alone
                name = first if name == second else second
            workers[name].take_turn()
            turn += 1
    finally:
        for worker in workers.values():
            worker.close()
    return {name: worker.report for name, worker in workers.items()}


def physics_only_sps(python: Path) -> float:
    """Control steps/s of the same model's MJX physics alone (benchmarks/mjx_physics_only.py, one device):
    the same envs and substeps with random controls, no policy, no learning, no framework."""
    substeps = round(SETTINGS["ctrl_dt"] / SETTINGS["dt"])
    xml = ROOT / "ksim" / "assets" / "hopper.xml"
    script = ROOT / "benchmarks" / "mjx_physics_only.py"
    command = [str(python), str(script), str(xml), str(SETTINGS["num_envs"]), str(substeps)]
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    match = re.search(r"control steps/s median (\d+)", result.stdout)
    if match is None:
        raise RuntimeError(f"unexpected output of {script.name}: {result.stdout[-500:]}")
    print(f"MJX physics alone: {result.stdout.strip()}", file=sys.stderr, flush=True)
    return float(match.group(1))


def print_table(
    results: dict[tuple[str, int], dict[str, Any]], device_counts: list[int], physics: float | None
) -> None:
    ksim_jax = {results["ksim", d]["jax"] for d in device_counts}
    brax_jax = {results["brax", d]["jax"] for d in device_counts}
    steps = results["ksim", device_counts[0]]["env_steps"]
    print(
        f"\nhopper, {SETTINGS['num_envs']} envs, {steps:,} env steps; ksim on jax {', '.join(sorted(ksim_jax))}, "
        f"brax 0.14.2 on jax {', '.join(sorted(brax_jax))}"
    )
    header = (
        f"{'devices':>7} | {'ksim env-steps/s':>16} {'brax env-steps/s':>16} {'ksim/brax':>9} | "
        f"{'ksim compile s':>14} {'brax compile s':>14} {'ksim/brax':>9} | {'ksim return':>11} {'brax return':>11} | "
        f"{'ksim steps/cpu-s':>16} {'brax steps/cpu-s':>16} {'ksim/brax':>9}"
    )
    print(header)
    print("-" * len(header))
    for d in device_counts:
        k, b = results["ksim", d], results["brax", d]
        print(
            f"{d:>7} | {k['steady_sps']:>16,.0f} {b['steady_sps']:>16,.0f} {k['steady_sps'] / b['steady_sps']:>9.2f} | "
            f"{k['compile_s']:>14.1f} {b['compile_s']:>14.1f} {k['compile_s'] / b['compile_s']:>9.2f} | "
            f"{k['return']:>11.1f} {b['return']:>11.1f} | "
            f"{k['steps_per_cpu_s']:>16,.0f} {b['steps_per_cpu_s']:>16,.0f} "
            f"{k['steps_per_cpu_s'] / b['steps_per_cpu_s']:>9.2f}"
        )
    if len(device_counts) > 1:
        first, last = device_counts[0], device_counts[-1]
        for name in ("ksim", "brax"):
            ratio = results[name, last]["steady_sps"] / results[name, first]["steady_sps"]
            print(f"{name}: {last} devices / {first} device steady env-steps/s = {ratio:.2f}")
    if physics is not None:
        ksim_share, brax_share = (results[name, 1]["steady_sps"] / physics for name in ("ksim", "brax"))
        print(
            f"MJX physics alone, 1 device (same model, envs and substeps, random controls): {physics:,.0f} "
            f"control steps/s; ksim's training runs at {ksim_share:.2f} of it, Brax's at {brax_share:.2f}"
        )
    for change in results["ksim", device_counts[0]]["component_changes"]:
        print(f"WARNING: examples/hopper.py's components changed; the Brax env no longer mirrors them: {change}")


def median_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several rounds: the median of each timing, the rest from the first round."""
    timings = ("steady_sps", "compile_s", "steps_per_cpu_s")
    return reports[0] | {key: statistics.median(report[key] for report in reports) for key in timings}


def print_rounds(runs: dict[tuple[str, int], list[dict[str, Any]]], device_counts: list[int]) -> None:
    """Each round's ksim/Brax ratios, for a look at how much they move between rounds."""
    for d in device_counts:
        pairs = list(zip(runs["ksim", d], runs["brax", d], strict=True))
        steady = ", ".join(f"{k['steady_sps'] / b['steady_sps']:.2f}" for k, b in pairs)
        compile_s = ", ".join(f"{k['compile_s'] / b['compile_s']:.2f}" for k, b in pairs)
        print(f"{d} device(s), ksim/brax per round: steady {steady}; compile {compile_s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2], help="forced CPU device counts")
    parser.add_argument("--train-steps", type=int, default=SETTINGS["train_steps"], help="of 8,192 env steps")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each (framework, devices); medians are shown")
    parser.add_argument("--brax-python", type=Path, help="an existing Brax interpreter instead of .venv's")
    parser.add_argument(
        "--physics-impl",
        choices=("auto", "jax", "mujoco"),
        default="auto",
        help="ksim's physics: its default (C MuJoCo on CPU devices), MJX or C MuJoCo; Brax keeps MJX",
    )
    parser.add_argument("--results", type=Path, help="JSON file of finished runs: reused, and extended as runs end")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    if args.train_steps < 1 or args.train_steps % SETTINGS["timing_chunks"]:
        parser.error(
            f"--train-steps={args.train_steps} must be a multiple of the {SETTINGS['timing_chunks']} timing chunks"
        )
    settings = SETTINGS | {"train_steps": args.train_steps, "physics_impl": args.physics_impl}
    brax = args.brax_python or brax_python()
    saved = json.loads(args.results.read_text()) if args.results and args.results.exists() else {}

    def measured(key: str, measure: Callable[[], Any]) -> Any:
        """The saved result under `key`, else a new measurement, saved as soon as it ends."""
        if key not in saved:
            saved[key] = measure()
            if args.results:
                args.results.write_text(json.dumps(saved, indent=1))
        return saved[key]

    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    pythons = {"ksim": Path(sys.executable), "brax": brax}
    for round_index in range(args.rounds):
        for devices in args.devices:
            first = "ksim" if round_index % 2 == 0 else "brax"  # who takes the first turn alternates too
            key = f"x{devices}" + (f" #{round_index + 1}" if round_index else "")
            key += "" if args.physics_impl == "jax" else f" {args.physics_impl}"
            reports = measured(key, functools.partial(run_side_by_side, devices, settings, pythons, first))
            for framework, report in reports.items():
                runs.setdefault((framework, devices), []).append(report)
    # The same physics with nothing else, for reference.
    physics = measured("physics x1", lambda: physics_only_sps(Path(sys.executable))) if 1 in args.devices else None
    results = {key: median_report(reports) for key, reports in runs.items()}
    print_table(results, args.devices, physics)
    if args.rounds > 1:
        print_rounds(runs, args.devices)


if __name__ == "__main__":
    main()
