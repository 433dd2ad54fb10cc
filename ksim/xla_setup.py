"""Process settings that must be in place before JAX starts (or before jaxlib loads); imports nothing of JAX."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 10, 2) for "0.10.2" or "0.10.2.dev20260101": the leading numeric parts."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def jaxlib_version_tuple(jaxlib_version: str | None = None) -> tuple[int, ...]:
    """The given jaxlib version (tests pass one), else the installed one, as a tuple."""
    return version_tuple(jaxlib_version or importlib.metadata.version("jaxlib"))


def quiet_cached_program_loads(jaxlib_version: str | None = None) -> None:
    """Sets TF_CPP_MIN_LOG_LEVEL=2 (errors only) on jaxlib < 0.10 unless it is set; must run before JAX starts.

    jaxlib 0.9 logs a WARNING line ("Assume version compatibility. PjRt-IFRT does not track XLA executable
    versions.") for every program it loads from the persistent compilation cache. Errors still show; the
    false ERROR lines of such loads are removed at their source (`cap_cpu_isa_at_avx2`).
    """
    if jaxlib_version_tuple(jaxlib_version) >= (0, 10):
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
    the CPU time went there (README, "Supported JAX versions"). Without them XLA emits those ops itself, as
    jaxlib 0.10.0 and 0.9.2 did.
    """
    if jaxlib_version_tuple(jaxlib_version) < (0, 10, 1):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_FUSION_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {YNN_FUSION_FLAG}=".strip()
