"""Events: things that happen to an env during an episode at random times (pushes), each with a timer.

Every event waits a uniform [low, high] seconds (`interval_s`), happens just before a control step's
physics, then draws its next wait. The timers live in the `Episode`, so they start again with it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

import jax
import jax.numpy as jnp
import numpy as np

from ksim.binding import resolved, with_resolved
from ksim.commands import require_interval, steps_in
from ksim.config import ConfigError
from ksim.engine import ModelLayout

if TYPE_CHECKING:  # MJX's types only: the native engine runs without importing MJX
    from mujoco import mjx

Array = jax.Array


class Event(ABC):
    interval_s: tuple[float, float]

    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, layout: ModelLayout) -> Self:
        """This event with its names resolved; ConfigError if it cannot apply to the model."""
        require_interval(self.name, "interval_s", self.interval_s, positive=True)
        return self

    @abstractmethod
    def apply(self, data: mjx.Data, layout: ModelLayout, rng: Array) -> mjx.Data:
        """The physics state right after the event; an event changes velocities (`qvel`), not positions."""


@dataclass(frozen=True)
class Push(Event):
    """Kicks the base: adds a world-frame linear velocity, uniform in [-max, max] per axis (m/s), to its
    free joint. Needs a free root (a fixed base cannot be pushed; a planar root is refused too)."""

    max_velocity: tuple[float, float, float] = (0.5, 0.5, 0.0)
    interval_s: tuple[float, float] = (5.0, 10.0)
    linear_dofs: np.ndarray = resolved()  # the free root's world linear velocity in qvel

    def bind(self, layout: ModelLayout) -> Self:
        bound = super().bind(layout)
        if min(self.max_velocity) < 0:
            raise ConfigError(f"{self.name}.max_velocity={self.max_velocity} must be >= 0 on every axis")
        layout.require_moving_base(self.name)
        return with_resolved(bound, linear_dofs=layout.free_root_qvel(self.name)[:3])

    def apply(self, data: mjx.Data, layout: ModelLayout, rng: Array) -> mjx.Data:
        bound = jnp.asarray(self.max_velocity)
        kick = jax.random.uniform(rng, (3,), minval=-bound, maxval=bound)
        return data.replace(qvel=data.qvel.at[self.linear_dofs].add(kick))


def start_event_timers(events: Sequence[Event], rng: Array, ctrl_dt: float) -> Array:
    """Control steps until each event first happens."""
    timers = [steps_in(jax.random.fold_in(rng, index), event.interval_s, ctrl_dt) for index, event in enumerate(events)]
    return jnp.asarray(timers, jnp.int32).reshape(len(events))


def run_events(
    events: Sequence[Event], data: mjx.Data, timers: Array, layout: ModelLayout, rng: Array, ctrl_dt: float
) -> tuple[mjx.Data, Array]:
    """Counts every timer down; an event whose timer runs out happens now and waits again."""
    new_timers = []
    for index, event in enumerate(events):
        apply_key, timer_key = jax.random.split(jax.random.fold_in(rng, index))
        due = timers[index] <= 1
        data = _select(due, event.apply(data, layout, apply_key), data)
        new_timers.append(jnp.where(due, steps_in(timer_key, event.interval_s, ctrl_dt), timers[index] - 1))
    return data, jnp.asarray(new_timers, jnp.int32).reshape(len(events))


def _select(due: Array, after: mjx.Data, before: mjx.Data) -> mjx.Data:
    """`after` where `due`, else `before`; leaves the event left alone are passed through."""
    return jax.tree.map(lambda new, old: old if new is old else jnp.where(due, new, old), after, before)
