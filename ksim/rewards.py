"""Rewards: each a small class with a `scale` and one method; the env reward is the scaled sum.

Penalties return a non-negative magnitude and take a negative `scale`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ksim.engine import StepContext

Array = jax.Array


@dataclass(frozen=True)
class Reward(ABC):
    scale: float

    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def value(self, ctx: StepContext) -> Array:
        """Unscaled per-step value (a scalar)."""

    def __call__(self, ctx: StepContext) -> Array:
        return self.scale * self.value(ctx)


@dataclass(frozen=True)
class StayAlive(Reward):
    """A constant bonus for every step the episode goes on."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.ones(())


@dataclass(frozen=True)
class Upright(Reward):
    """1 when the base is upright, falling to -1 upside down."""

    def value(self, ctx: StepContext) -> Array:
        return -ctx.projected_gravity[2]


@dataclass(frozen=True)
class ForwardVelocity(Reward):
    """Tracks a target world-frame x velocity: exp(-(v - target)^2 / sigma^2)."""

    target: float = 1.0
    sigma: float = 0.5

    def value(self, ctx: StepContext) -> Array:
        error = ctx.base_lin_vel_world[0] - self.target
        return jnp.exp(-jnp.square(error / self.sigma))


@dataclass(frozen=True)
class ActionRatePenalty(Reward):
    """Squared change of the action since the last step."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.action - ctx.last_action))


@dataclass(frozen=True)
class TorquePenalty(Reward):
    """Squared (normalised) motor control."""

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(ctx.ctrl))


@dataclass(frozen=True)
class JointPositionPenalty(Reward):
    """Squared position of one non-root joint (e.g. keep a cart centred)."""

    joint_index: int = 0

    def value(self, ctx: StepContext) -> Array:
        return jnp.square(ctx.joint_pos[self.joint_index])
