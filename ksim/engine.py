"""MuJoCo MJX physics: model loading, resets and control steps made of physics substeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct
from mujoco import mjx

Array = jax.Array
ASSETS_DIR = Path(__file__).parent / "assets"


def load_mujoco_model(path: str | Path) -> mujoco.MjModel:
    """Loads an MJCF file; a bare file name is looked up in ksim's bundled assets."""
    candidate = Path(path)
    if not candidate.exists() and (ASSETS_DIR / candidate).exists():
        candidate = ASSETS_DIR / candidate
    if not candidate.exists():
        raise FileNotFoundError(f"MJCF model {path!s} not found (also looked in {ASSETS_DIR})")
    return mujoco.MjModel.from_xml_path(str(candidate))


def rotate_inverse(quat: Array, vec: Array) -> Array:
    """Rotates a world-frame vector into the frame of a (w, x, y, z) unit quaternion."""
    w, xyz = quat[0], quat[1:]
    t = 2.0 * jnp.cross(xyz, vec)
    return vec - w * t + jnp.cross(xyz, t)


class StepContext(struct.PyTreeNode):
    """What components see of one env after a control step (unbatched)."""

    data: mjx.Data
    action: Array
    last_action: Array
    ctrl: Array
    free_joint: bool = struct.field(pytree_node=False, default=True)

    @property
    def joint_pos(self) -> Array:
        """Positions of the non-root joints."""
        return self.data.qpos[7:] if self.free_joint else self.data.qpos

    @property
    def joint_vel(self) -> Array:
        return self.data.qvel[6:] if self.free_joint else self.data.qvel

    @property
    def base_pos(self) -> Array:
        return self.data.qpos[:3] if self.free_joint else jnp.zeros(3)

    @property
    def base_quat(self) -> Array:
        return self.data.qpos[3:7] if self.free_joint else jnp.array([1.0, 0.0, 0.0, 0.0])

    @property
    def projected_gravity(self) -> Array:
        """Unit gravity direction in the base frame: (0, 0, -1) when upright."""
        return rotate_inverse(self.base_quat, jnp.array([0.0, 0.0, -1.0]))

    @property
    def base_lin_vel(self) -> Array:
        """Base linear velocity in the base frame (a free joint's qvel[:3] is in the world frame)."""
        return rotate_inverse(self.base_quat, self.data.qvel[:3]) if self.free_joint else jnp.zeros(3)

    @property
    def base_lin_vel_world(self) -> Array:
        return self.data.qvel[:3] if self.free_joint else jnp.zeros(3)

    @property
    def base_ang_vel(self) -> Array:
        """Base angular velocity in the base frame (how MuJoCo stores it for free joints)."""
        return self.data.qvel[3:6] if self.free_joint else jnp.zeros(3)


@dataclass(frozen=True)
class PhysicsEngine:
    """An MJX model stepped at `ctrl_dt`, each control step made of `ctrl_dt / dt` physics steps."""

    mj_model: mujoco.MjModel
    mjx_model: mjx.Model
    ctrl_dt: float
    dt: float
    default_qpos: np.ndarray
    free_joint: bool

    @classmethod
    def create(cls, mj_model: mujoco.MjModel, ctrl_dt: float, dt: float) -> PhysicsEngine:
        mj_model.opt.timestep = dt
        free_joint = mj_model.njnt > 0 and int(mj_model.jnt_type[0]) == int(mujoco.mjtJoint.mjJNT_FREE)
        default_qpos = mj_model.key_qpos[0].copy() if mj_model.nkey > 0 else mj_model.qpos0.copy()
        return cls(
            mj_model=mj_model,
            # On this process's first device: the global device 0 belongs to process 0 in multi-process runs.
            mjx_model=mjx.put_model(mj_model, device=jax.local_devices()[0]),
            ctrl_dt=ctrl_dt,
            dt=dt,
            default_qpos=default_qpos,
            free_joint=free_joint,
        )

    @property
    def num_substeps(self) -> int:
        return round(self.ctrl_dt / self.dt)

    @property
    def action_dim(self) -> int:
        return int(self.mj_model.nu)

    def make_data(self, qpos: Array, qvel: Array) -> mjx.Data:
        """Physics state at a given pose, with derived quantities (positions, contacts) computed."""
        data = mjx.make_data(self.mjx_model).replace(qpos=qpos, qvel=qvel)
        return mjx.forward(self.mjx_model, data)

    def step(self, data: mjx.Data, control: Callable[[mjx.Data], Array]) -> tuple[mjx.Data, Array]:
        """One control step; `control` is re-evaluated at every substep (a PD loop needs fresh state)."""

        def substep(data: mjx.Data, _: None) -> tuple[mjx.Data, Array]:
            ctrl = control(data)
            return mjx.step(self.mjx_model, data.replace(ctrl=ctrl)), ctrl

        data, ctrls = jax.lax.scan(substep, data, None, length=self.num_substeps)
        return data, ctrls[-1]

    def context(self, data: mjx.Data, action: Array, last_action: Array, ctrl: Array) -> StepContext:
        return StepContext(data, action, last_action, ctrl, free_joint=self.free_joint)


def substeps_divide(ctrl_dt: float, dt: float) -> bool:
    """Whether `ctrl_dt` is a whole multiple of `dt` (within float tolerance)."""
    ratio = ctrl_dt / dt
    return ratio >= 1 and math.isclose(ratio, round(ratio), rel_tol=0, abs_tol=1e-6)
