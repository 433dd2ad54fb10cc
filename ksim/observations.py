"""Observations: each a small class with one method from a `StepContext` to a vector."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ksim.engine import StepContext

Array = jax.Array


class Observation(ABC):
    """One named piece of the policy's input."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def observe(self, ctx: StepContext) -> Array: ...


def _select(values: Array, indices: tuple[int, ...] | None) -> Array:
    return values if indices is None else values[jnp.asarray(indices)]


@dataclass(frozen=True)
class JointPosition(Observation):
    """Non-root joint positions (all, or those at `indices`), relative to `offset` (e.g. the default pose)."""

    offset: tuple[float, ...] | None = None
    indices: tuple[int, ...] | None = None

    def observe(self, ctx: StepContext) -> Array:
        position = _select(ctx.joint_pos, self.indices)
        return position if self.offset is None else position - jnp.asarray(self.offset)


@dataclass(frozen=True)
class JointVelocity(Observation):
    """Non-root joint velocities (all, or those at `indices`), times `scale`."""

    scale: float = 0.1
    indices: tuple[int, ...] | None = None

    def observe(self, ctx: StepContext) -> Array:
        return _select(ctx.joint_vel, self.indices) * self.scale


@dataclass(frozen=True)
class ProjectedGravity(Observation):
    """Gravity direction in the base frame: base orientation without yaw."""

    def observe(self, ctx: StepContext) -> Array:
        return ctx.projected_gravity


@dataclass(frozen=True)
class BaseOrientation(Observation):
    """Base quaternion (w, x, y, z)."""

    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_quat


@dataclass(frozen=True)
class BaseHeight(Observation):
    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_pos[2:3]


@dataclass(frozen=True)
class BaseLinearVelocity(Observation):
    """Base linear velocity in the base frame."""

    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_lin_vel


@dataclass(frozen=True)
class BaseAngularVelocity(Observation):
    """Base angular velocity in the base frame."""

    scale: float = 0.25

    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_ang_vel * self.scale


@dataclass(frozen=True)
class LastAction(Observation):
    def observe(self, ctx: StepContext) -> Array:
        return ctx.action
