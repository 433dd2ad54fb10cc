"""Physics: model loading, the model's layout (base body, root and robot joints), what components see of a
control step (`StepContext`, `Contacts`) and the interface every physics implementation serves
(`PhysicsEngine`; the implementations are in ksim.physics).

The *base* is a body (by default the first body under the world). Its pose and velocity come from
the body quantities (`xpos`, `xquat`, `cvel`), so they are right for any root: a free joint, a
planar root (slides and a hinge), or a base welded to the world.

The *root joints* attach the robot to the world without being driven by it: a free joint, or a joint of
the base body that no actuator drives (a planar root of slides and hinges). Every other joint is a *robot
joint*: actuated joints always are, so a fixed-base robot (a pendulum, an arm, a cart on a rail driven by a
motor) has no root joints and all its joints are robot joints. "Joints" everywhere else (`joint_pos`,
resets, joint observations) means the robot joints unless a component names joints explicitly.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct

from ksim.config import ConfigError

if TYPE_CHECKING:  # MJX's types only: the native engine runs without importing MJX
    from mujoco import mjx

Array = jax.Array
ASSETS_DIR = Path(__file__).parent / "assets"
# One env's physics data: `mjx.Data` for MJX, an implementation's own pytree otherwise; every one has the
# fields the contract (`PhysicsEngine`) names.
PhysicsData = Any

# Base-frame quantities per root kind: a fixed base never moves, so components that need a moving
# base refuse a fixed-base model when the task is built.
FREE, ARTICULATED, FIXED = "free", "articulated", "fixed"


def asset_path(path: str | Path) -> Path:
    """An MJCF file's path; a bare file name is looked up in ksim's bundled assets."""
    candidate = Path(path)
    if not candidate.exists() and (ASSETS_DIR / candidate).exists():
        candidate = ASSETS_DIR / candidate
    if not candidate.exists():
        raise FileNotFoundError(f"MJCF model {path!s} not found (also looked in {ASSETS_DIR})")
    return candidate


def load_mujoco_model(path: str | Path, keyframe: str | None = None) -> mujoco.MjModel:
    """Loads an MJCF file; a bare file name is looked up in ksim's bundled assets. With `keyframe`, that keyframe is
    the model's only one, so its pose is the default (where episodes reset, what pose rewards and actions offset)."""
    if keyframe is None:
        return mujoco.MjModel.from_xml_path(str(asset_path(path)))
    spec = mujoco.MjSpec.from_file(str(asset_path(path)))
    names = [key.name for key in spec.keys]
    if keyframe not in names:
        raise ConfigError(f"keyframe={keyframe!r}: {path} has no such keyframe; its keyframes are {names}")
    for key in list(spec.keys):
        if key.name != keyframe:
            spec.delete(key)
    spec.nkey = 0  # sized by the keys left, not by the file's <size nkey>
    return spec.compile()


def rotate(quat: Array, vec: Array) -> Array:
    """Rotates a vector from the frame of a (w, x, y, z) unit quaternion into the world frame."""
    w, xyz = quat[0], quat[1:]
    t = 2.0 * jnp.cross(xyz, vec)
    return vec + w * t + jnp.cross(xyz, t)


def rotate_inverse(quat: Array, vec: Array) -> Array:
    """Rotates a world-frame vector into the frame of a (w, x, y, z) unit quaternion."""
    w, xyz = quat[0], quat[1:]
    t = 2.0 * jnp.cross(xyz, vec)
    return vec - w * t + jnp.cross(xyz, t)


def quat_multiply(a: Array, b: Array) -> Array:
    """The Hamilton product a * b of (w, x, y, z) quaternions (broadcasting over leading axes)."""
    aw, ax, ay, az = jnp.moveaxis(a, -1, 0)
    bw, bx, by, bz = jnp.moveaxis(b, -1, 0)
    return jnp.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conjugate(quat: Array) -> Array:
    """The inverse rotation of a unit quaternion."""
    return quat * jnp.array([1.0, -1.0, -1.0, -1.0])


def quat_angle(a: Array, b: Array) -> Array:
    """The angle (rad, in [0, pi]) of the rotation between unit quaternions a and b."""
    dot = jnp.abs(jnp.sum(a * b, axis=-1))
    return 2.0 * jnp.arccos(jnp.clip(dot, 0.0, 1.0))


def yaw_quat(quat: Array) -> Array:
    """The rotation about the world z axis of a unit quaternion's heading (its yaw alone)."""
    w, x, y, z = jnp.moveaxis(quat, -1, 0)
    yaw = jnp.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    zero = jnp.zeros_like(yaw)
    return jnp.stack([jnp.cos(yaw / 2), zero, zero, jnp.sin(yaw / 2)], axis=-1)


def rotation_6d(quat: Array) -> Array:
    """The first two columns of a unit quaternion's rotation matrix (6 values; continuous, unlike angles)."""
    columns = jnp.stack([rotate(quat, jnp.array([1.0, 0.0, 0.0])), rotate(quat, jnp.array([0.0, 1.0, 0.0]))])
    return jnp.ravel(columns)


def _names(mj_model: mujoco.MjModel, obj: mujoco.mjtObj, count: int) -> tuple[str, ...]:
    return tuple(mujoco.mj_id2name(mj_model, obj, i) or "" for i in range(count))


@dataclass(frozen=True)
class ModelLayout:
    """Static facts about a model that components index by (hashable: a static part of every pytree)."""

    base_body: int
    root_kind: str  # FREE, ARTICULATED or FIXED: how the base is attached to the world
    body_names: tuple[str, ...]
    joint_names: tuple[str, ...]
    joint_qpos: tuple[tuple[int, ...], ...]  # per joint, its qpos indices
    joint_qvel: tuple[tuple[int, ...], ...]
    root_joints: tuple[int, ...]
    body_rootid: tuple[int, ...]
    joint_body: tuple[int, ...]  # per joint, the body it moves
    geom_names: tuple[str, ...] = ()
    geom_body: tuple[int, ...] = ()
    geom_collides: tuple[bool, ...] = ()  # whether the geom has a contype or conaffinity bit
    site_names: tuple[str, ...] = ()
    site_body: tuple[int, ...] = ()
    sensor_names: tuple[str, ...] = ()
    sensor_adr: tuple[int, ...] = ()  # per sensor, its first index in sensordata
    sensor_dim: tuple[int, ...] = ()
    joint_range: tuple[tuple[float, float] | None, ...] = ()  # per joint, its limits (None: unlimited)
    default_qpos: tuple[float, ...] = ()  # the first keyframe's qpos, or qpos0 without keyframes
    actuators: ActuatorTable | None = None

    @classmethod
    def create(
        cls, mj_model: mujoco.MjModel, base_body: str | None = None, root_joints: Sequence[str] | None = None
    ) -> ModelLayout:
        """The layout by the joint rule (module docstring); `root_joints` names them instead, `()` for none."""
        body_names = _names(mj_model, mujoco.mjtObj.mjOBJ_BODY, mj_model.nbody)
        joint_names = _names(mj_model, mujoco.mjtObj.mjOBJ_JOINT, mj_model.njnt)
        base_id = _base_body_id(mj_model, body_names, base_body)
        if root_joints is None:
            roots = default_root_joints(mj_model, base_id)
        else:
            roots = tuple(sorted(joint_index(joint_names, name, "root_joints") for name in root_joints))
        qpos_sizes = {int(mujoco.mjtJoint.mjJNT_FREE): 7, int(mujoco.mjtJoint.mjJNT_BALL): 4}
        qvel_sizes = {int(mujoco.mjtJoint.mjJNT_FREE): 6, int(mujoco.mjtJoint.mjJNT_BALL): 3}
        joint_qpos, joint_qvel = [], []
        for j in range(mj_model.njnt):
            kind = int(mj_model.jnt_type[j])
            start_qpos, start_qvel = int(mj_model.jnt_qposadr[j]), int(mj_model.jnt_dofadr[j])
            joint_qpos.append(tuple(range(start_qpos, start_qpos + qpos_sizes.get(kind, 1))))
            joint_qvel.append(tuple(range(start_qvel, start_qvel + qvel_sizes.get(kind, 1))))
        return cls(
            base_body=base_id,
            root_kind=_root_kind(mj_model, base_id, roots),
            body_names=body_names,
            joint_names=joint_names,
            joint_qpos=tuple(joint_qpos),
            joint_qvel=tuple(joint_qvel),
            root_joints=roots,
            body_rootid=tuple(int(r) for r in mj_model.body_rootid),
            joint_body=tuple(int(b) for b in mj_model.jnt_bodyid),
            geom_names=_names(mj_model, mujoco.mjtObj.mjOBJ_GEOM, mj_model.ngeom),
            geom_body=tuple(int(b) for b in mj_model.geom_bodyid),
            geom_collides=tuple(bool(c) for c in (mj_model.geom_contype | mj_model.geom_conaffinity)),
            site_names=_names(mj_model, mujoco.mjtObj.mjOBJ_SITE, mj_model.nsite),
            site_body=tuple(int(b) for b in mj_model.site_bodyid),
            sensor_names=_names(mj_model, mujoco.mjtObj.mjOBJ_SENSOR, mj_model.nsensor),
            sensor_adr=tuple(int(a) for a in mj_model.sensor_adr),
            sensor_dim=tuple(int(d) for d in mj_model.sensor_dim),
            joint_range=tuple(_limits(mj_model, j) for j in range(mj_model.njnt)),
            default_qpos=tuple(float(q) for q in default_pose(mj_model)),
            actuators=ActuatorTable.create(mj_model),
        )

    @property
    def robot_joints(self) -> tuple[int, ...]:
        """Every joint that is not a root joint."""
        return tuple(j for j in range(len(self.joint_names)) if j not in self.root_joints)

    def joints(self, names: Sequence[str] | None, setting: str = "joints") -> tuple[int, ...]:
        """Joint ids by name (the robot joints for None); unknown names, or no joints at all, raise naming
        `setting` and the model's joints."""
        if names is None:
            if not self.robot_joints:
                raise ConfigError(
                    f"{setting}: the model has no robot joints (its joints: {_listed(self.joint_names)}; root joints "
                    f"of the base body {self.body_names[self.base_body]!r}: {_listed(self.names(self.root_joints))})"
                    f"; name the joints to use with {setting}=(...)"
                )
            return self.robot_joints
        if not names:
            raise ConfigError(
                f"{setting} is empty; name one or more of the model's joints: {_listed(self.joint_names)}"
            )
        return tuple(joint_index(self.joint_names, name, setting) for name in names)

    @property
    def default_joint_pos(self) -> np.ndarray:
        """The robot joints' default pose (keyframe 0, or `qpos0` without keyframes)."""
        return np.asarray(self.default_qpos, np.float32)[self.qpos_indices(self.robot_joints)]

    def default_pos_of(self, joints: Sequence[int]) -> np.ndarray:
        """The default pose of the given joints."""
        return np.asarray(self.default_qpos, np.float32)[self.qpos_indices(joints)]

    @functools.cached_property
    def robot_root(self) -> int:
        """The body under the world whose subtree is the robot (the base's root)."""
        return self.body_rootid[self.base_body]

    @functools.cached_property
    def robot_geom_mask(self) -> np.ndarray:
        """(ngeom,) whether each geom belongs to the robot (the base's subtree root)."""
        return np.asarray([self.body_rootid[b] == self.robot_root for b in self.geom_body], bool)

    def point(self, name: str, setting: str) -> Point:
        """The frame named `name`: a site, else a geom, else a body; unknown names raise naming `setting`."""
        for kind, names, bodies in ((SITE, self.site_names, self.site_body), (GEOM, self.geom_names, self.geom_body)):
            if name in names:
                index = names.index(name)
                return Point(kind, index, bodies[index])
        if name in self.body_names[1:]:
            index = self.body_names.index(name)
            return Point(BODY, index, index)
        raise ConfigError(
            f"{setting}: no site, geom or body named {name!r}; the model's sites are {_listed(self.site_names)}, "
            f"its geoms {_listed(self.geom_names)}, its bodies {_listed(self.body_names[1:])}"
        )

    def contact_geoms(self, name: str, setting: str) -> tuple[int, ...]:
        """The geoms that touch for `name`: a geom, else a body's colliding geoms; nothing that collides raises."""
        if name in self.geom_names:
            geoms: tuple[int, ...] = (self.geom_names.index(name),)
        elif name in self.body_names[1:]:
            body = self.body_names.index(name)
            geoms = tuple(g for g, b in enumerate(self.geom_body) if b == body)
        else:
            colliding = [n for n, c in zip(self.geom_names, self.geom_collides, strict=True) if c]
            raise ConfigError(
                f"{setting}: no geom or body named {name!r}; the model's colliding geoms are {_listed(colliding)}, "
                f"its bodies {_listed(self.body_names[1:])}"
            )
        geoms = tuple(g for g in geoms if self.geom_collides[g])
        if not geoms:
            colliding = [n for n, c in zip(self.geom_names, self.geom_collides, strict=True) if c]
            raise ConfigError(
                f"{setting}: {name!r} has no geom that can touch anything (contype and conaffinity are 0); name a "
                f"colliding geom or body: {_listed(colliding)}"
            )
        return geoms

    def sensor(self, name: str, setting: str) -> tuple[int, int]:
        """(first index in sensordata, dimension) of the sensor `name`; unknown names raise naming `setting`."""
        if name not in self.sensor_names:
            known = _listed(self.sensor_names)
            raise ConfigError(f"{setting}: no sensor named {name!r}; the model's sensors are {known}")
        index = self.sensor_names.index(name)
        return self.sensor_adr[index], self.sensor_dim[index]

    def names(self, joints: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.joint_names[j] for j in joints)

    def qpos_indices(self, joints: Sequence[int]) -> np.ndarray:
        return np.asarray([i for j in joints for i in self.joint_qpos[j]], dtype=np.int32)

    def qvel_indices(self, joints: Sequence[int]) -> np.ndarray:
        return np.asarray([i for j in joints for i in self.joint_qvel[j]], dtype=np.int32)

    def free_root_qvel(self, component: str) -> np.ndarray:
        """The base's free-joint velocity indices (world linear, then local angular); others refuse."""
        free = [j for j in self.root_joints if len(self.joint_qvel[j]) == 6 and self.joint_body[j] == self.base_body]
        if not free:
            base = self.body_names[self.base_body]
            raise ConfigError(
                f"{component} needs a free root joint, but the base body {base!r} has a {self.root_kind} root"
            )
        return np.asarray(self.joint_qvel[free[0]], dtype=np.int32)

    def require_moving_base(self, component: str) -> None:
        """For components that read the base's motion: a base welded to the world has none."""
        if self.root_kind == FIXED:
            base = self.body_names[self.base_body]
            raise ConfigError(
                f"{component} needs a moving base, but the base body {base!r} is welded to the world (no joint moves "
                "it); name a moving body with base_body=..."
            )


SITE, GEOM, BODY = "site", "geom", "body"


@dataclass(frozen=True)
class Point:
    """A frame a component measures at: a site, a geom or a body (`index` in its kind's table), on `body`."""

    kind: str
    index: int
    body: int


@dataclass(frozen=True)
class ActuatorTable:
    """Per actuator, what gives its force from ctrl and its joint's state (MuJoCo's affine gain and bias):
    force = gain * ctrl + bias0 + bias1 * q + bias2 * qdot, clipped to its force range; None without joints."""

    qpos: tuple[int, ...]
    qvel: tuple[int, ...]
    gain: tuple[float, ...]
    bias: tuple[tuple[float, float, float], ...]
    gear: tuple[float, ...]
    force_range: tuple[tuple[float, float], ...]

    @classmethod
    def create(cls, mj_model: mujoco.MjModel) -> ActuatorTable | None:
        """The table for a model whose actuators all drive one joint each with an affine gain and bias."""
        joint_kinds = (mujoco.mjtTrn.mjTRN_JOINT, mujoco.mjtTrn.mjTRN_JOINTINPARENT)
        affine = (int(mujoco.mjtGain.mjGAIN_FIXED), int(mujoco.mjtGain.mjGAIN_AFFINE))
        for i in range(mj_model.nu):
            if mujoco.mjtTrn(int(mj_model.actuator_trntype[i])) not in joint_kinds or mj_model.actuator_dyntype[i]:
                return None
            if int(mj_model.actuator_gaintype[i]) not in affine:
                return None
        joints = [int(j) for j in mj_model.actuator_trnid[:, 0]]
        return cls(
            qpos=tuple(int(mj_model.jnt_qposadr[j]) for j in joints),
            qvel=tuple(int(mj_model.jnt_dofadr[j]) for j in joints),
            gain=tuple(float(g) for g in mj_model.actuator_gainprm[:, 0]),
            bias=tuple((float(b[0]), float(b[1]), float(b[2])) for b in mj_model.actuator_biasprm[:, :3]),
            gear=tuple(float(g) for g in mj_model.actuator_gear[:, 0]),
            force_range=tuple((float(low), float(high)) for low, high in actuator_force_ranges(mj_model)),
        )


def actuator_force_ranges(mj_model: mujoco.MjModel) -> np.ndarray:
    """Per actuator, (low, high) of its force: its force range where it is force-limited, +-inf where not."""
    limited = mj_model.actuator_forcelimited.astype(bool)[:, None]
    return np.where(limited, mj_model.actuator_forcerange, np.array([-np.inf, np.inf]))


def default_pose(mj_model: mujoco.MjModel) -> np.ndarray:
    """The model's default qpos: its first keyframe's, or `qpos0` when it has none."""
    return mj_model.key_qpos[0].copy() if mj_model.nkey > 0 else mj_model.qpos0.copy()


def _limits(mj_model: mujoco.MjModel, joint: int) -> tuple[float, float] | None:
    if not mj_model.jnt_limited[joint]:
        return None
    low, high = mj_model.jnt_range[joint]
    return float(low), float(high)


def actuated_joints(mj_model: mujoco.MjModel) -> frozenset[int]:
    """Joints an actuator drives: through a joint transmission, or through a fixed tendon over joints."""
    joint_transmissions = (mujoco.mjtTrn.mjTRN_JOINT, mujoco.mjtTrn.mjTRN_JOINTINPARENT)
    driven: set[int] = set()
    for actuator in range(mj_model.nu):
        target = int(mj_model.actuator_trnid[actuator, 0])
        kind = mujoco.mjtTrn(int(mj_model.actuator_trntype[actuator]))
        if kind in joint_transmissions:
            driven.add(target)
        elif kind == mujoco.mjtTrn.mjTRN_TENDON:
            first, count = int(mj_model.tendon_adr[target]), int(mj_model.tendon_num[target])
            for wrap in range(first, first + count):
                if mj_model.wrap_type[wrap] == mujoco.mjtWrap.mjWRAP_JOINT:
                    driven.add(int(mj_model.wrap_objid[wrap]))
    return frozenset(driven)


def default_root_joints(mj_model: mujoco.MjModel, base_id: int) -> tuple[int, ...]:
    """The joint rule: free joints, and the base body's joints that no actuator drives."""
    driven = actuated_joints(mj_model)
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    return tuple(
        j
        for j in range(mj_model.njnt)
        if int(mj_model.jnt_type[j]) == free or (mj_model.jnt_bodyid[j] == base_id and j not in driven)
    )


def _base_body_id(mj_model: mujoco.MjModel, body_names: Sequence[str], base_body: str | None) -> int:
    if base_body is None:
        children = [b for b in range(1, mj_model.nbody) if mj_model.body_parentid[b] == 0]
        if not children:
            raise ConfigError("the model has no body under the world to use as its base")
        return children[0]
    base_id = body_index(body_names, base_body, "base_body")
    if base_id == 0:
        raise ConfigError(f"base_body={base_body!r} is the world; name a body: {_listed(body_names[1:])}")
    return base_id


def _root_kind(mj_model: mujoco.MjModel, base_id: int, roots: Sequence[int]) -> str:
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    if any(int(mj_model.jnt_type[j]) == free and mj_model.jnt_bodyid[j] == base_id for j in roots):
        return FREE
    return FIXED if int(mj_model.body_weldid[base_id]) == 0 else ARTICULATED


def _listed(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names if n) or "(none named)"


def joint_index(joint_names: Sequence[str], name: str, setting: str) -> int:
    if name not in joint_names:
        raise ConfigError(f"{setting}: no joint named {name!r}; the model's joints are {_listed(joint_names)}")
    return joint_names.index(name)


def body_index(body_names: Sequence[str], name: str, setting: str) -> int:
    if name not in body_names:
        raise ConfigError(f"{setting}: no body named {name!r}; the model's bodies are {_listed(body_names[1:])}")
    return body_names.index(name)


def body_velocity(layout: ModelLayout, data: mjx.Data, body: int) -> tuple[Array, Array]:
    """World-frame (angular, linear) velocity of a body's frame origin, from MJX's com-based `cvel`."""
    angular, linear_at_com = data.cvel[body, :3], data.cvel[body, 3:]
    offset = data.xpos[body] - data.subtree_com[layout.body_rootid[body]]
    return angular, linear_at_com - jnp.cross(offset, angular)


def point_velocity(layout: ModelLayout, data: mjx.Data, body: int, point: Array) -> Array:
    """World-frame linear velocity of a world point fixed to a body, from MJX's com-based `cvel`."""
    angular, linear_at_com = data.cvel[body, :3], data.cvel[body, 3:]
    return linear_at_com - jnp.cross(point - data.subtree_com[layout.body_rootid[body]], angular)


class Contacts(struct.PyTreeNode):
    """One env's contacts at a state, as a table of fixed size whatever the physics implementation.

    A row that holds no contact has `dist` > 0 (a candidate pair that is apart) or geoms -1 (padding), and a
    zero normal force. Penetrating contacts have `dist` < 0; `normal_force` is what `mj_contactForce` reports
    along the contact normal (newtons, >= 0).
    """

    geom1: Array  # (n,) int32
    geom2: Array  # (n,) int32
    dist: Array  # (n,)
    pos: Array  # (n, 3) world position of the contact point
    normal_force: Array  # (n,)


class StepContext(struct.PyTreeNode):
    """What components see of one env at a control step (unbatched): the data before and after it.

    Components read the physics only through this class (its properties, `data`'s fields named in
    `PhysicsEngine`'s docstring, and `contacts`), so every physics implementation serves them alike.
    """

    data: mjx.Data
    prev_data: mjx.Data
    action: Array
    last_action: Array
    ctrl: Array
    command: Array
    contact_table: Contacts | None  # None where the physics has no per-env contacts (Warp)
    layout: ModelLayout = struct.field(pytree_node=False)
    ctrl_dt: float = struct.field(pytree_node=False)
    state: Any = None  # the stateful component's own state before this step (ksim.stateful); None for others
    terminated: Array | None = None  # whether a termination ended the episode at this step (rewards only)
    no_contacts: str = struct.field(pytree_node=False, default="")  # why contact_table is None

    @property
    def contacts(self) -> Contacts:
        """The contacts of the state the control step ends in."""
        if self.contact_table is None:
            raise ConfigError(f"a component reads contacts, which {self.no_contacts}; set physics_impl='jax'")
        return self.contact_table

    # ----- joints (the robot joints unless named) ------------------------------------------------------

    @property
    def joint_pos(self) -> Array:
        """Positions of the robot joints (every joint but the root joints)."""
        return self.data.qpos[self.layout.qpos_indices(self.layout.robot_joints)]

    @property
    def joint_vel(self) -> Array:
        """Velocities of the robot joints."""
        return self.data.qvel[self.layout.qvel_indices(self.layout.robot_joints)]

    def joint_pos_of(self, joints: Sequence[int]) -> Array:
        return self.data.qpos[self.layout.qpos_indices(joints)]

    def joint_vel_of(self, joints: Sequence[int]) -> Array:
        return self.data.qvel[self.layout.qvel_indices(joints)]

    # ----- the base body, for any kind of root ---------------------------------------------------------

    @property
    def base_pos(self) -> Array:
        """World position of the base body's frame."""
        return self.data.xpos[self.layout.base_body]

    @property
    def prev_base_pos(self) -> Array:
        """World position of the base before the control step."""
        return self.prev_data.xpos[self.layout.base_body]

    @property
    def base_quat(self) -> Array:
        """World orientation (w, x, y, z) of the base body."""
        return self.data.xquat[self.layout.base_body]

    @property
    def projected_gravity(self) -> Array:
        """Unit gravity direction in the base frame: (0, 0, -1) when upright."""
        return rotate_inverse(self.base_quat, jnp.array([0.0, 0.0, -1.0]))

    @property
    def base_lin_vel_world(self) -> Array:
        return body_velocity(self.layout, self.data, self.layout.base_body)[1]

    @property
    def base_ang_vel_world(self) -> Array:
        return body_velocity(self.layout, self.data, self.layout.base_body)[0]

    @property
    def base_lin_vel(self) -> Array:
        """Base linear velocity in the base frame."""
        return rotate_inverse(self.base_quat, self.base_lin_vel_world)

    @property
    def base_ang_vel(self) -> Array:
        """Base angular velocity in the base frame."""
        return rotate_inverse(self.base_quat, self.base_ang_vel_world)

    @property
    def base_pitch(self) -> Array:
        """Rotation about the world y axis of the base's x axis (positive: nose down), radians."""
        forward = rotate(self.base_quat, jnp.array([1.0, 0.0, 0.0]))
        return jnp.arctan2(-forward[2], forward[0])

    # ----- any body -------------------------------------------------------------------------------------

    def body_pos(self, body: int) -> Array:
        return self.data.xpos[body]

    def body_lin_vel_world(self, body: int) -> Array:
        return body_velocity(self.layout, self.data, body)[1]

    # ----- sensors, named points, contacts ---------------------------------------------------------------

    def sensor(self, name: str) -> Array:
        """An MJCF sensor's values by name, as MuJoCo computes them into `sensordata`."""
        return self.sensor_at(self.layout.sensor(name, "sensor"))

    def sensor_at(self, span: tuple[int, int]) -> Array:
        """The values of the sensor at (first index in `sensordata`, dimension), as `ModelLayout.sensor` gives."""
        start, dim = span
        return self.data.sensordata[start : start + dim]

    def point_pos(self, point: Point) -> Array:
        """World position of a site, geom or body frame."""
        table = {SITE: self.data.site_xpos, GEOM: self.data.geom_xpos, BODY: self.data.xpos}[point.kind]
        return table[point.index]

    def point_lin_vel_world(self, point: Point) -> Array:
        """World-frame linear velocity of a site, geom or body frame."""
        return point_velocity(self.layout, self.data, point.body, self.point_pos(point))

    def touching(self, geoms: Sequence[int]) -> Array:
        """Per contact row, whether one of `geoms` touches (distance <= 0) a geom outside the robot."""
        mine = np.zeros(len(self.layout.geom_names) + 1, bool)  # the extra entry: padding rows' geom -1
        mine[list(geoms)] = True
        outside = np.append(~self.layout.robot_geom_mask, False)
        mine_j, outside_j = jnp.asarray(mine), jnp.asarray(outside)
        g1, g2 = self.contacts.geom1, self.contacts.geom2
        pair = (mine_j[g1] & outside_j[g2]) | (mine_j[g2] & outside_j[g1])
        return pair & (self.contacts.dist <= 0)

    def in_contact(self, geoms: Sequence[int]) -> Array:
        """Whether any of `geoms` touches something outside the robot (the ground)."""
        return jnp.any(self.touching(geoms))

    def contact_force(self, geoms: Sequence[int]) -> Array:
        """Sum of the normal forces (N) between `geoms` and whatever outside the robot they touch."""
        return jnp.sum(jnp.where(self.touching(geoms), self.contacts.normal_force, 0.0))


@dataclass(frozen=True)
class PhysicsEngine(ABC):
    """A model stepped at `ctrl_dt`, each control step made of `ctrl_dt / dt` physics steps: the interface every
    physics implementation (ksim.physics: `create_engine`) serves.

    The data contract: whatever the implementation, the per-env data it returns (`make_data`, `step`) is a pytree
    with `.replace` holding these fields, named and shaped as in `mjx.Data`, current for its final positions and
    velocities: `qpos`, `qvel`, `act`, `ctrl`, `time`, `xpos`, `xquat`, `xipos`, `cvel`, `subtree_com`,
    `site_xpos`, `site_xmat`, `geom_xpos`, `geom_xmat`, `sensordata`; and `contacts(data)` gives its `Contacts`.
    Events change `qvel` with `data.replace(qvel=...)` and then call `velocities_changed`.
    """

    physics_impl: ClassVar[str]
    no_contacts: ClassVar[str] = ""  # why components cannot read contacts with this implementation ("": they can)
    # How many envs' episode starts one pooled-start refill computes, as a fraction of the shard's envs: MJX's
    # reset costs per env, so a refill computes an eighth at a time (about the envs whose start was used).
    refill_fraction: ClassVar[float] = 1 / 8
    mj_model: mujoco.MjModel
    ctrl_dt: float
    dt: float
    default_qpos: np.ndarray
    layout: ModelLayout

    @property
    def num_substeps(self) -> int:
        return round(self.ctrl_dt / self.dt)

    @property
    def action_dim(self) -> int:
        return int(self.mj_model.nu)

    @property
    def has_acceleration_sensors(self) -> bool:
        return bool(np.any(self.mj_model.sensor_needstage == mujoco.mjtStage.mjSTAGE_ACC))

    @property
    @abstractmethod
    def field_defaults(self) -> Any:
        """What randomizations read a model field's default from (`getattr(field_defaults, "body_mass")`, as
        JAX arrays); the per-env `fields` that `make_data` and `step` take replace some of them."""

    @abstractmethod
    def make_data(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None = None) -> PhysicsData:
        """One env's state at a pose (zero activations, controls and time), with what depends on positions and
        velocities computed for the model that `fields` give."""

    @abstractmethod
    def step(
        self, data: PhysicsData, control: Callable[[PhysicsData], Array], fields: dict[str, Array] | None = None
    ) -> tuple[PhysicsData, Array]:
        """One control step; `control` is re-evaluated at every substep (a PD loop needs fresh state). Returns the
        data at the step's end and the last substep's control."""

    @abstractmethod
    def velocities_changed(self, data: PhysicsData, fields: dict[str, Array] | None = None) -> PhysicsData:
        """Brings the velocity-dependent quantities up to date after something (an event) changed `qvel`."""

    @abstractmethod
    def contacts(self, data: PhysicsData) -> Contacts | None:
        """The contacts of `data`'s state (None where the implementation has no per-env contacts)."""

    def context(
        self,
        data: PhysicsData,
        prev_data: PhysicsData,
        action: Array,
        last_action: Array,
        ctrl: Array,
        command: Array | None = None,
    ) -> StepContext:
        command = jnp.zeros(0) if command is None else command
        contacts = None if self.no_contacts else self.contacts(data)
        return StepContext(
            data,
            prev_data,
            action,
            last_action,
            ctrl,
            command,
            contacts,
            self.layout,
            self.ctrl_dt,
            no_contacts=self.no_contacts,
        )


def substeps_divide(ctrl_dt: float, dt: float) -> bool:
    """Whether `ctrl_dt` is a whole multiple of `dt` (within float tolerance)."""
    ratio = ctrl_dt / dt
    return ratio >= 1 and math.isclose(ratio, round(ratio), rel_tol=0, abs_tol=1e-6)
