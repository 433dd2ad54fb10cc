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
from ksim.engine import ModelLayout, StepContext, rotate

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
