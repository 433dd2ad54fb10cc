"""Process settings that must be in place before JAX starts (or before jaxlib loads); imports nothing of JAX."""

from __future__ import annotations

import importlib.metadata
import os
import re


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 10, 2) for "0.10.2" or "0.10.2.dev20260101": the leading numeric parts."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def jaxlib_version_tuple(jaxlib_version: str | None = None) -> tuple[int, ...]:
    """The given jaxlib version (tests pass one), else the installed one, as a tuple."""
    return version_tuple(jaxlib_version or importlib.metadata.version("jaxlib"))


def quiet_cached_program_loads(jaxlib_version: str | None = None) -> None:
    """Sets TF_CPP_MIN_LOG_LEVEL=3 on jaxlib < 0.10 unless it is set; must run before JAX starts.

    jaxlib 0.9's XLA:CPU logs a false "machine type ... doesn't match" ERROR, with the full CPU feature list,
    for every program it loads from the persistent compilation cache on the machine that compiled it (it
    counts the tuning attributes +prefer-no-gather/+prefer-no-scatter as missing CPU features), which buries
    a warm start's output. Errors that matter still reach Python as exceptions.
    """
    if jaxlib_version_tuple(jaxlib_version) >= (0, 10):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


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
