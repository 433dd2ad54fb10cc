"""`mujoco.mjx` for ksim's modules: they write `from ksim.mjx_import import mjx`, never `from mujoco import mjx`.

Without warp-lang, importing `mujoco.mjx` prints two lines saying so; importing it here first, through
`ksim.quiet_imports`, drops them wherever ksim loads MJX first. `import ksim` itself does not import MJX (it
imports JAX), so ksim's JAX-free modules import without JAX.
"""

from ksim.quiet_imports import import_mjx_without_warp_noise

import_mjx_without_warp_noise()

from mujoco import mjx  # noqa: E402  (loaded quietly just above; this only binds the name)

__all__ = ["mjx"]
