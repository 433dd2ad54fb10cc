"""Resets: each a small class perturbing the initial (non-root) joint state of a new episode."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import jax

Array = jax.Array


class Reset(ABC):
    @abstractmethod
    def apply(self, joint_pos: Array, joint_vel: Array, rng: Array) -> tuple[Array, Array]:
        """Returns new (joint_pos, joint_vel) for the non-root joints."""


@dataclass(frozen=True)
class RandomJointPositions(Reset):
    """Adds uniform noise in [-scale, scale] to every non-root joint position."""

    scale: float

    def apply(self, joint_pos: Array, joint_vel: Array, rng: Array) -> tuple[Array, Array]:
        noise = jax.random.uniform(rng, joint_pos.shape, minval=-self.scale, maxval=self.scale)
        return joint_pos + noise, joint_vel


@dataclass(frozen=True)
class RandomJointVelocities(Reset):
    """Adds uniform noise in [-scale, scale] to every non-root joint velocity."""

    scale: float

    def apply(self, joint_pos: Array, joint_vel: Array, rng: Array) -> tuple[Array, Array]:
        noise = jax.random.uniform(rng, joint_vel.shape, minval=-self.scale, maxval=self.scale)
        return joint_pos, joint_vel + noise
