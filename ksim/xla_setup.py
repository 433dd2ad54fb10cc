"""Process settings that must be in place before JAX starts (or before jaxlib loads); imports nothing of JAX.

`import ksim` applies them; each only sets environment variables, so `import ksim` works without JAX
installed (a robot's runtime: numpy, mujoco, onnxruntime).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 10, 2) for "0.10.2" or "0.10.2.dev20260101": the leading numeric parts."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed_version(package: str) -> str | None:
    """The installed version of the distribution `package`; None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def jaxlib_version_tuple(jaxlib_version: str | None = None) -> tuple[int, ...]:
    """The given jaxlib version (tests pass one), else the installed one, as a tuple; () without jaxlib."""
    if jaxlib_version is None:
        jaxlib_version = installed_version("jaxlib")
        if jaxlib_version is None:  # a robot's runtime: ksim without JAX
            return ()
    return version_tuple(jaxlib_version)


def quiet_cached_program_loads(jaxlib_version: str | None = None) -> None:
    """Sets TF_CPP_MIN_LOG_LEVEL=2 (errors only) on jaxlib < 0.10 unless it is set; must run before JAX starts.

    jaxlib 0.9 logs a WARNING line ("Assume version compatibility. PjRt-IFRT does not track XLA executable
    versions.") for every program it loads from the persistent compilation cache. Errors still show; the
    false ERROR lines of such loads are removed at their source (`cap_cpu_isa_at_avx2`).
    """
    version = jaxlib_version_tuple(jaxlib_version)
    if not version or version >= (0, 10):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


MAX_ISA_FLAG = "--xla_cpu_max_isa"
X86_64 = ("x86_64", "amd64")


def cap_cpu_isa_at_avx2(machine: str | None = None) -> None:
    """Adds --xla_cpu_max_isa=AVX2 to XLA_FLAGS on x86-64 unless XLA_FLAGS names a max ISA; before JAX starts.

    With AVX-512 on, XLA:CPU adds the LLVM tuning attributes +prefer-no-gather/+prefer-no-scatter to every
    program's target and records them with the program. Loading it back from the persistent compilation
    cache checks each recorded attribute against the host's CPU features, which never list tuning
    attributes, and logs two ERROR lines per program (jax-ml/jax#38445, openxla/xla#44565), though the
    program loads and runs. Capped at AVX2, no AVX-512 feature is on and the attributes are not added; MJX
    steps as fast (docs/mjx.md, "Cached programs"). On CPUs without AVX-512 the cap turns no feature off.
    """
    if (machine or platform.machine()).lower() not in X86_64:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if MAX_ISA_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {MAX_ISA_FLAG}=AVX2".strip()


YNN_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type"


def keep_small_dots_off_ynnpack(jaxlib_version: str | None = None) -> None:
    """Turns XLA:CPU's YNNPACK fusions off (jaxlib >= 0.10.1) unless XLA_FLAGS already sets them; before JAX starts.

    From jaxlib 0.10.1 XLA:CPU hands batched dots and transposes to YNNPACK, whose packing and scheduling cost
    more than the work for MJX's tiny per-env matrices (6x6 in the hopper's solver loop): about a third of
    the CPU time went there (docs/mjx.md, the JAX versions). Without them XLA emits those ops itself, as
    jaxlib 0.10.0 and 0.9.2 did.
    """
    if jaxlib_version_tuple(jaxlib_version) < (0, 10, 1):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_FUSION_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {YNN_FUSION_FLAG}=".strip()


def requested_cpu_devices() -> int:
    """CPU devices asked for through XLA_FLAGS or JAX_NUM_CPU_DEVICES (1 when neither is set)."""
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    flag_count = int(match.group(1)) if match else 1
    return max(flag_count, int(os.environ.get("JAX_NUM_CPU_DEVICES", "1") or 1))


def _configured_pool_size() -> str | None:
    """The CPU thread-pool size set through the environment (PJRT_NPROC, else NPROC), if any."""
    return os.environ.get("PJRT_NPROC") or os.environ.get("NPROC")


def cpu_thread_pool_size() -> int:
    """Threads in XLA:CPU's intra-op pool: PJRT_NPROC or NPROC if set, else the usable CPUs."""
    configured = _configured_pool_size()
    return int(configured) if configured else len(os.sched_getaffinity(0))


def lapack_splits_batches(jaxlib_version: str | None = None) -> bool:
    """Whether jaxlib splits batched LAPACK calls over the CPU pool (0.10 and later): the deadlock below."""
    return jaxlib_version_tuple(jaxlib_version) >= (0, 10)


def avoid_cpu_lapack_deadlock() -> None:
    """Sizes the CPU thread pool above the forced device count; must run before JAX's CPU backend starts.

    jaxlib 0.10's batched LAPACK kernels (MJX's Cholesky) split big batches into chunks on the same pool
    they run on and wait for them; when every pool thread is a device program waiting, nothing runs the
    chunks and the process deadlocks. One thread more than there are devices is enough.
    """
    devices = requested_cpu_devices()
    if devices > 1 and not _configured_pool_size() and lapack_splits_batches():
        os.environ["PJRT_NPROC"] = str(max(len(os.sched_getaffinity(0)), devices + 1))
