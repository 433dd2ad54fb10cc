"""Two speed figures of issue 6, each measured side by side in one run:

1. Rollout throughput with pooled episode starts (one batched reset per rollout, more only where an env
   ends twice) against a full reset computed for every env at every control step (ksim before the pool).
2. Time to the first log line of `python -m examples.cartpole`: a first start with an empty compilation
   cache, then a second start of the same command (cache hit), alternating over rounds.

    .venv/bin/python -m benchmarks.startup_and_resets [--rounds 3]
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

import ksim  # noqa: F401  (before JAX starts: its process settings, e.g. the log level of cached program loads)

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = {"num_envs": 256, "rollout_length_frames": 64, "batch_size": 64}


def per_step_reset_task(base: type) -> type:
    """The task as before the pool: a full reset (a whole `mjx.forward`) computed for every env at every
    control step, kept where an episode ended."""
    import jax
    import jax.numpy as jnp

    from ksim.engine import PhysicsEngine
    from ksim.physics.mjx_jax import MjxJaxEngine
    from ksim.task.env_pool import EnvPool, select_envs

    class WholeForwardEngine(MjxJaxEngine):
        @property
        def has_acceleration_sensors(self) -> bool:
            return True  # makes `make_data` run the whole mjx.forward, as every reset did then

    class PerStepResetPool(EnvPool):
        def refill_if(self, needed: Any, env: Any) -> Any:
            keys = jax.vmap(jax.random.fold_in)(env.reset_key, env.episodes_started)
            fresh = jax.vmap(self.environment.start_episode)(keys)
            next_start = select_envs(env.next_start_ready, env.next_start, fresh)
            return env.replace(next_start=next_start, next_start_ready=jnp.ones_like(env.next_start_ready))

    class PerStepReset(base):  # type: ignore[misc, valid-type]
        def get_engine(self) -> PhysicsEngine:
            engine = super().get_engine()
            fields = {field.name: getattr(engine, field.name) for field in dataclasses.fields(engine)}
            return WholeForwardEngine(**fields)

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.env_pool = PerStepResetPool(self.environment, self.terrain_use)

    return PerStepReset


def rollout_rate(task: Any, state: Any, rollouts: int) -> float:
    import jax

    env = state.env
    start = time.perf_counter()
    for _ in range(rollouts):
        env, trajectory, _ = task.programs["rollout"](state.shared, env)
    jax.block_until_ready(trajectory)
    return task.env_steps_per_train_step * rollouts / (time.perf_counter() - start)


def trained_shared(config: Any) -> Any:
    """Shared state after the cart-pole example's documented training (episodes then last 500 steps)."""
    from examples.cartpole import DEFAULT_CONFIG, CartpoleTask

    with tempfile.TemporaryDirectory() as run_dir:
        task = CartpoleTask(dataclasses.replace(DEFAULT_CONFIG, run_dir=run_dir, log_every_n_steps=40))
        return task.fetch_replicated(task.run().shared)


def resets(rounds: int) -> None:
    import jax

    from examples.cartpole import DEFAULT_CONFIG, CartpoleTask

    config = dataclasses.replace(DEFAULT_CONFIG, **ROLLOUT)
    tasks = {"pooled starts": CartpoleTask(config), "reset every step": per_step_reset_task(CartpoleTask)(config)}
    policies = {"untrained (episodes ~15 steps)": None, "trained (episodes 500 steps)": trained_shared(config)}
    print(f"\ncart-pole rollouts, {ROLLOUT['num_envs']} envs x {ROLLOUT['rollout_length_frames']} steps")
    print("| policy | variant | env-steps/s (median) | ratio |\n|---|---|---:|---:|")
    for policy, shared in policies.items():
        states = {name: task.init_train_state(shared) for name, task in tasks.items()}
        for name, task in tasks.items():  # compile, and let episodes spread out
            jax.block_until_ready(task.programs["rollout"](states[name].shared, states[name].env))
        rates: dict[str, list[float]] = {name: [] for name in tasks}
        for _ in range(rounds):
            for name, task in tasks.items():
                rates[name].append(rollout_rate(task, states[name], 5))
        base = statistics.median(rates["reset every step"])
        for name, values in rates.items():
            print(f"| {policy} | {name} | {statistics.median(values):.0f} | {statistics.median(values) / base:.2f} |")


def first_log_line_s(cache_dir: str) -> float:
    """Seconds from starting the cart-pole example to its first `step` line."""
    command = [sys.executable, "-m", "examples.cartpole", f"compilation_cache_dir={cache_dir}", "num_steps=5"]
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        process = subprocess.Popen(
            [*command, f"run_dir={run_dir}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None
        elapsed = float("nan")
        for line in process.stdout:
            if line.startswith("step "):
                elapsed = time.perf_counter() - start
                break
        process.kill()
        process.wait()
    return elapsed


def startup(rounds: int) -> None:
    first, second = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            first.append(first_log_line_s(cache))
            second.append(first_log_line_s(cache))
    print("\n`python -m examples.cartpole`: seconds to the first log line")
    print("| start | seconds (median) | all rounds |\n|---|---:|---|")
    for name, values in (("first (empty cache)", first), ("second (cache hit)", second)):
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print(f"second / first: {statistics.median(second) / statistics.median(first):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("resets", "startup"), default=None)
    args = parser.parse_args()
    if args.only != "startup":
        resets(args.rounds)
    if args.only != "resets":
        startup(args.rounds)


if __name__ == "__main__":
    main()
