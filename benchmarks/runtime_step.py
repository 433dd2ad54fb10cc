"""What one control step of ksim.runtime costs on this CPU: observation from raw readings, the ONNX policy, targets.

    .venv/bin/python -m benchmarks.runtime_step [--task spot] [--steps 5000]

Exports the task's initial policy (the network's size is what matters) to a temporary folder, reads a recorded
sequence of MuJoCo states as the robot's readings (ksim.sim2sim's reader, outside the timing) and times
`PolicyRuntime.step` over them, one thread for onnxruntime as on a robot's control core.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jax
import mujoco
import numpy as np

from ksim.deploy.onnx import export_policy
from ksim.modes.export import exported_policy, robot_side, task_identity
from ksim.runtime import PolicyRuntime
from ksim.sim2sim import MujocoReader

TASKS = {"spot": "examples.spot:SpotTask", "quadruped": "examples.quadruped:QuadrupedTask"}


def build(task: str) -> object:
    import importlib

    module, _, name = TASKS[task].partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name)(loaded.DEFAULT_CONFIG)


def recorded_readings(policy: Path, runtime: PolicyRuntime, count: int) -> list[dict[str, np.ndarray]]:
    """Readings of `count` states of the model falling from its start pose under zero control."""
    model = mujoco.MjModel.from_binary_path(str(policy.with_suffix(".mjb")))
    data, reader = mujoco.MjData(model), MujocoReader(model, runtime.spec)
    data.qpos[:] = runtime.spec.start_qpos
    command = np.array([0.5, 0.0, 0.1], np.float32)[: runtime.spec.readings().get("command", 0)]
    readings = []
    for _ in range(count):
        mujoco.mj_step(model, data)
        readings.append(reader.read(model, data, command))
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="spot")
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    task = build(args.task)
    shared = task.init_shared(jax.random.PRNGKey(0))  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as folder:
        policy = Path(folder) / "policy.onnx"
        export_policy(
            exported_policy(task, shared),  # type: ignore[arg-type]
            task.checkpoints.metadata,  # type: ignore[attr-defined]
            "",
            policy,
            robot=robot_side(task),  # type: ignore[arg-type]
            task=task_identity(task, policy.parent),  # type: ignore[arg-type]
        )
        runtime = PolicyRuntime.load(policy)
        readings = recorded_readings(policy, runtime, args.steps)
        for reading in readings[:200]:  # warm-up
            runtime.step(reading)
        runtime.reset()
        observe, step = [], []
        for reading in readings:
            start = time.perf_counter()
            runtime.observation(reading)
            middle = time.perf_counter()
            runtime.step(reading)
            step.append(time.perf_counter() - middle)
            observe.append(middle - start)
    spec = runtime.spec
    hidden = list(task.config.actor_hidden)  # type: ignore[attr-defined]
    inputs = f"{spec.observation_size} inputs from {len(spec.readings())} readings"
    print(f"{args.task}: {inputs}, {spec.action_size} actions, actor {hidden}; {args.steps} steps")
    for name, times in (("step (observation + ONNX + targets)", step), ("observation alone", observe)):
        ms = np.asarray(times) * 1e3
        print(f"  {name}: median {np.median(ms):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms, max {ms.max():.3f} ms")


if __name__ == "__main__":
    main()
