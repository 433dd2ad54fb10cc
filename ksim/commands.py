"""Commands: what the policy is asked to do, drawn per env at episode start and advanced every control step.

The task's command (`RLTask.get_command`) is a vector in the `StepContext` (`ctx.command`); the `Command`
observation shows it to the policy and tracking rewards compare the robot's motion to it. A held command (a
velocity) is redrawn at random times; a motion (`ksim.tracking.MotionCommand`) moves one frame per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from ksim.config import ConfigError
from ksim.engine import ModelLayout, StepContext

Array = jax.Array


def steps_in(rng: Array, interval_s: tuple[float, float], ctrl_dt: float) -> Array:
    """A uniform draw from [low, high] seconds, in whole control steps (at least one)."""
    seconds = jax.random.uniform(rng, (), minval=interval_s[0], maxval=interval_s[1])
    return jnp.maximum(jnp.round(seconds / ctrl_dt), 1).astype(jnp.int32)


def require_interval(component: str, setting: str, interval: tuple[float, float], positive: bool = False) -> None:
    low, high = interval
    if low > high:
        raise ConfigError(f"{component}.{setting}=({low}, {high}) is an empty range (low must be <= high)")
    if positive and low <= 0:
        raise ConfigError(f"{component}.{setting}=({low}, {high}) must be positive")


class Command(ABC):
    """A command vector of `size` values per env, with a per-env integer state that every control step
    advances (a held command's timer, a motion's frame). A command may place the robot at an episode's start
    (`start_pose`), end an episode (`ended`: the motion ran out) and sample starts where episodes fail
    (`start_bins` > 0: `record_failures` keeps each env's recent failures per bin)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    @abstractmethod
    def size(self) -> int:
        """The number of values in `ctx.command`."""

    @property
    def start_bins(self) -> int:
        """Bins of the episodes' starts that `record_failures` counts failures in (0: starts ignore failures)."""
        return 0

    def bind(self, layout: ModelLayout) -> Self:
        """This command, checked against the model."""
        return self

    @abstractmethod
    def start(self, rng: Array, ctrl_dt: float, failures: Array, from_beginning: bool) -> tuple[Array, Array]:
        """A new episode's (value, state). `failures` (start_bins,): recent failures per bin over the envs;
        `from_beginning`: an evaluation's start (a motion plays from its first frame)."""

    @abstractmethod
    def advance(self, value: Array, state: Array, rng: Array, ctrl_dt: float) -> tuple[Array, Array]:
        """(value, state) one control step on."""

    def ended(self, state: Array) -> Array:
        """Whether the command has run out (the episode is truncated)."""
        return jnp.zeros((), bool)

    def start_pose(self, state: Array, qpos: Array, qvel: Array) -> tuple[Array, Array]:
        """The episode's initial (qpos, qvel) before the resets perturb it; by default the model's own."""
        return qpos, qvel

    def reference_qpos(self, state: Array) -> Array | None:
        """The pose the command asks the robot to be in at `state` (a motion's frame), drawn beside the robot by the
        viewer and videos; None: nothing to draw."""
        return None

    def measures(self, ctx: StepContext) -> dict[str, Array]:
        """What evaluation averages per episode besides locomotion (a motion: its tracking errors)."""
        return {}

    def record_failures(self, failures: Array, state: Array, terminated: Array, ctrl_dt: float) -> Array:
        """One env's recent failures per start bin (start_bins,) after a control step that ended in `state`."""
        return failures


class HeldCommand(Command):
    """A command drawn by `sample` and held for `resample_s` seconds (a uniform range); its state is the control
    steps left until it is redrawn."""

    size: ClassVar[int]
    resample_s: tuple[float, float]

    def bind(self, layout: ModelLayout) -> Self:
        """This command, checked against the model; ConfigError on empty ranges."""
        require_interval(self.name, "resample_s", self.resample_s, positive=True)
        return self

    @abstractmethod
    def sample(self, rng: Array) -> Array:
        """A new command, shape (size,)."""

    def start(self, rng: Array, ctrl_dt: float, failures: Array, from_beginning: bool) -> tuple[Array, Array]:
        value_key, timer_key = jax.random.split(rng)
        return self.sample(value_key), steps_in(timer_key, self.resample_s, ctrl_dt)

    def advance(self, value: Array, state: Array, rng: Array, ctrl_dt: float) -> tuple[Array, Array]:
        """The command is redrawn when its timer runs out."""
        fresh_value, fresh_timer = self.start(rng, ctrl_dt, jnp.zeros(0), False)
        due = state <= 1
        return jnp.where(due, fresh_value, value), jnp.where(due, fresh_timer, state - 1)


@dataclass(frozen=True)
class VelocityCommand(HeldCommand):
    """Base velocity in the heading frame: (forward m/s, lateral m/s, yaw rate rad/s), each uniform in its
    range; with probability `zero_probability` the command is all zeros (stand still)."""

    forward: tuple[float, float] = (-0.5, 1.0)
    lateral: tuple[float, float] = (-0.3, 0.3)
    yaw_rate: tuple[float, float] = (-0.5, 0.5)
    zero_probability: float = 0.1
    resample_s: tuple[float, float] = (4.0, 8.0)
    size: ClassVar[int] = 3

    def bind(self, layout: ModelLayout) -> Self:
        for setting in ("forward", "lateral", "yaw_rate"):
            require_interval(self.name, setting, getattr(self, setting))
        if not 0.0 <= self.zero_probability <= 1.0:
            raise ConfigError(f"{self.name}.zero_probability={self.zero_probability} must be in [0, 1]")
        layout.require_moving_base(self.name)
        return super().bind(layout)

    def sample(self, rng: Array) -> Array:
        value_key, zero_key = jax.random.split(rng)
        ranges = jnp.asarray([self.forward, self.lateral, self.yaw_rate])
        value = jax.random.uniform(value_key, (3,), minval=ranges[:, 0], maxval=ranges[:, 1])
        return jnp.where(jax.random.bernoulli(zero_key, self.zero_probability), 0.0, value)


def start_command(
    command: Command | None, rng: Array, ctrl_dt: float, failures: Array, from_beginning: bool = False
) -> tuple[Array, Array]:
    """A new episode's (command, command state); empty without a command."""
    if command is None:
        return jnp.zeros(0), jnp.zeros((), jnp.int32)
    return command.start(rng, ctrl_dt, failures, from_beginning)


def advance_command(
    command: Command | None, value: Array, state: Array, rng: Array, ctrl_dt: float
) -> tuple[Array, Array]:
    """(command, command state) one control step on."""
    if command is None:
        return value, state
    return command.advance(value, state, rng, ctrl_dt)


def command_ended(command: Command | None, state: Array) -> Array:
    return jnp.zeros((), bool) if command is None else command.ended(state)


def check_command_users(command: Command | None, components: Sequence[Any]) -> None:
    """Components that read `ctx.command` need the task to have a command of the size they read."""
    for component in components:
        needed = getattr(component, "command_size", None)
        if needed is None:
            continue
        if command is None:
            raise ConfigError(f"{component.name} reads the command, but the task has none (get_command returns None)")
        if command.size < needed:
            raise ConfigError(f"{component.name} reads {needed} command values; {command.name} has {command.size}")
