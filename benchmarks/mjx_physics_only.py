"""MJX physics throughput alone (no policy, no resets, no framework), to compare JAX versions.

    python benchmarks/mjx_physics_only.py ksim/assets/hopper.xml 256     # MODEL.xml [num_envs] [substeps]

N envs x 32 control steps x S substeps of `mjx.step` with random controls, timed after compilation. It
imports neither ksim nor anything of this project, so the same file runs in any environment with jax and
mujoco-mjx; XLA_FLAGS apply as given (ksim's own defaults, such as the YNNPACK setting, do not).
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import mujoco
from mujoco import mjx

CONTROL_STEPS = 32
TIMED_ROLLOUTS = 5


def main() -> None:
    model_path = sys.argv[1]
    num_envs = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    substeps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    mj_model = mujoco.MjModel.from_xml_path(model_path)
    model = mjx.put_model(mj_model, impl="jax")

    def control_step(data: mjx.Data, key: jax.Array) -> mjx.Data:
        ctrl = jax.random.uniform(key, (mj_model.nu,), minval=-1.0, maxval=1.0)
        return jax.lax.fori_loop(0, substeps, lambda _, d: mjx.step(model, d.replace(ctrl=ctrl)), data)

    @jax.jit
    def rollout(data: mjx.Data, key: jax.Array) -> mjx.Data:
        def body(data: mjx.Data, step_key: jax.Array) -> tuple[mjx.Data, None]:
            return jax.vmap(control_step)(data, jax.random.split(step_key, num_envs)), None

        return jax.lax.scan(body, data, jax.random.split(key, CONTROL_STEPS))[0]

    data = jax.jit(jax.vmap(lambda _: mjx.forward(model, mjx.make_data(model, impl="jax"))))(jnp.arange(num_envs))
    start = time.perf_counter()
    data = jax.block_until_ready(rollout(data, jax.random.PRNGKey(0)))
    compile_s = time.perf_counter() - start
    wall, cpu = [], []
    for i in range(TIMED_ROLLOUTS):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        data = jax.block_until_ready(rollout(data, jax.random.PRNGKey(i + 1)))
        wall.append(time.perf_counter() - wall_start)
        cpu.append(time.process_time() - cpu_start)
    steps = num_envs * CONTROL_STEPS
    print(
        f"jax {jax.__version__}: compile+first {compile_s:.1f} s, control steps/s median "
        f"{steps / statistics.median(wall):.0f} best {steps / min(wall):.0f}, "
        f"CPU us per control step median {1e6 * statistics.median(cpu) / steps:.1f}"
    )


if __name__ == "__main__":
    main()
