"""physics_impl='mujoco' (C MuJoCo) against 'jax' (MJX) on the bundled examples, side by side in one process.

    .venv/bin/python -m benchmarks.native_vs_mjx                        # hopper, quadruped, humanoid
    .venv/bin/python -m benchmarks.native_vs_mjx --tasks hopper --repeats 5

For each task, with the example's CPU config (its envs, rollout length and actuators, one device) and each
implementation: the cold start (building the task, its first train step, compilation included, with no
compilation cache), then timed repeats that alternate between the implementations (jax, mujoco, mujoco, jax,
...), each one of:
- physics: `rollout_length` control steps of the envs through the engine alone, random actions through the
  task's actuators (its PD loop at every substep where it has one);
- rollout: the task's rollout (policy, physics, observations, rewards, resets);
- train step: rollout and update; with 'mujoco', also the time its physics callbacks took inside it (the
  engine's `host_clock`: the same envs' physics, from the states and actions of training).
Figures are medians over the repeats; the update's share is the train step's time minus the rollout's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from benchmarks.train_step_split import (
    Timings,
    compile_rollout,
    empty_timings,
    first_train_step,
    one_device,
    repeat,
    split,
)

IMPLS = ("jax", "mujoco")


def example(name: str) -> tuple[type, Any]:
    if name == "hopper":
        from examples.hopper import DEFAULT_CONFIG, HopperTask

        return HopperTask, DEFAULT_CONFIG
    if name == "quadruped":
        from examples.quadruped import DEFAULT_CONFIG as QUADRUPED_CONFIG
        from examples.quadruped import QuadrupedTask

        return QuadrupedTask, QUADRUPED_CONFIG
    from examples.walking import CPU_CONFIG, WalkingTask

    return WalkingTask, CPU_CONFIG


def physics_program(task: Any) -> Callable[[Any, Any], Any]:
    """`rollout_length` control steps of every env through the engine, random actions through the actuators."""
    import jax

    engine, actuators = task.engine, task.actuators
    steps = task.config.rollout_length_frames

    def one_env(data: Any, key: Any) -> Any:
        def control_step(data: Any, step_key: Any) -> tuple[Any, None]:
            action = jax.random.uniform(step_key, (engine.action_dim,), minval=-1.0, maxval=1.0)
            return engine.step(data, lambda d: actuators.ctrl(action, d, {}))[0], None

        return jax.lax.scan(control_step, data, jax.random.split(key, steps))[0]

    @jax.jit
    def run(data: Any, key: Any) -> Any:
        return jax.vmap(one_env)(data, jax.random.split(key, task.config.num_envs))

    return run


def start_data(task: Any) -> Any:
    import jax
    import jax.numpy as jnp

    engine, envs = task.engine, task.config.num_envs
    qpos = jnp.tile(jnp.asarray(engine.default_qpos, jnp.float32), (envs, 1))
    return jax.jit(jax.vmap(engine.make_data))(qpos, jnp.zeros((envs, engine.mj_model.nv)))


@dataclasses.dataclass
class Runner:
    """One implementation's task, state, physics program and timings."""

    task: Any
    state: Any
    cold_start_s: float
    physics_first_s: float
    physics: Callable[[Any, Any], Any]
    data: Any
    timings: Timings  # the rollout, the train step and its physics calls (train_step_split's)
    physics_alone: list[float] = dataclasses.field(default_factory=list)

    def repeat(self, index: int) -> None:
        import jax

        start = time.perf_counter()
        self.data = jax.block_until_ready(self.physics(self.data, jax.random.PRNGKey(index)))
        self.physics_alone.append(time.perf_counter() - start)
        self.state = repeat(self.task, self.state, self.timings)


def build(task_class: type, config: Any, impl: str) -> Runner:
    import jax

    start = time.perf_counter()
    task = task_class(one_device(config, physics_impl=impl, compilation_cache_dir=""))
    state = first_train_step(task)
    cold = time.perf_counter() - start
    physics, data = physics_program(task), start_data(task)
    start = time.perf_counter()
    data = jax.block_until_ready(physics(data, jax.random.PRNGKey(0)))
    physics_first = time.perf_counter() - start
    compile_rollout(task, state)
    return Runner(task, state, cold, physics_first, physics, data, empty_timings(task))


def report(name: str, runners: dict[str, Runner]) -> None:
    task = runners["jax"].task
    envs, frames = task.config.num_envs, task.config.rollout_length_frames
    env_steps = envs * frames
    print(f"\n{name}: {envs} envs x {frames} control steps ({task.engine.num_substeps} substeps each), 1 device")
    print(
        "| physics_impl | cold start to first train step (s) | physics first call (s) | physics env-steps/s "
        "| rollout env-steps/s | train env-steps/s | train step / physics alone | train step / its own physics "
        "| update share |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    physics_alone = {impl: statistics.median(runner.physics_alone) for impl, runner in runners.items()}
    rows = {impl: split(runner.timings) for impl, runner in runners.items()}
    for impl, runner in runners.items():
        row = rows[impl]
        own = "-" if row.physics_s is None else f"{row.train_s / row.physics_s:.2f}"
        print(
            f"| {impl} | {runner.cold_start_s:.1f} | {runner.physics_first_s:.1f} "
            f"| {env_steps / physics_alone[impl]:,.0f} | {env_steps / row.rollout_s:,.0f} "
            f"| {row.env_steps_per_s:,.0f} | {row.train_s / physics_alone[impl]:.2f} | {own} "
            f"| {row.update_s / row.train_s:.0%} |"
        )
    print(f"mujoco / jax, physics env-steps/s: {physics_alone['jax'] / physics_alone['mujoco']:.2f}x")
    print(f"mujoco / jax, train env-steps/s: {rows['jax'].train_s / rows['mujoco'].train_s:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["hopper", "quadruped", "humanoid"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for name in args.tasks:
        task_class, config = example(name)
        runners = {impl: build(task_class, config, impl) for impl in IMPLS}
        for index in range(args.repeats):
            order = IMPLS if index % 2 == 0 else IMPLS[::-1]
            for impl in order:
                runners[impl].repeat(index + 1)
        report(name, runners)


if __name__ == "__main__":
    main()
