"""Resets: each a small class perturbing the initial joint state of a new episode.

A reset acts on the robot joints (every joint but the root joints), or on the joints it names (root joints
may be named too).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import jax

from ksim.engine import ModelLayout

Array = jax.Array


class Reset(ABC):
    def check(self, layout: ModelLayout) -> None:
        """Raises ConfigError if this reset cannot apply to the model."""

    @abstractmethod
    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        """Returns the new episode's (qpos, qvel), whole-model vectors."""


@dataclass(frozen=True)
class _JointNoise(Reset):
    scale: float
    joints: tuple[str, ...] | None = None

    def check(self, layout: ModelLayout) -> None:
        layout.joints(self.joints, f"{type(self).__name__}.joints")

    def noise(self, rng: Array, size: int) -> Array:
        return jax.random.uniform(rng, (size,), minval=-self.scale, maxval=self.scale)


@dataclass(frozen=True)
class RandomJointPositions(_JointNoise):
    """Adds uniform noise in [-scale, scale] to the joints' positions (the robot joints unless named)."""

    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        index = layout.qpos_indices(layout.joints(self.joints))
        return qpos.at[index].add(self.noise(rng, len(index))), qvel


@dataclass(frozen=True)
class RandomJointVelocities(_JointNoise):
    """Adds uniform noise in [-scale, scale] to the joints' velocities (the robot joints unless named)."""

    def apply(self, qpos: Array, qvel: Array, layout: ModelLayout, rng: Array) -> tuple[Array, Array]:
        index = layout.qvel_indices(layout.joints(self.joints))
        return qpos, qvel.at[index].add(self.noise(rng, len(index)))
