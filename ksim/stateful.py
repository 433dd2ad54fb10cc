"""Rewards and terminations that keep per-env state across the control steps of an episode.

A stateful component says what its state is when an episode starts (`initial_state`) and how a control step
changes it (`next_state`); both see the step through `StepContext`, whose `state` is the component's own
state before the step. The state lives in the `Episode` (with the env axis in a rollout), starts fresh with
every episode, and is sharded with its envs over devices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ksim.engine import ModelLayout, StepContext


class Stateful(ABC):
    """Mixin of a reward or termination with per-env state (a pytree of arrays, without the env axis)."""

    @abstractmethod
    def initial_state(self, layout: ModelLayout) -> Any:
        """The state at the start of an episode."""

    @abstractmethod
    def next_state(self, ctx: StepContext) -> Any:
        """The state after the control step `ctx` describes (`ctx.state` is the one before it)."""
