"""Rewards: each a small class with a `scale` and one method; the env reward is the scaled sum.

Penalties return a non-negative magnitude and take a negative `scale`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np

from ksim.binding import resolved, with_resolved
from ksim.config import ConfigError
from ksim.engine import ModelLayout, Point, StepContext, rotate
from ksim.observations import DEFAULT_POSE, feet_geoms
from ksim.stateful import Stateful
from ksim.terrain import Terrain, height_above_ground

Array = jax.Array


@dataclass(frozen=True)
class Reward(ABC):
    scale: float

    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, layout: ModelLayout) -> Self:
        """This reward with its names resolved; ConfigError if it cannot apply to the model."""
        return self

    @abstractmethod
    def value(self, ctx: StepContext) -> Array:
        """Unscaled per-step value (a scalar)."""

    def __call__(self, ctx: StepContext) -> Array:
        return self.scale * self.value(ctx)


@dataclass(frozen=True)
class _BaseReward(Reward):
    def bind(self, layout: ModelLayout) -> Self:
        layout.require_moving_base(self.name)
        return self


@dataclass(frozen=True)
class StayAlive(Reward):
    """A constant bonus for every step the episode goes on."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.ones(())


@dataclass(frozen=True)
class Healthy(Reward):
    """1 at every step but the one at which a termination ends the episode (Gymnasium v5's healthy reward)."""

    def value(self, ctx: StepContext) -> Array:
        if ctx.terminated is None:
            return jnp.ones(())
        return jnp.where(ctx.terminated, 0.0, 1.0)


@dataclass(frozen=True)
class Upright(_BaseReward):
    """1 when the base is upright, falling to -1 upside down."""

    def value(self, ctx: StepContext) -> Array:
        return -ctx.projected_gravity[2]


@dataclass(frozen=True)
class ForwardVelocity(_BaseReward):
    """Tracks a target world-frame x velocity of the base: exp(-(v - target)^2 / sigma^2)."""

    target: float = 1.0
    sigma: float = 0.5

    def value(self, ctx: StepContext) -> Array:
        error = ctx.base_lin_vel_world[0] - self.target
        return jnp.exp(-jnp.square(error / self.sigma))


@dataclass(frozen=True)
class ForwardProgress(_BaseReward):
    """Linear progress of the base over the control step along `direction` (world frame), in m/s."""

    direction: tuple[float, float, float] = (1.0, 0.0, 0.0)

    def value(self, ctx: StepContext) -> Array:
        displacement = ctx.base_pos - ctx.prev_base_pos
        return jnp.dot(displacement, jnp.asarray(self.direction)) / ctx.ctrl_dt


@dataclass(frozen=True)
class ActionRatePenalty(Reward):
    """Squared change of the action since the last step."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.action - ctx.last_action))


@dataclass(frozen=True)
class ControlCost(Reward):
    """Squared applied control (`data.ctrl`, after actuator scaling and clipping), summed over actuators."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.ctrl))


@dataclass(frozen=True)
class ActionCost(Reward):
    """Squared action as the policy chose it (before the actuators scale or clip it), summed: Gymnasium's
    control cost, which charges actions outside the control range in full."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.action))


@dataclass(frozen=True)
class JointPositionPenalty(Reward):
    """Squared position of one named joint (e.g. keep a cart centred)."""

    joint: str = ""
    joint_ids: tuple[int, ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, joint_ids=layout.joints((self.joint,), f"{self.name}.joint"))

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.joint_pos_of(self.joint_ids)))


def heading_velocity(ctx: StepContext) -> Array:
    """The base's world linear velocity in its heading frame (yaw only): (forward, lateral, up)."""
    forward = rotate(ctx.base_quat, jnp.array([1.0, 0.0, 0.0]))
    yaw = jnp.arctan2(forward[1], forward[0])
    cos, sin = jnp.cos(yaw), jnp.sin(yaw)
    vx, vy, vz = ctx.base_lin_vel_world
    return jnp.stack([cos * vx + sin * vy, -sin * vx + cos * vy, vz])


def linear_velocity_error(ctx: StepContext) -> Array:
    """|heading-frame base velocity xy - command xy|, m/s: the evaluation's command error for one step."""
    return jnp.linalg.norm(heading_velocity(ctx)[:2] - ctx.command[:2])


def yaw_rate_error(ctx: StepContext) -> Array:
    """|world-frame yaw rate - command value 2|, rad/s: the evaluation's yaw-rate error for one step."""
    return jnp.abs(ctx.base_ang_vel_world[2] - ctx.command[2])


@dataclass(frozen=True)
class _TrackingReward(_BaseReward):
    sigma: float = 0.25

    def bind(self, layout: ModelLayout) -> Self:
        if self.sigma <= 0:
            raise ConfigError(f"{self.name}: sigma={self.sigma} must be positive")
        return super().bind(layout)


@dataclass(frozen=True)
class LinearVelocityTracking(_TrackingReward):
    """exp(-|v_xy - command_xy|^2 / sigma): heading-frame base velocity against command values 0 and 1."""

    command_size: ClassVar[int] = 2

    def value(self, ctx: StepContext) -> Array:
        return jnp.exp(-jnp.square(linear_velocity_error(ctx)) / self.sigma)


@dataclass(frozen=True)
class AngularVelocityTracking(_TrackingReward):
    """exp(-(yaw rate - command_2)^2 / sigma): the base's world-frame yaw rate against command value 2."""

    command_size: ClassVar[int] = 3

    def value(self, ctx: StepContext) -> Array:
        return jnp.exp(-jnp.square(yaw_rate_error(ctx)) / self.sigma)


@dataclass(frozen=True)
class LinearVelocityError(_BaseReward):
    """|v_xy - command_xy| in m/s, for a negative scale: unlike the exp kernels its pull does not fade far from the
    command (the second after a change), and it is what the evaluation's command error averages."""

    command_size: ClassVar[int] = 2

    def value(self, ctx: StepContext) -> Array:
        return linear_velocity_error(ctx)


@dataclass(frozen=True)
class YawRateError(_BaseReward):
    """|yaw rate - command_2| in rad/s, for a negative scale: the evaluation's yaw-rate error as a penalty."""

    command_size: ClassVar[int] = 3

    def value(self, ctx: StepContext) -> Array:
        return yaw_rate_error(ctx)


def feet_points(layout: ModelLayout, feet: tuple[str, ...], setting: str) -> tuple[Point, ...]:
    """Per foot name, its frame (a site, geom or body); no feet or an unknown name raise naming `setting`."""
    if not feet:
        raise ConfigError(f"{setting} is empty: name the feet (sites, geoms or bodies)")
    return tuple(layout.point(foot, setting) for foot in feet)


@dataclass(frozen=True)
class JointPoseDeviation(Reward):
    """Squared distance of the robot joints (or the named ones) from `pose`: one value per such joint, or
    "default" for the model's default pose (its first keyframe, or qpos0)."""

    pose: tuple[float, ...] | str = ()
    joints: tuple[str, ...] | None = None
    joint_ids: tuple[int, ...] = resolved()
    target: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        joints = layout.joints(self.joints, f"{self.name}.joints")
        if isinstance(self.pose, str):
            if self.pose != DEFAULT_POSE:
                raise ConfigError(f"{self.name}.pose={self.pose!r}: give values or {DEFAULT_POSE!r}")
            return with_resolved(self, joint_ids=joints, target=layout.default_pos_of(joints))
        if len(self.pose) != len(joints):
            which = "named joints" if self.joints is not None else "robot joints"
            raise ConfigError(f"{self.name}.pose has {len(self.pose)} values; the model has {len(joints)} {which}")
        return with_resolved(self, joint_ids=joints, target=np.asarray(self.pose, np.float32))

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.joint_pos_of(self.joint_ids) - jnp.asarray(self.target)))


@dataclass(frozen=True)
class FeetSlip(Reward):
    """Squared horizontal speed of the feet in contact with the ground, summed over the feet.

    A foot is in contact when the simulator's contacts say so (its geom, or its body's colliding geoms, touch
    something outside the robot); with `contact_height`, when its frame is lower than that instead. Its speed is
    that of its frame: a site, geom or body (looked up in that order).
    """

    feet: tuple[str, ...] = ()
    contact_height: float | None = None
    terrain: Terrain | None = None  # with contact_height: heights above its surface (above z = 0 without one)
    points: tuple[Point, ...] = resolved()
    foot_geoms: tuple[tuple[int, ...], ...] = resolved()  # () with contact_height

    def bind(self, layout: ModelLayout) -> Self:
        setting = f"{self.name}.feet"
        geoms = feet_geoms(layout, self.feet, setting) if self.contact_height is None else ()
        return with_resolved(self, points=feet_points(layout, self.feet, setting), foot_geoms=geoms)

    def value(self, ctx: StepContext) -> Array:
        total = jnp.zeros(())
        for index, point in enumerate(self.points):
            if self.contact_height is None:
                touching = ctx.in_contact(self.foot_geoms[index])
            else:
                touching = height_above_ground(self.terrain, ctx.point_pos(point)) < self.contact_height
            total += jnp.where(touching, jnp.sum(jnp.square(ctx.point_lin_vel_world(point)[:2])), 0.0)
        return total


@dataclass(frozen=True)
class FootSwingTracking(Reward):
    """Feet follow a gait clock: exp(-sum of (height - target)^2 / sigma^2) over the feet.

    A foot's height is that of its frame: a site, geom or body (looked up in that order). Foot i is at
    c = frac(t / period_s + offsets[i]) of its cycle; it swings while c < `swing_fraction`, to a target of
    `ground_height` + `swing_height` * sin(pi c / swing_fraction), and stands (target `ground_height`) for the
    rest. With the default half, the target is `ground_height` + `swing_height` * max(sin(2 pi c), 0). Offsets
    (0, 0.5, 0.5, 0) for feet ordered (front right, front left, rear right, rear left) make a trot; a biped's
    (0, 0.5) with `swing_fraction` below one half leaves both feet down between steps (double support).
    Pair it with `GaitPhase` of the same period.
    With `min_command` > 0, under a command whose norm is below it every foot's target is the ground: told to
    stand, the robot stands instead of stepping in place (and drifting).
    """

    feet: tuple[str, ...] = ()
    offsets: tuple[float, ...] = ()
    period_s: float = 0.5
    swing_height: float = 0.08
    ground_height: float = 0.02
    sigma: float = 0.05
    min_command: float = 0.0
    swing_fraction: float = 0.5
    terrain: Terrain | None = None  # heights above its surface (above z = 0 without one)
    points: tuple[Point, ...] = resolved()

    @property
    def command_size(self) -> int | None:
        return 1 if self.min_command > 0 else None  # reads the command only to stand under a zero one

    def bind(self, layout: ModelLayout) -> Self:
        points = feet_points(layout, self.feet, f"{self.name}.feet")
        if len(self.offsets) != len(self.feet):
            raise ConfigError(f"{self.name}.offsets has {len(self.offsets)} values; feet has {len(self.feet)}")
        if self.period_s <= 0 or self.sigma <= 0:
            raise ConfigError(f"{self.name}: period_s={self.period_s} and sigma={self.sigma} must be positive")
        if not 0 < self.swing_fraction < 1:
            raise ConfigError(f"{self.name}.swing_fraction={self.swing_fraction} must be in (0, 1)")
        return with_resolved(self, points=points)

    def value(self, ctx: StepContext) -> Array:
        cycle = jnp.mod(ctx.data.time / self.period_s + jnp.asarray(self.offsets), 1.0)
        lift = jnp.where(cycle < self.swing_fraction, jnp.sin(jnp.pi * cycle / self.swing_fraction), 0.0)
        swing = self.swing_height * lift
        if self.min_command > 0:
            swing = jnp.where(jnp.linalg.norm(ctx.command) < self.min_command, 0.0, swing)
        target = self.ground_height + swing
        positions = jnp.stack([ctx.point_pos(point) for point in self.points])
        heights = height_above_ground(self.terrain, positions)
        return jnp.exp(-jnp.sum(jnp.square(heights - target)) / self.sigma**2)


@dataclass(frozen=True)
class FeetAirTime(Reward, Stateful):
    """At each touchdown, the foot's time in the air minus `threshold_s` (s), summed over the feet.

    Long steps earn, short shuffles cost. The state is per foot: its time since it last left the ground and
    whether it touched at the last step. Contact as in `FeetContact`. With `min_command` > 0 it pays only while
    the command's first two values (a planar velocity) have a norm above it.
    """

    feet: tuple[str, ...] = ()
    threshold_s: float = 0.1
    min_command: float = 0.0
    foot_geoms: tuple[tuple[int, ...], ...] = resolved()

    @property
    def command_size(self) -> int | None:
        return 2 if self.min_command > 0 else None  # reads the command only to gate on it

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, foot_geoms=feet_geoms(layout, self.feet, f"{self.name}.feet"))

    def initial_state(self, layout: ModelLayout) -> dict[str, Array]:
        return {"air_time": jnp.zeros(len(self.feet)), "contact": jnp.ones(len(self.feet), bool)}

    def _contact(self, ctx: StepContext) -> Array:
        return jnp.stack([ctx.in_contact(geoms) for geoms in self.foot_geoms])

    def value(self, ctx: StepContext) -> Array:
        contact = self._contact(ctx)
        air_time = ctx.state["air_time"] + ctx.ctrl_dt
        touchdown = contact & ~ctx.state["contact"]
        total = jnp.sum(jnp.where(touchdown, air_time - self.threshold_s, 0.0))
        if self.min_command > 0:
            total = jnp.where(jnp.linalg.norm(ctx.command[:2]) > self.min_command, total, 0.0)
        return total

    def next_state(self, ctx: StepContext) -> dict[str, Array]:
        contact = self._contact(ctx)
        return {"air_time": jnp.where(contact, 0.0, ctx.state["air_time"] + ctx.ctrl_dt), "contact": contact}


@dataclass(frozen=True)
class BaseVerticalVelocityPenalty(_BaseReward):
    """Squared vertical velocity of the base (its own frame's z axis), m^2/s^2."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.square(ctx.base_lin_vel[2])


@dataclass(frozen=True)
class BaseRollPitchRatePenalty(_BaseReward):
    """Squared roll and pitch rates of the base (its angular velocity about its own x and y axes), summed."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.base_ang_vel[:2]))


@dataclass(frozen=True)
class TiltPenalty(_BaseReward):
    """Squared horizontal part of gravity in the base frame: 0 upright, sin^2 of the tilt angle otherwise."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.projected_gravity[:2]))


@dataclass(frozen=True)
class JointLimitPenalty(Reward):
    """How far the robot joints (or the named ones) are inside the outer `margin` of their range, summed (rad).

    A joint whose position is within `margin` times its range width of a limit, or past it, adds the distance
    by which it is inside that band. Unlimited joints are refused by name.
    """

    margin: float = 0.1
    joints: tuple[str, ...] | None = None
    joint_ids: tuple[int, ...] = resolved()
    ranges: np.ndarray = resolved()  # (joints, 2): each joint's (low, high)

    def bind(self, layout: ModelLayout) -> Self:
        if not 0 <= self.margin < 0.5:
            raise ConfigError(f"{self.name}.margin={self.margin} must be in [0, 0.5)")
        joints = layout.joints(self.joints, f"{self.name}.joints")
        unlimited = [layout.joint_names[j] for j in joints if layout.joint_range[j] is None]
        if unlimited or any(len(layout.joint_qpos[j]) != 1 for j in joints):
            raise ConfigError(f"{self.name}.joints: {unlimited or 'ball joints'} have no range; name limited joints")
        ranges = np.asarray([layout.joint_range[j] for j in joints], np.float32)
        return with_resolved(self, joint_ids=joints, ranges=ranges)

    def value(self, ctx: StepContext) -> Array:
        low, high = jnp.asarray(self.ranges[:, 0]), jnp.asarray(self.ranges[:, 1])
        band = self.margin * (high - low)
        position = ctx.joint_pos_of(self.joint_ids)
        return jnp.sum(jnp.maximum(low + band - position, 0.0) + jnp.maximum(position - (high - band), 0.0))


@dataclass(frozen=True)
class TerminationPenalty(Reward):
    """1 at the step a termination ends the episode (not at a time-limit truncation), else 0."""

    def value(self, ctx: StepContext) -> Array:
        if ctx.terminated is None:
            return jnp.zeros(())
        return ctx.terminated.astype(jnp.float32)


@dataclass(frozen=True)
class StandStill(Reward):
    """Under a command whose norm is below `threshold`: the robot joints' absolute distance from the default
    pose, summed (rad); 0 while the command asks for motion."""

    threshold: float = 0.1
    command_size: ClassVar[int] = 1
    default_pos: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, default_pos=layout.default_joint_pos)

    def value(self, ctx: StepContext) -> Array:
        deviation = jnp.sum(jnp.abs(ctx.joint_pos - jnp.asarray(self.default_pos)))
        return jnp.where(jnp.linalg.norm(ctx.command) < self.threshold, deviation, 0.0)


@dataclass(frozen=True)
class MechanicalPower(Reward):
    """Sum over actuators of |force x joint velocity| (W): the mechanical power the actuators deliver or absorb.

    The force is MuJoCo's for the applied control (gain * ctrl + bias terms, clipped to its force range), so
    the model's actuators must each drive one joint without activation dynamics.
    """

    def bind(self, layout: ModelLayout) -> Self:
        if layout.actuators is None:
            raise ConfigError(
                f"{self.name}: the model has actuators that do not drive one joint each with a fixed or affine gain"
            )
        return self

    def value(self, ctx: StepContext) -> Array:
        table = ctx.layout.actuators
        assert table is not None  # bind() refused such models
        q, qdot = ctx.data.qpos[jnp.asarray(table.qpos)], ctx.data.qvel[jnp.asarray(table.qvel)]
        bias = jnp.asarray(table.bias)
        force = jnp.asarray(table.gain) * ctx.ctrl + bias[:, 0] + bias[:, 1] * q + bias[:, 2] * qdot
        low, high = (jnp.asarray(bound) for bound in zip(*table.force_range, strict=True))
        torque = jnp.clip(force, low, high) * jnp.asarray(table.gear)
        return jnp.sum(jnp.abs(torque * qdot))


@dataclass(frozen=True)
class FeetClearance(Reward):
    """Squared miss of a swing height, weighted by how fast the foot moves sideways: sum over feet of
    (foot height - `height`)^2 * |horizontal foot speed| (m^2 * m/s). A foot standing still costs nothing;
    one that moves is asked to be at `height` (world z of its site, geom or body frame)."""

    feet: tuple[str, ...] = ()
    height: float = 0.1
    points: tuple[Point, ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, points=feet_points(layout, self.feet, f"{self.name}.feet"))

    def value(self, ctx: StepContext) -> Array:
        total = jnp.zeros(())
        for point in self.points:
            speed = jnp.linalg.norm(ctx.point_lin_vel_world(point)[:2])
            total += jnp.square(ctx.point_pos(point)[2] - self.height) * speed
        return total


@dataclass(frozen=True)
class FeetSwingHeight(Reward, Stateful):
    """At each touchdown, the squared miss (m^2) of the highest height the foot reached while in the air
    against `height`, summed over the feet. The state is per foot: its highest point since liftoff and
    whether it touched at the last step."""

    feet: tuple[str, ...] = ()
    height: float = 0.1
    points: tuple[Point, ...] = resolved()
    foot_geoms: tuple[tuple[int, ...], ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        setting = f"{self.name}.feet"
        return with_resolved(
            self, points=feet_points(layout, self.feet, setting), foot_geoms=feet_geoms(layout, self.feet, setting)
        )

    def initial_state(self, layout: ModelLayout) -> dict[str, Array]:
        return {"peak": jnp.zeros(len(self.feet)), "contact": jnp.ones(len(self.feet), bool)}

    def _measure(self, ctx: StepContext) -> tuple[Array, Array]:
        heights = jnp.stack([ctx.point_pos(p)[2] for p in self.points])
        contact = jnp.stack([ctx.in_contact(g) for g in self.foot_geoms])
        return heights, contact

    def value(self, ctx: StepContext) -> Array:
        _, contact = self._measure(ctx)
        touchdown = contact & ~ctx.state["contact"]
        return jnp.sum(jnp.where(touchdown, jnp.square(ctx.state["peak"] - self.height), 0.0))

    def next_state(self, ctx: StepContext) -> dict[str, Array]:
        heights, contact = self._measure(ctx)
        peak = jnp.where(contact, 0.0, jnp.maximum(ctx.state["peak"], heights))
        return {"peak": peak, "contact": contact}


@dataclass(frozen=True)
class UndesiredContacts(Reward):
    """How many of the named geoms or bodies (e.g. thighs, trunk) touch anything outside the robot."""

    bodies: tuple[str, ...] = ()
    part_geoms: tuple[tuple[int, ...], ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, part_geoms=feet_geoms(layout, self.bodies, f"{self.name}.bodies"))

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.stack([ctx.in_contact(geoms) for geoms in self.part_geoms]).astype(jnp.float32))
