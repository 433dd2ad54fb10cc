"""Process settings that must be in place before jaxlib loads; imports nothing of JAX."""

from __future__ import annotations

import importlib.metadata
import os
import re


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 10, 2) for "0.10.2" or "0.10.2.dev20260101": the leading numeric parts."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def quiet_cached_program_loads(jaxlib_version: str | None = None) -> None:
    """Sets TF_CPP_MIN_LOG_LEVEL=3 on jaxlib < 0.10 unless it is set; must run before JAX starts.

    jaxlib 0.9's XLA:CPU logs a false "machine type ... doesn't match" ERROR, with the full CPU feature list,
    for every program it loads from the persistent compilation cache on the machine that compiled it (it
    counts the tuning attributes +prefer-no-gather/+prefer-no-scatter as missing CPU features), which buries
    a warm start's output. Errors that matter still reach Python as exceptions.
    """
    if version_tuple(jaxlib_version or importlib.metadata.version("jaxlib")) >= (0, 10):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
