"""The policy's memory: its last K observation frames and its GRU state, per env, and replaying a rollout.

With `observation_history=K` the network's input is the last K observation frames, oldest first, each as
the policy saw it (noised once, when it arrived); at an episode's first step every slot holds its first
frame. With `recurrent_size=N` the actor's and the critic's GRU states travel with the env and start from
zeros with every episode. Both live in `PolicyState`, a field of the env's `Episode` (so it has the env
axis and pmap shards it). The update replays each trajectory from the state recorded at the rollout's
start, zeroing it where an episode starts inside the rollout (truncated backpropagation through time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array
# (params, carry, obs, critic_obs) -> (carry, action mean, action log std, value): one step of a batch of envs.
RecurrentStep = Callable[[Array, Array, Array], tuple[Array, Array, Array, Array]]


class PolicyState(struct.PyTreeNode):
    """One env's policy memory: empty arrays for a memoryless policy."""

    past_frames: Array  # (observation_history - 1, observation size): the frames before the current one
    carry: Array  # (2, recurrent_size): the actor's and the critic's GRU states


@dataclass(frozen=True)
class PolicyMemory:
    """How much a policy remembers: `history` observation frames of `frame_size` values, `recurrent_size`
    GRU units (0: none)."""

    history: int
    recurrent_size: int
    frame_size: int

    @property
    def input_size(self) -> int:
        return self.history * self.frame_size

    def initial_state(self) -> PolicyState:
        """A new episode's state (one env): no past frames yet, GRU states at zero."""
        return PolicyState(
            past_frames=jnp.zeros((self.history - 1, self.frame_size)),
            carry=jnp.zeros((2, self.recurrent_size)),
        )

    def network_input(self, state: PolicyState, frame: Array, first: Array) -> Array:
        """The last `history` frames ending with `frame`, flattened; at an episode's first step all are `frame`.
        (Also for a batch of envs: leading axes on every argument.)"""
        if self.history == 1:
            return frame
        newest = frame[..., None, :]
        past = jnp.where(first, jnp.broadcast_to(newest, state.past_frames.shape), state.past_frames)
        return jnp.concatenate([past, newest], axis=-2).reshape(*frame.shape[:-1], self.input_size)

    def past_frames(self, network_input: Array) -> Array:
        """What the next step keeps of this step's input: its newest `history - 1` frames."""
        frames = network_input.reshape(*network_input.shape[:-1], self.history, self.frame_size)
        return frames[..., 1:, :]

    def next_input(self, network_input: Array, next_frame: Array) -> Array:
        """The input one step on (the same episode, before any reset): drop the oldest frame, add `next_frame`."""
        return jnp.concatenate([network_input[..., self.frame_size :], next_frame], axis=-1)

    def newest_frame(self, network_input: Array) -> Array:
        return network_input[..., self.input_size - self.frame_size :]


def episode_starts(done: Array) -> Array:
    """Time-major (T, E): whether step t starts an episode inside the rollout (one ended at t - 1). Step 0
    carries on from the recorded state, which is already a fresh one where an episode started there."""
    return jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0)


def unroll(
    step: RecurrentStep, carry: Array, obs: Array, critic_obs: Array, starts: Array
) -> tuple[Array, Array, Array, Array]:
    """Replays time-major sequences (T, E, ...) from `carry` (E, 2, N), the state before step 0.

    Returns each step's (action mean, action log std, value) and the carry after it; the carry is zeroed
    before every step that starts an episode, as the rollout's envs did.
    """

    def body(carry: Array, inputs: tuple[Array, Array, Array]) -> tuple[Array, tuple[Array, ...]]:
        obs_t, critic_obs_t, start_t = inputs
        carry = jnp.where(start_t[:, None, None], 0.0, carry)
        carry, mean, log_std, value = step(carry, obs_t, critic_obs_t)
        return carry, (mean, log_std, value, carry)

    _, (mean, log_std, value, carries) = jax.lax.scan(body, carry, (obs, critic_obs, starts))
    return mean, log_std, value, carries
