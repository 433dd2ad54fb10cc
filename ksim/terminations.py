"""Terminations: each a small class with one method deciding whether an episode has failed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ksim.engine import StepContext

Array = jax.Array


class Termination(ABC):
    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def terminated(self, ctx: StepContext) -> Array:
        """A boolean scalar."""


@dataclass(frozen=True)
class BaseTooLow(Termination):
    min_height: float

    def terminated(self, ctx: StepContext) -> Array:
        return ctx.base_pos[2] < self.min_height


@dataclass(frozen=True)
class BaseTilted(Termination):
    """The base has tilted more than `max_angle` radians from upright."""

    max_angle: float

    def terminated(self, ctx: StepContext) -> Array:
        return -ctx.projected_gravity[2] < jnp.cos(self.max_angle)


@dataclass(frozen=True)
class JointOutOfRange(Termination):
    """A non-root joint's |position| exceeds `limit`."""

    joint_index: int
    limit: float

    def terminated(self, ctx: StepContext) -> Array:
        return jnp.abs(ctx.joint_pos[self.joint_index]) > self.limit


def physics_diverged(ctx: StepContext) -> Array:
    """Always checked: a NaN/Inf state ends the episode so one bad env cannot poison training."""
    return ~(jnp.all(jnp.isfinite(ctx.data.qpos)) & jnp.all(jnp.isfinite(ctx.data.qvel)))
