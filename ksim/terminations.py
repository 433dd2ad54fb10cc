"""Terminations: each a small class with one method deciding whether an episode has failed."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Self

import jax
import jax.numpy as jnp
import numpy as np

from ksim.binding import resolved, with_resolved
from ksim.config import ConfigError
from ksim.engine import ModelLayout, StepContext
from ksim.observations import feet_geoms
from ksim.terrain import Terrain, height_above_ground

Array = jax.Array


class Termination(ABC):
    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, layout: ModelLayout) -> Self:
        """This termination with its names resolved; ConfigError if it cannot apply to the model."""
        return self

    @abstractmethod
    def terminated(self, ctx: StepContext) -> Array:
        """A boolean scalar."""


@dataclass(frozen=True)
class _BaseTermination(Termination):
    def bind(self, layout: ModelLayout) -> Self:
        layout.require_moving_base(self.name)
        return self


@dataclass(frozen=True)
class BaseTooLow(_BaseTermination):
    """The base is lower than `min_height` above the ground (the terrain's surface below it, if given)."""

    min_height: float
    terrain: Terrain | None = None

    def terminated(self, ctx: StepContext) -> Array:
        return height_above_ground(self.terrain, ctx.base_pos) < self.min_height


@dataclass(frozen=True)
class BaseTilted(_BaseTermination):
    """The base has tilted more than `max_angle` radians from upright."""

    max_angle: float

    def terminated(self, ctx: StepContext) -> Array:
        return -ctx.projected_gravity[2] < jnp.cos(self.max_angle)


@dataclass(frozen=True)
class HealthyRange(_BaseTermination):
    """The base leaves a healthy range: height outside [min_height, max_height] or |pitch| > max_pitch (rad)."""

    min_height: float = -math.inf
    max_height: float = math.inf
    max_pitch: float = math.inf

    def bind(self, layout: ModelLayout) -> Self:
        if self.min_height >= self.max_height:
            raise ConfigError(f"{self.name}: min_height={self.min_height} must be below max_height={self.max_height}")
        if self.max_pitch <= 0:
            raise ConfigError(f"{self.name}: max_pitch={self.max_pitch} must be positive")
        return super().bind(layout)

    def terminated(self, ctx: StepContext) -> Array:
        height = ctx.base_pos[2]
        outside = (height < self.min_height) | (height > self.max_height)
        return outside | (jnp.abs(ctx.base_pitch) > self.max_pitch)


@dataclass(frozen=True)
class JointOutOfRange(Termination):
    """A named joint's |position| exceeds `limit`."""

    joint: str
    limit: float
    joint_ids: tuple[int, ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, joint_ids=layout.joints((self.joint,), f"{self.name}.joint"))

    def terminated(self, ctx: StepContext) -> Array:
        return jnp.any(jnp.abs(ctx.joint_pos_of(self.joint_ids)) > self.limit)


@dataclass(frozen=True)
class JointPositionOutside(Termination):
    """A named one-value joint's position (a slide's or hinge's, root joints included) is not strictly between
    `low` and `high`."""

    joint: str
    low: float = -math.inf
    high: float = math.inf
    qpos_index: int = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        setting = f"{self.name}.joint"
        (joint,) = layout.joints((self.joint,), setting)
        size = len(layout.joint_qpos[joint])
        if size != 1:
            raise ConfigError(f"{setting}={self.joint!r} has {size} position values; name a slide or hinge joint")
        if self.low >= self.high:
            raise ConfigError(f"{self.name}: low={self.low} must be below high={self.high}")
        return with_resolved(self, qpos_index=layout.joint_qpos[joint][0])

    def terminated(self, ctx: StepContext) -> Array:
        position = ctx.data.qpos[self.qpos_index]
        return ~((position > self.low) & (position < self.high))


@dataclass(frozen=True)
class StateOutsideRange(Termination):
    """A position (but those of the joints named in `skip`) or a velocity is not strictly between `low` and
    `high` (Gymnasium's Hopper checks its state this way, leaving out the root's x and z)."""

    low: float = -100.0
    high: float = 100.0
    skip: tuple[str, ...] = ()
    qpos_index: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        skipped = set(layout.qpos_indices(layout.joints(self.skip, f"{self.name}.skip"))) if self.skip else set()
        every = layout.qpos_indices(range(len(layout.joint_names)))
        return with_resolved(self, qpos_index=np.asarray([i for i in every if i not in skipped], np.int32))

    def terminated(self, ctx: StepContext) -> Array:
        state = jnp.concatenate([ctx.data.qpos[self.qpos_index], ctx.data.qvel])
        return ~jnp.all((state > self.low) & (state < self.high))


@dataclass(frozen=True)
class IllegalContact(Termination):
    """One of the named geoms or bodies (e.g. the trunk, the thighs) touches anything outside the robot."""

    bodies: tuple[str, ...]
    geoms: tuple[int, ...] = resolved()  # every named part's colliding geoms

    def bind(self, layout: ModelLayout) -> Self:
        parts = feet_geoms(layout, self.bodies, f"{self.name}.bodies")
        return with_resolved(self, geoms=tuple(g for part in parts for g in part))

    def terminated(self, ctx: StepContext) -> Array:
        return ctx.in_contact(self.geoms)


def physics_diverged(ctx: StepContext) -> Array:
    """Always checked: a NaN/Inf state ends the episode so one bad env cannot poison training."""
    return ~(jnp.all(jnp.isfinite(ctx.data.qpos)) & jnp.all(jnp.isfinite(ctx.data.qvel)))
