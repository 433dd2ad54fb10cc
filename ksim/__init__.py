"""ksim: RL tasks on MuJoCo MJX, trained with PPO on one device or on all of them.

Importing the package imports nothing of JAX (nor mujoco.mjx, which imports JAX), so a robot's runtime without
JAX can import ksim's JAX-free modules; the modules that use MJX import it through ksim.physics.mjx_import.
"""

from ksim.xla_setup import (
    avoid_cpu_lapack_deadlock,
    cap_cpu_isa_at_avx2,
    keep_small_dots_off_ynnpack,
    quiet_cached_program_loads,
)

# Before jaxlib loads (it reads the C++ log level once), and before any JAX backend exists: see
# docs/mjx.md (the JAX versions) and docs/multi-device.md ("Known issue: forced CPU devices").
quiet_cached_program_loads()
cap_cpu_isa_at_avx2()
keep_small_dots_off_ynnpack()
avoid_cpu_lapack_deadlock()
