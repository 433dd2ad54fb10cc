"""Rewards: each a small class with a `scale` and one method; the env reward is the scaled sum.

Penalties return a non-negative magnitude and take a negative `scale`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from ksim.config import ConfigError
from ksim.engine import ModelLayout, StepContext, body_index, rotate
from ksim.terrain import Terrain, height_above_ground

Array = jax.Array


@dataclass(frozen=True)
class Reward(ABC):
    scale: float

    @property
    def name(self) -> str:
        return type(self).__name__

    def check(self, layout: ModelLayout) -> None:
        """Raises ConfigError if this reward cannot apply to the model."""

    @abstractmethod
    def value(self, ctx: StepContext) -> Array:
        """Unscaled per-step value (a scalar)."""

    def __call__(self, ctx: StepContext) -> Array:
        return self.scale * self.value(ctx)


@dataclass(frozen=True)
class _BaseReward(Reward):
    def check(self, layout: ModelLayout) -> None:
        layout.require_moving_base(self.name)


@dataclass(frozen=True)
class StayAlive(Reward):
    """A constant bonus for every step the episode goes on."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.ones(())


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
class JointPositionPenalty(Reward):
    """Squared position of one named joint (e.g. keep a cart centred)."""

    joint: str = ""

    def check(self, layout: ModelLayout) -> None:
        layout.joints((self.joint,), f"{self.name}.joint")

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.joint_pos_of(ctx.layout.joints((self.joint,)))))


def heading_velocity(ctx: StepContext) -> Array:
    """The base's world linear velocity in its heading frame (yaw only): (forward, lateral, up)."""
    forward = rotate(ctx.base_quat, jnp.array([1.0, 0.0, 0.0]))
    yaw = jnp.arctan2(forward[1], forward[0])
    cos, sin = jnp.cos(yaw), jnp.sin(yaw)
    vx, vy, vz = ctx.base_lin_vel_world
    return jnp.stack([cos * vx + sin * vy, -sin * vx + cos * vy, vz])


@dataclass(frozen=True)
class _TrackingReward(_BaseReward):
    sigma: float = 0.25

    def check(self, layout: ModelLayout) -> None:
        if self.sigma <= 0:
            raise ConfigError(f"{self.name}: sigma={self.sigma} must be positive")
        super().check(layout)


@dataclass(frozen=True)
class LinearVelocityTracking(_TrackingReward):
    """exp(-|v_xy - command_xy|^2 / sigma): heading-frame base velocity against command values 0 and 1."""

    command_size: ClassVar[int] = 2

    def value(self, ctx: StepContext) -> Array:
        error = jnp.sum(jnp.square(heading_velocity(ctx)[:2] - ctx.command[:2]))
        return jnp.exp(-error / self.sigma)


@dataclass(frozen=True)
class AngularVelocityTracking(_TrackingReward):
    """exp(-(yaw rate - command_2)^2 / sigma): the base's world-frame yaw rate against command value 2."""

    command_size: ClassVar[int] = 3

    def value(self, ctx: StepContext) -> Array:
        error = jnp.square(ctx.base_ang_vel_world[2] - ctx.command[2])
        return jnp.exp(-error / self.sigma)


def _check_bodies(component: str, layout: ModelLayout, bodies: tuple[str, ...]) -> None:
    if not bodies:
        raise ConfigError(f"{component}.feet is empty: name the foot bodies")
    for body in bodies:
        body_index(layout.body_names, body, f"{component}.feet")


@dataclass(frozen=True)
class JointPoseDeviation(Reward):
    """Squared distance of the robot joints from `pose` (one value per robot joint, e.g. the home keyframe's)."""

    pose: tuple[float, ...] = ()

    def check(self, layout: ModelLayout) -> None:
        if len(self.pose) != len(layout.robot_joints):
            raise ConfigError(
                f"{self.name}.pose has {len(self.pose)} values; the model has {len(layout.robot_joints)} robot joints"
            )

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.joint_pos - jnp.asarray(self.pose)))


@dataclass(frozen=True)
class FeetSlip(Reward):
    """Squared horizontal speed of the feet that touch the ground (body origin lower than `contact_height`)."""

    feet: tuple[str, ...] = ()
    contact_height: float = 0.03
    terrain: Terrain | None = None  # heights above its surface (above z = 0 without one)

    def check(self, layout: ModelLayout) -> None:
        _check_bodies(self.name, layout, self.feet)

    def value(self, ctx: StepContext) -> Array:
        total = jnp.zeros(())
        for foot in self.feet:
            body = ctx.layout.body_names.index(foot)
            touching = height_above_ground(self.terrain, ctx.body_pos(body)) < self.contact_height
            total += jnp.where(touching, jnp.sum(jnp.square(ctx.body_lin_vel_world(body)[:2])), 0.0)
        return total


@dataclass(frozen=True)
class FootSwingTracking(Reward):
    """Feet follow a gait clock: exp(-sum of (height - target)^2 / sigma^2) over the feet.

    Foot i's target height is `ground_height` + `swing_height` * max(sin(2 pi (t / period_s + offsets[i])), 0):
    it swings in one half of its cycle and stands in the other. Offsets (0, 0.5, 0.5, 0) for feet ordered
    (front right, front left, rear right, rear left) make a trot. Pair it with `GaitPhase` of the same period.
    """

    feet: tuple[str, ...] = ()
    offsets: tuple[float, ...] = ()
    period_s: float = 0.5
    swing_height: float = 0.08
    ground_height: float = 0.02
    sigma: float = 0.05
    terrain: Terrain | None = None  # heights above its surface (above z = 0 without one)

    def check(self, layout: ModelLayout) -> None:
        _check_bodies(self.name, layout, self.feet)
        if len(self.offsets) != len(self.feet):
            raise ConfigError(f"{self.name}.offsets has {len(self.offsets)} values; feet has {len(self.feet)}")
        if self.period_s <= 0 or self.sigma <= 0:
            raise ConfigError(f"{self.name}: period_s={self.period_s} and sigma={self.sigma} must be positive")

    def value(self, ctx: StepContext) -> Array:
        phase = 2 * jnp.pi * (ctx.data.time / self.period_s + jnp.asarray(self.offsets))
        target = self.ground_height + self.swing_height * jnp.maximum(jnp.sin(phase), 0.0)
        positions = jnp.stack([ctx.body_pos(ctx.layout.body_names.index(foot)) for foot in self.feet])
        heights = height_above_ground(self.terrain, positions)
        return jnp.exp(-jnp.sum(jnp.square(heights - target)) / self.sigma**2)
