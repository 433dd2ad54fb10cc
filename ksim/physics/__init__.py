"""The physics implementations behind `ksim.engine.PhysicsEngine`, one module each, and `create_engine`
("auto", the default, is "mujoco" on CPU devices and "jax" on GPUs and TPUs).

- "jax": MJX's JAX implementation, its stages in ksim's order (ksim.physics.mjx_jax);
- "warp": MJX's Warp implementation, on a CUDA GPU or the CPU (ksim.physics.mjx_warp);
- "mujoco": C MuJoCo's batch API on the CPU, stepped through XLA FFI calls in C++ (ksim.physics.native,
  ksim.physics.native_ffi), or Python host callbacks where that extension is not built.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import mujoco
import numpy as np

from ksim.config import ConfigError
from ksim.engine import ModelLayout, PhysicsEngine
from ksim.physics.native import create_native

PHYSICS_IMPLS = ("auto", "jax", "warp", "mujoco")


def require_physics_impl(physics_impl: str) -> None:
    if physics_impl not in PHYSICS_IMPLS:
        choices = ", ".join(repr(impl) for impl in PHYSICS_IMPLS)
        raise ConfigError(f"physics_impl={physics_impl!r} must be one of {choices}")


def resolve_physics_impl(physics_impl: str, device: jax.Device) -> str:
    """'auto' is C MuJoCo ('mujoco') on a CPU device, MJX ('jax') on a GPU or TPU; any other name stays."""
    if physics_impl != "auto":
        return physics_impl
    return "mujoco" if device.platform == "cpu" else "jax"


def create_engine(
    mj_model: mujoco.MjModel,
    ctrl_dt: float,
    dt: float,
    base_body: str | None = None,
    root_joints: Sequence[str] | None = None,
    physics_impl: str = "auto",
    max_envs: int = 1,
) -> PhysicsEngine:
    """The engine of `physics_impl` for the model at timestep `dt`; ConfigError where it cannot run here or
    refuses the model (before anything compiles). `max_envs` is the most envs one call steps (Warp sizes its
    contact pool by it)."""
    require_physics_impl(physics_impl)
    # On this process's first device: the global device 0 belongs to process 0 in multi-process runs.
    device = jax.local_devices()[0]
    physics_impl = resolve_physics_impl(physics_impl, device)
    mj_model.opt.timestep = dt
    layout = ModelLayout.create(mj_model, base_body, root_joints)
    pose = np.asarray(layout.default_qpos, dtype=mj_model.qpos0.dtype)
    if physics_impl == "mujoco":
        return create_native(mj_model, ctrl_dt, dt, layout, pose)
    # MJX is imported here, not above: it takes half a second that a native run does not need.
    from ksim.physics import mjx_contract
    from ksim.physics.mjx_jax import MjxJaxEngine
    from ksim.physics.mjx_warp import MjxWarpEngine

    mjx_contract.require_impl(physics_impl, device)
    if physics_impl == "jax":
        mjx_contract.require_supported(mj_model)
    mjx_model = mjx_contract.put_model(mj_model, physics_impl, device=device)
    if physics_impl == "warp":
        return MjxWarpEngine(mj_model, ctrl_dt, dt, pose, layout, mjx_model, max_envs)
    return MjxJaxEngine(mj_model, ctrl_dt, dt, pose, layout, mjx_model)
