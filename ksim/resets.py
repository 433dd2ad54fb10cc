"""Resets: each a small class perturbing the initial joint state of a new episode.

A reset acts on the robot joints (every joint but the root joints), or on the joints it names (root joints
may be named too).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Self

import jax
import numpy as np

from ksim.binding import resolved, with_resolved
from ksim.engine import ModelLayout

Array = jax.Array


class Reset(ABC):
    def bind(self, layout: ModelLayout) -> Self:
        """This reset with its names resolved; ConfigError if it cannot apply to the model."""
        return self

    @abstractmethod
    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        """Returns the new episode's (qpos, qvel), whole-model vectors."""


@dataclass(frozen=True)
class _JointNoise(Reset):
    scale: float
    joints: tuple[str, ...] | None = None
    qpos_index: np.ndarray = resolved()
    qvel_index: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        joints = layout.joints(self.joints, f"{type(self).__name__}.joints")
        return with_resolved(self, qpos_index=layout.qpos_indices(joints), qvel_index=layout.qvel_indices(joints))

    def noise(self, rng: Array, size: int) -> Array:
        return jax.random.uniform(rng, (size,), minval=-self.scale, maxval=self.scale)


@dataclass(frozen=True)
class RandomJointPositions(_JointNoise):
    """Adds uniform noise in [-scale, scale] to the joints' positions (the robot joints unless named)."""

    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        return qpos.at[self.qpos_index].add(self.noise(rng, len(self.qpos_index))), qvel


@dataclass(frozen=True)
class RandomJointVelocities(_JointNoise):
    """Adds uniform noise in [-scale, scale] to the joints' velocities (the robot joints unless named)."""

    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        return qpos, qvel.at[self.qvel_index].add(self.noise(rng, len(self.qvel_index)))


@dataclass(frozen=True)
class GaussianJointVelocities(_JointNoise):
    """Adds Gaussian noise of standard deviation `scale` to the joints' velocities (the robot joints unless named)."""

    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        return qpos, qvel.at[self.qvel_index].add(self.scale * jax.random.normal(rng, (len(self.qvel_index),)))
