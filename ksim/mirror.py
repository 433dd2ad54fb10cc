"""Left-right mirror images of a robot's joints, actions and actor observations, for the symmetry loss.

A legged robot is left-right symmetric: the mirror image of a state should get the mirror image of the action.
`PPOConfig.symmetry_coef` turns that into a loss (rsl_rl's mirror loss), which the policy otherwise learns only
as far as the samples happen to show it; without it a walker can end up crabbing to one side.

The mirror plane is the base body's x-z plane at the model's default pose. Joints are paired by geometry, not by
name: a hinge's anchor and axis, reflected (the axis as a rotation axis), must meet another hinge's, or its own,
within `ANCHOR_TOLERANCE_M`; the sign says whether the two turn the same way. Every mirror here is a signed
permutation of a vector's values, built once when the task is built; what has no mirror image is refused in
one line then. Each observation class says its own mirror image (`Observation.mirror(context)`, in
ksim.observations), from the pieces here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import jax
import mujoco
import numpy as np

from ksim.binding import require_own
from ksim.commands import Command
from ksim.config import ConfigError
from ksim.engine import ModelLayout

Array = jax.Array
V = TypeVar("V", jax.Array, np.ndarray)

ANCHOR_TOLERANCE_M = 0.01  # how far a reflected joint anchor, sensor site or foot centre may sit from its image
ALIGNED = 0.99  # |cos| between a reflected axis and its image's axis
POSE_TOLERANCE = 1e-3  # rad (or m): the default pose must be its own mirror image
POLAR = (1.0, -1.0, 1.0)  # a vector in a frame whose x-z plane is the mirror plane (velocity, gravity)
AXIAL = (-1.0, 1.0, -1.0)  # a rotation vector in such a frame (angular velocity)


@dataclass(frozen=True)
class Mirror:
    """A signed permutation: value i of the mirror image is `sign[i] * value[order[i]]`."""

    order: np.ndarray
    sign: np.ndarray

    @classmethod
    def signs(cls, *sign: float) -> Mirror:
        return cls(np.arange(len(sign)), np.asarray(sign, np.float32))

    def __call__(self, values: V) -> V:
        return values[..., self.order] * self.sign

    @property
    def size(self) -> int:
        return len(self.order)


def concatenate(mirrors: Sequence[Mirror]) -> Mirror:
    """The mirror of concatenated vectors, each part by its own mirror."""
    offsets = np.cumsum([0, *(m.size for m in mirrors[:-1])])
    order = np.concatenate([m.order + offset for m, offset in zip(mirrors, offsets, strict=True)])
    return Mirror(order.astype(np.int64), np.concatenate([m.sign for m in mirrors]).astype(np.float32))


@dataclass(frozen=True)
class RobotGeometry:
    """Joint anchors, joint axes, geom positions and site frames in the base frame at the default pose."""

    mj_model: mujoco.MjModel
    layout: ModelLayout
    anchors: np.ndarray  # (njnt, 3)
    axes: np.ndarray  # (njnt, 3)
    geom_pos: np.ndarray  # (ngeom, 3)
    site_pos: np.ndarray  # (nsite, 3)
    site_rotation: np.ndarray  # (nsite, 3, 3): each site's axes (columns)

    @classmethod
    def create(cls, mj_model: mujoco.MjModel, layout: ModelLayout) -> RobotGeometry:
        data = mujoco.MjData(mj_model)
        data.qpos[:] = layout.default_qpos
        mujoco.mj_kinematics(mj_model, data)
        rotation, origin = data.xmat[layout.base_body].reshape(3, 3), data.xpos[layout.base_body]
        site_rotation = rotation.T @ data.site_xmat.reshape(-1, 3, 3)
        anchors, axes = (data.xanchor - origin) @ rotation, data.xaxis @ rotation
        geom_pos, site_pos = (data.geom_xpos - origin) @ rotation, (data.site_xpos - origin) @ rotation
        return cls(mj_model, layout, anchors, axes, geom_pos, site_pos, site_rotation)

    def joint_mirror(self, joints: Sequence[int], setting: str) -> Mirror:
        """The mirror of one value per joint (positions, velocities): each joint's image among `joints`."""
        names = self.layout.joint_names
        hinge, slide = int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)
        kinds = self.mj_model.jnt_type[list(joints)]
        anchors, axes = self.anchors[list(joints)], self.axes[list(joints)]
        order, sign = [], []
        for i, joint in enumerate(joints):
            if kinds[i] not in (hinge, slide):
                raise ConfigError(f"{setting}: joint {names[joint]!r} is not a hinge or slide; it has no mirror image")
            image_anchor = anchors[i] * POLAR
            image_axis = axes[i] * (AXIAL if kinds[i] == hinge else POLAR)
            alignment = axes @ image_axis
            near = np.linalg.norm(anchors - image_anchor, axis=1) < ANCHOR_TOLERANCE_M
            candidates = near & (np.abs(alignment) > ALIGNED) & (kinds == kinds[i])
            if not candidates.any():
                raise ConfigError(
                    f"{setting}: joint {names[joint]!r} has no mirror image across the base's x-z plane (no joint "
                    f"among these within {ANCHOR_TOLERANCE_M} m of its reflected anchor with a parallel axis)"
                )
            image = int(np.argmax(np.where(candidates, np.abs(alignment), -1.0)))
            order.append(image)
            sign.append(float(np.sign(alignment[image])))
        mirror = Mirror(np.asarray(order), np.asarray(sign, np.float32))
        default = self.layout.default_pos_of(joints)
        off = np.abs(mirror(default) - default) > POSE_TOLERANCE
        if off.any():
            off_joint = names[joints[int(np.argmax(off))]]
            raise ConfigError(f"{setting}: the default pose is not symmetric at joint {off_joint!r}")
        return mirror

    def feet_mirror(self, feet: Sequence[str], foot_geoms: Sequence[Sequence[int]], setting: str) -> Mirror:
        """The mirror of one value per foot: each foot's image is the foot whose geoms' centre is its reflection."""
        centres = np.stack([self.geom_pos[list(geoms)].mean(axis=0) for geoms in foot_geoms])
        order = []
        for foot, centre in zip(feet, centres, strict=True):
            distance = np.linalg.norm(centres - centre * POLAR, axis=1)
            if distance.min() > ANCHOR_TOLERANCE_M:
                raise ConfigError(
                    f"{setting}: foot {foot!r} has no mirror image among these feet (none within "
                    f"{ANCHOR_TOLERANCE_M} m of its reflection across the base's x-z plane)"
                )
            order.append(int(np.argmin(distance)))
        return Mirror(np.asarray(order), np.ones(len(order), np.float32))

    def site_frame_mirror(self, site: int, axial: bool, setting: str, on_plane: bool) -> Mirror:
        """The mirror of a vector (`axial`: a rotation vector) in the site's frame, whose axes must lie along the
        base's; `on_plane`: the reading depends on the point, so the site must lie on the mirror plane."""
        name = self.layout.site_names[site]
        rotation = self.site_rotation[site]
        reflection = rotation.T @ np.diag(POLAR) @ rotation  # the base's reflection in the site's frame
        if np.abs(np.abs(reflection) - np.eye(3)).max() > 1.0 - ALIGNED:
            raise ConfigError(f"{setting}: site {name!r}'s axes are not along the base's; its readings have no mirror")
        if on_plane and abs(self.site_pos[site, 1]) > ANCHOR_TOLERANCE_M:
            raise ConfigError(f"{setting}: site {name!r} is {self.site_pos[site, 1]:.3f} m off the mirror plane")
        signs = np.sign(np.diag(reflection))
        return Mirror.signs(*(-signs if axial else signs))


@dataclass(frozen=True)
class MirrorContext:
    """What an observation's mirror may need: the robot's geometry, the action's mirror and the command's."""

    geometry: RobotGeometry
    action: Mirror
    command: Command | None


@dataclass(frozen=True)
class PolicyMirror:
    """The mirror of the actor's input (every history frame alike) and of its action."""

    observation: Mirror
    action: Mirror


def action_mirror(geometry: RobotGeometry) -> Mirror:
    """The mirror of one value per actuator: each actuator drives one joint, its image another's."""
    model = geometry.mj_model
    joint_kinds = (mujoco.mjtTrn.mjTRN_JOINT, mujoco.mjtTrn.mjTRN_JOINTINPARENT)
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_ACTUATOR, a) or str(a) for a in range(model.nu)]
    for actuator in range(model.nu):
        if mujoco.mjtTrn(int(model.actuator_trntype[actuator])) not in joint_kinds:
            raise ConfigError(f"symmetry_coef > 0: actuator {names[actuator]!r} drives no joint; it has no mirror")
    joints = [int(j) for j in model.actuator_trnid[:, 0]]
    mirror = geometry.joint_mirror(joints, "symmetry_coef > 0 (the actuated joints)")
    gear = model.actuator_gear[:, 0]
    unequal = np.abs(gear[mirror.order] - gear) > 1e-9
    if unequal.any():
        unequal_name = names[int(np.argmax(unequal))]
        raise ConfigError(f"symmetry_coef > 0: actuator {unequal_name!r}'s gear differs from its mirror image's")
    return mirror


class Mirrored(Protocol):
    """An observation as the symmetry loss sees it (ksim.observations.Observation)."""

    @property
    def name(self) -> str: ...

    def mirror(self, context: MirrorContext) -> Mirror: ...


def observation_mirror(observation: Mirrored, context: MirrorContext) -> Mirror:
    """The mirror of one observation's values; ConfigError where it has none, or where its class redefines
    observe() below the class whose mirror() it inherits (that mirror may not be this observation's)."""
    require_own(observation, "mirror", "observe", "symmetry_coef > 0", "mirror(context) (ksim.mirror)")
    return observation.mirror(context)


def policy_mirror(
    mj_model: mujoco.MjModel,
    layout: ModelLayout,
    observations: Sequence[Mirrored],
    sizes: Sequence[int],
    command: Command | None,
    history: int,
) -> PolicyMirror:
    """The actor's mirrors for a built task's observations (`sizes` values each) and its `history` frames."""
    geometry = RobotGeometry.create(mj_model, layout)
    action = action_mirror(geometry)
    context = MirrorContext(geometry, action, command)
    parts = [observation_mirror(o, context) for o in observations]
    for o, size, part in zip(observations, sizes, parts, strict=True):
        if part.size != size:
            raise ConfigError(f"symmetry_coef > 0: {o.name}'s mirror has {part.size} values, the observation {size}")
    frame = concatenate(parts)
    return PolicyMirror(concatenate([frame] * history), action)
