"""ksim: RL tasks on MuJoCo MJX, trained with PPO on one device or on all of them."""

from ksim.xla_setup import quiet_cached_program_loads

# Before jaxlib loads (it reads the C++ log level once): see README, "Supported JAX versions".
quiet_cached_program_loads()

from ksim.distributed import avoid_cpu_lapack_deadlock, keep_small_dots_off_ynnpack  # noqa: E402

# Before any JAX backend exists: see README, "Known issue: forced CPU devices" and "Supported JAX versions".
avoid_cpu_lapack_deadlock()
keep_small_dots_off_ynnpack()
