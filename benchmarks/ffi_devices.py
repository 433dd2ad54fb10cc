"""The native engine's physics on one CPU device against two forced ones (issue 37), on the FFI path and on the
Python-callback path, each in a process of its own (the device count is fixed when JAX starts).

The hopper, 128 envs x 32 control steps with a control that reads the state (one host call per substep): one
device steps all envs (batches of `cores` threads), two devices 64 each under pmap (batches of `cores / 2`
threads). Per process: the median time of the whole program, of one shard's envs alone, and the host calls'
seconds summed over the shards divided by the wall time (above 1: the shards' host calls overlapped).

    .venv/bin/python -m benchmarks.ffi_devices [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS, STEPS = 128, 32


def measure(devices: int, repeats: int) -> str:
    """One line of figures for this process's devices and path (run inside the child process)."""
    import jax
    import jax.numpy as jnp

    from ksim.engine import load_mujoco_model
    from ksim.physics import create_engine
    from ksim.physics.native import FfiCalls

    engine = create_engine(load_mujoco_model("hopper.xml"), 0.02, 0.005, physics_impl="mujoco")
    assert jax.local_device_count() == devices
    per = ENVS // devices

    def shard(data: Any, key: jax.Array) -> Any:
        def one(data: Any, key: jax.Array) -> Any:
            def step(d: Any, k: jax.Array) -> tuple[Any, None]:
                action = jax.random.uniform(k, (engine.action_dim,), minval=-1, maxval=1)
                return engine.step(d, lambda d: jnp.clip(action - 0.1 * d.qvel[3:], -1, 1))[0], None

            return jax.lax.scan(step, data, jax.random.split(key, STEPS))[0]

        return jax.vmap(one)(data, jax.random.split(key, per))

    qpos = jnp.tile(jnp.asarray(engine.default_qpos, jnp.float32), (per, 1))
    start = jax.vmap(engine.make_data)(qpos, jnp.zeros((per, engine.mj_model.nv)))
    one_shard = jax.jit(shard)
    if devices == 1:
        run, data = one_shard, start
    else:
        run, data = jax.pmap(shard), jax.device_put_replicated(start, jax.local_devices())

    def keys(index: int) -> jax.Array:
        key = jax.random.PRNGKey(index)
        return key if devices == 1 else jax.random.split(key, devices)

    jax.block_until_ready((run(data, keys(0)), one_shard(start, jax.random.PRNGKey(0))))
    whole, alone, overlap = [], [], []
    for index in range(1, repeats + 1):
        host = engine.host_clock.seconds
        began = time.perf_counter()
        jax.block_until_ready(run(data, keys(index)))
        whole.append(time.perf_counter() - began)
        overlap.append((engine.host_clock.seconds - host) / whole[-1])
        began = time.perf_counter()
        jax.block_until_ready(one_shard(start, jax.random.PRNGKey(index)))
        alone.append(time.perf_counter() - began)
    program, shard_alone = statistics.median(whole), statistics.median(alone)
    path = "ffi" if isinstance(engine.transport, FfiCalls) else "callback"
    return (
        f"| {path} | {devices} | {engine.nthread} | {1e3 * program:.1f} "
        f"| {ENVS * STEPS / program:,.0f} | {1e3 * shard_alone:.1f} | {program / shard_alone:.2f} "
        f"| {statistics.median(overlap):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.child, args.repeats), flush=True)
        return
    print(
        "| path | devices | threads per batch | program (ms) | env-steps/s | one shard alone (ms) | program / shard "
        "| host seconds / wall |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in ("ffi", "callback"):
        for devices in (1, 2):
            env = dict(os.environ)
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
            if path == "callback":
                env["KSIM_NATIVE_FFI"] = "0"
            else:
                env.pop("KSIM_NATIVE_FFI", None)
            command = [
                sys.executable,
                "-m",
                "benchmarks.ffi_devices",
                f"--child={devices}",
                f"--repeats={args.repeats}",
            ]
            result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            print(result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
