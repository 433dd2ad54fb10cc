"""`mujoco.mjx`, imported quietly: ksim's modules write `from ksim.physics.mjx_import import mjx`, not `mujoco.mjx`.

Without warp-lang, importing `mujoco.mjx` prints two lines saying so; importing it here first drops them
wherever ksim loads MJX first. `import ksim` itself does not import MJX (it imports JAX), so ksim's JAX-free
modules import without JAX.
"""

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
    message (ksim.physics.mjx_contract.require_impl).
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


import_mjx_without_warp_noise()

from mujoco import mjx  # noqa: E402  (loaded quietly just above; this only binds the name)

__all__ = ["mjx"]
