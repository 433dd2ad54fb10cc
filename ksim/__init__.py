"""ksim: RL tasks on MuJoCo MJX, trained with PPO on one device or on all of them."""

from ksim.xla_setup import cap_cpu_isa_at_avx2, keep_small_dots_off_ynnpack, quiet_cached_program_loads

# Before jaxlib loads (it reads the C++ log level once), and before any JAX backend exists: see README,
# "Supported JAX versions" and "Known issue: forced CPU devices".
quiet_cached_program_loads()
cap_cpu_isa_at_avx2()
keep_small_dots_off_ynnpack()

from ksim.distributed import avoid_cpu_lapack_deadlock  # noqa: E402

avoid_cpu_lapack_deadlock()

from ksim.quiet_imports import import_mjx_without_warp_noise  # noqa: E402

import_mjx_without_warp_noise()
