"""Imports whose only output would be about an optional package that is known to be absent."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import sys

# What `mujoco.mjx` prints (on stdout, at import) when warp-lang, which only physics_impl='warp' needs, is missing.
MISSING_WARP_LINES = (
    "Failed to import warp: No module named 'warp'",
    "Failed to import mujoco_warp: No module named 'warp'",
)


def import_mjx_without_warp_noise() -> None:
    """Imports `mujoco.mjx`; without warp-lang, drops MJX's two lines saying so and passes on any other output.

    With warp-lang installed nothing is captured. physics_impl='warp' without it is refused with its own
    message (ksim.mjx_contract.require_impl).
    """
    if importlib.util.find_spec("warp") is not None or "mujoco.mjx" in sys.modules:
        importlib.import_module("mujoco.mjx")
        return
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        importlib.import_module("mujoco.mjx")
    other = [line for line in captured.getvalue().splitlines() if line not in MISSING_WARP_LINES]
    if other:
        print("\n".join(other))
