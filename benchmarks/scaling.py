"""Throughput of PPOTask vs DistributedPPOTask on 1, 2 and 4 forced devices, from one run.

    .venv/bin/python -m benchmarks.scaling                # tiny (cart-pole) and walking tasks
    .venv/bin/python -m benchmarks.scaling --tasks tiny --rounds 5

The device count must be fixed before JAX starts, so each device count runs in its own worker process;
inside the 1-device worker PPOTask and DistributedPPOTask(num_devices=1) alternate round by round, so
their ratio is measured side by side. Prints env-steps/s (median over rounds), the ratio to PPOTask,
compile time (first train step) and what the replicated-state check costs at its default period.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVICE_COUNTS = (1, 2, 4)
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},  # the cart-pole example's own CPU-sized defaults: 64 envs x 64 steps
    "walking": {
        "num_envs": 16,
        "batch_size": 8,
        "rollout_length_frames": 16,
        "actor_hidden": [128, 128],
        "critic_hidden": [128, 128],
    },
}


def make_task(kind: str, num_devices: int | None) -> Any:
    """PPOTask when `num_devices` is None, else DistributedPPOTask on that many devices."""
    from examples.cartpole import DEFAULT_CONFIG as CARTPOLE
    from examples.cartpole import CartpoleTask
    from examples.walking import DEFAULT_CONFIG as WALKING
    from examples.walking import WalkingTask
    from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask

    base_task, base_config = (CartpoleTask, CARTPOLE) if kind == "tiny" else (WalkingTask, WALKING)
    settings = {**dataclasses.asdict(base_config), **SIZES[kind]}
    if num_devices is None:
        return base_task(type(base_config)(**settings))

    config_type = dataclasses.make_dataclass("Config", [], bases=(type(base_config), DistributedPPOConfig))
    task_type = type("DistributedTask", (base_task, DistributedPPOTask), {})
    return task_type(config_type(**settings, num_devices=num_devices))


def timed_steps(task: Any, state: Any, steps: int) -> tuple[Any, float]:
    import jax

    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = task.train_step(state)
    jax.block_until_ready(metrics)
    return state, task.env_steps_per_train_step * steps / (time.perf_counter() - start)


def side_by_side(
    tasks: dict[str, Any], rounds: int, steps: int, warmup_steps: int = 1
) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Each task's first train step (compile_s) and its median env-steps/s over `rounds` rounds of `steps` train
    steps, the tasks taking turns within each round so that load changes hit them alike; and each task's last
    train state."""
    import jax

    states, rates, report = {}, {name: [] for name in tasks}, {}
    for name, task in tasks.items():
        start = time.perf_counter()
        state, metrics = task.train_step(task.init_train_state())
        jax.block_until_ready(metrics)
        report[name] = {"compile_s": time.perf_counter() - start}
        states[name], _ = timed_steps(task, state, warmup_steps)
    for _ in range(rounds):
        for name, task in tasks.items():
            states[name], rate = timed_steps(task, states[name], steps)
            rates[name].append(rate)
    for name in tasks:
        report[name]["env_steps_per_s"] = statistics.median(rates[name])
    return report, states


def worker(kind: str, devices: int, rounds: int, steps: int) -> dict[str, Any]:
    """Measures every variant that runs on `devices` forced devices; returns a JSON-able report."""
    variants: dict[str, int | None] = {f"DistributedPPOTask x{devices}": devices}
    if devices == 1:
        variants = {"PPOTask": None, **variants}
    tasks = {name: make_task(kind, num_devices) for name, num_devices in variants.items()}
    report, states = side_by_side(tasks, rounds, steps, warmup_steps=2)
    for name, task in tasks.items():
        entry: dict[str, Any] = report[name]
        entry["step_s"] = task.env_steps_per_train_step / entry["env_steps_per_s"]
        if hasattr(task, "check_replicas"):
            task.check_replicas(states[name], step=0)  # compile
            start = time.perf_counter()
            for _ in range(10):
                task.check_replicas(states[name], step=0)
            check_s = (time.perf_counter() - start) / 10
            period = task.config.consistency_check_every_n_steps
            entry["check_ms"] = 1000 * check_s
            entry["check_cost_pct"] = 100 * check_s / (period * entry["step_s"])
    return report


def run_worker(kind: str, devices: int, rounds: int, steps: int) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    command = [
        sys.executable,
        "-m",
        "benchmarks.scaling",
        "--worker",
        kind,
        str(devices),
        str(rounds),
        str(steps),
    ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"worker {kind} x{devices} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def print_table(kind: str, results: dict[str, Any]) -> None:
    baseline = results["PPOTask"]["env_steps_per_s"]
    print(f"\n{kind} task: {SIZES[kind] or 'cart-pole defaults (64 envs x 64 steps)'}")
    print(f"{'variant':<24}{'env-steps/s':>14}{'vs PPOTask':>12}{'compile s':>11}{'check ms':>10}{'check cost':>12}")
    for name, entry in results.items():
        check_ms = f"{entry['check_ms']:.2f}" if "check_ms" in entry else "-"
        check_cost = f"{entry['check_cost_pct']:.3f}%" if "check_cost_pct" in entry else "-"
        print(
            f"{name:<24}{entry['env_steps_per_s']:>14.0f}{entry['env_steps_per_s'] / baseline:>12.3f}"
            f"{entry['compile_s']:>11.1f}{check_ms:>10}{check_cost:>12}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)

        kind, devices, rounds, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(worker(kind, devices, rounds, steps)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=sorted(SIZES), default=["tiny", "walking"])
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved timing rounds (median is reported).")
    parser.add_argument("--steps", type=int, default=5, help="Train steps per timing round.")
    args = parser.parse_args()
    for kind in args.tasks:
        results: dict[str, Any] = {}
        for devices in DEVICE_COUNTS:
            results |= run_worker(kind, devices, args.rounds, args.steps)
        print_table(kind, results)


if __name__ == "__main__":
    main()
