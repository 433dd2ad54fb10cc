"""ksim side of benchmarks/vs_brax: examples/hopper.py:HopperTask with the shared settings.

python -m benchmarks.vs_brax.ksim_worker SETTINGS_JSON   # prints one JSON line; takes turns (turns.py) with Brax's
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
import time
from typing import Any

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from benchmarks.vs_brax.turns import Turns


def mirrored_components() -> list[list[Any]]:
    """HopperTask's components as brax_worker.py's env mirrors them (observations, rewards, terminations,
    resets; the settings in __main__'s MIRRORED)."""
    from ksim import observations as obs
    from ksim import rewards as rew
    from ksim import terminations as term
    from ksim.resets import RandomJointPositions, RandomJointVelocities

    return [
        [
            obs.BaseHeight(),
            obs.ProjectedGravity(),
            obs.JointPosition(),
            obs.BaseLinearVelocity(world=True, clip=10.0),
            obs.BaseAngularVelocity(scale=0.1, clip=10.0),
            obs.JointVelocity(scale=0.1, clip=10.0),
        ],
        [rew.StayAlive(scale=1.0), rew.ForwardProgress(scale=1.0), rew.ControlCost(scale=-1e-3)],
        [term.HealthyRange(min_height=0.8, max_pitch=0.2)],
        [RandomJointPositions(scale=0.005), RandomJointVelocities(scale=0.005)],
    ]


def component_changes(task: Any) -> list[str]:
    """The task's components that differ from what the Brax env mirrors, as `found != mirrored` (compared as
    values, so a new field whose default keeps the MDP as it was is no change)."""
    parts = (task.get_observations(), task.get_rewards(), task.get_terminations(), task.get_resets())
    changes = []
    for found, mirrored in zip(parts, mirrored_components(), strict=True):
        if list(found) != mirrored:
            changes.append(f"{list(found)!r} != {mirrored!r}")
    return changes


def main() -> None:
    import jax

    from examples.hopper import DEFAULT_CONFIG, HopperTask

    settings = json.loads(sys.argv[1])
    config = dataclasses.replace(
        DEFAULT_CONFIG,
        num_envs=settings["num_envs"],
        batch_size=settings["batch_size"],
        num_passes=settings["num_passes"],
        rollout_length_frames=settings["rollout_length"],
        ctrl_dt=settings["ctrl_dt"],
        dt=settings["dt"],
        episode_length_s=settings["episode_steps"] * settings["ctrl_dt"],
        num_steps=settings["train_steps"],
        learning_rate=settings["learning_rate"],
        gamma=settings["gamma"],
        gae_lambda=settings["gae_lambda"],
        clip_eps=settings["clip_eps"],
        value_clip_eps=settings["clip_eps"],
        entropy_coef=settings["entropy_coef"],
        max_grad_norm=settings["max_grad_norm"],
        init_log_std=settings["init_log_std"],
        actor_hidden=list(settings["hidden"]),
        critic_hidden=list(settings["hidden"]),
        seed=settings["seed"],
        physics_impl=settings.get("physics_impl", "auto"),
        compilation_cache_dir="",  # a cold compile on both sides (Brax keeps no persistent cache)
    )
    turns = Turns()
    turns.wait()  # until the parent starts the timed part
    start = turns.clock()
    task = HopperTask(config)
    state = task.init_train_state()
    chunk = settings["train_steps"] // settings["timing_chunks"]
    marks, cpu_marks = [], []
    for _ in range(settings["timing_chunks"]):  # like Brax's epochs: the first includes compilation
        for _ in range(chunk):
            state, metrics = task.train_step(state)
        jax.block_until_ready(metrics)
        marks.append(turns.clock())
        cpu_marks.append(time.process_time())
        turns.wait()
    steps_per_chunk = chunk * task.env_steps_per_train_step
    steady = statistics.median(steps_per_chunk / (b - a) for a, b in itertools.pairwise(marks))
    cpu_per_chunk = statistics.median(b - a for a, b in itertools.pairwise(cpu_marks))
    returns = task.evaluate(
        task.fetch_replicated(state.shared), settings["eval_episodes"], settings["seed"] + 1
    ).returns
    result = {
        "steady_sps": steady,
        "compile_s": marks[-1] - start - len(marks) * steps_per_chunk / steady,
        "steps_per_cpu_s": steps_per_chunk / cpu_per_chunk,
        "return": float(returns.mean()),
        "env_steps": settings["train_steps"] * task.env_steps_per_train_step,
        "jax": jax.__version__,
        "devices": task.num_devices,
        "component_changes": component_changes(task),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
