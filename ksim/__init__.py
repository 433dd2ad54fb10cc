"""ksim: RL tasks on MuJoCo MJX, trained with PPO on one device or on all of them."""

from ksim.distributed import avoid_cpu_lapack_deadlock, keep_small_dots_off_ynnpack

# Before any JAX backend exists: see README, "Known issue: forced CPU devices" and "Supported JAX versions".
avoid_cpu_lapack_deadlock()
keep_small_dots_off_ynnpack()
