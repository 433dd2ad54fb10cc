"""Flax networks: an actor with a state-independent Gaussian head and a critic, MLPs or GRU + MLP, and the one
interface the learner uses them through (`PolicyNetwork`: `Feedforward`, `Recurrent`).

`ActorCritic` is memoryless. `RecurrentActorCritic` puts a GRU of `recurrent_size` units in front of each
MLP (observation -> GRU -> MLP): the actor and the critic each keep their own GRU state, stacked in one
carry of shape (..., 2, recurrent_size) (index 0: the actor's, 1: the critic's).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from ksim.learner.memory import unroll

Array = jax.Array
ACTIVATIONS = {"tanh": nn.tanh, "elu": nn.elu, "silu": nn.silu, "relu": nn.relu}


class MLP(nn.Module):
    hidden_sizes: Sequence[int]
    out_size: int
    out_scale: float = 1.0
    activation: str = "tanh"  # a key of ACTIVATIONS

    @nn.compact
    def __call__(self, x: Array) -> Array:
        # One row per sample: the weights' gradient of a dot over (envs, steps, features) contracts two axes,
        # which XLA:CPU runs as a slow loop; on rows it is one matrix product (the hopper's update about 2x faster).
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        activation = ACTIVATIONS[self.activation]
        for size in self.hidden_sizes:
            x = activation(nn.Dense(size, kernel_init=nn.initializers.orthogonal(jnp.sqrt(2.0)))(x))
        x = nn.Dense(self.out_size, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)
        return x.reshape(*lead, self.out_size)


class ActorCritic(nn.Module):
    """`__call__(obs) -> (action_mean, action_log_std, value)`; params are a plain dict pytree.

    With `estimate_size > 0`, an estimator MLP predicts that many values from the actor's input and the actor
    reads them beside it (concurrent state estimation); only the estimator's own regression loss trains it.
    """

    action_dim: int
    actor_hidden: Sequence[int] = (256, 256)
    critic_hidden: Sequence[int] = (256, 256)
    init_log_std: float = -0.5
    estimate_size: int = 0
    estimator_hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    def setup(self) -> None:
        # A small final actor layer starts the policy near the default pose / zero torque.
        self.actor = MLP(self.actor_hidden, self.action_dim, out_scale=0.01, activation=self.activation)
        self.critic = MLP(self.critic_hidden, 1, out_scale=1.0, activation=self.activation)
        self.log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))
        if self.estimate_size:
            self.estimator = MLP(self.estimator_hidden, self.estimate_size, activation=self.activation)

    def __call__(self, obs: Array, critic_obs: Array | None = None) -> tuple[Array, Array, Array]:
        return (*self.policy(obs), self.value(obs if critic_obs is None else critic_obs))

    def estimate(self, obs: Array) -> Array:
        """The estimator's prediction from the actor's input (`estimate_size` values)."""
        return self.estimator(obs)

    def policy(self, obs: Array) -> tuple[Array, Array]:
        actor_input = obs
        if self.estimate_size:
            # The policy gradient stops at the estimate: the estimator learns what it is told to predict.
            actor_input = jnp.concatenate([obs, jax.lax.stop_gradient(self.estimate(obs))], axis=-1)
        return self.actor(actor_input), jnp.broadcast_to(self.log_std, (*obs.shape[:-1], self.action_dim))

    def value(self, obs: Array) -> Array:
        return self.critic(obs)[..., 0]


ACTOR, CRITIC = 0, 1  # where each network's GRU state sits in a recurrent carry (..., 2, recurrent_size)


class RecurrentActorCritic(nn.Module):
    """One control step: `__call__(carry, obs, critic_obs) -> (carry, action_mean, action_log_std, value)`."""

    action_dim: int
    recurrent_size: int
    actor_hidden: Sequence[int] = (256, 256)
    critic_hidden: Sequence[int] = (256, 256)
    init_log_std: float = -0.5
    activation: str = "tanh"

    def setup(self) -> None:
        self.actor_memory = nn.GRUCell(self.recurrent_size)
        self.critic_memory = nn.GRUCell(self.recurrent_size)
        self.actor = MLP(self.actor_hidden, self.action_dim, out_scale=0.01, activation=self.activation)
        self.critic = MLP(self.critic_hidden, 1, out_scale=1.0, activation=self.activation)
        self.log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))

    def __call__(self, carry: Array, obs: Array, critic_obs: Array) -> tuple[Array, Array, Array, Array]:
        actor_carry, mean, log_std = self.policy(carry[..., ACTOR, :], obs)
        critic_carry, value = self.value(carry[..., CRITIC, :], critic_obs)
        return jnp.stack([actor_carry, critic_carry], axis=-2), mean, log_std, value

    def policy(self, actor_carry: Array, obs: Array) -> tuple[Array, Array, Array]:
        """(the actor's next GRU state, action mean, action log std)."""
        actor_carry, features = self.actor_memory(actor_carry, obs)
        log_std = jnp.broadcast_to(self.log_std, (*obs.shape[:-1], self.action_dim))
        return actor_carry, self.actor(features), log_std

    def value(self, critic_carry: Array, critic_obs: Array) -> tuple[Array, Array]:
        """(the critic's next GRU state, value)."""
        critic_carry, features = self.critic_memory(critic_carry, critic_obs)
        return critic_carry, self.critic(features)[..., 0]


class PolicyNetwork(ABC):
    """The actor and the critic as the learner uses them, whichever networks they are. Every method takes the
    per-env `carry` (..., 2, carry_size): the actor's and the critic's memory, (..., 2, 0) without one; inputs are
    normalised, and `critic_obs` is the critic's own input or else the actor's."""

    module: nn.Module

    @property
    def carry_size(self) -> int:
        return 0

    @abstractmethod
    def init(self, rng: Array, obs: Array, critic_obs: Array) -> Any:
        """Fresh parameters for inputs shaped like `obs` and `critic_obs` (a batch of one)."""

    @abstractmethod
    def act(self, params: Any, carry: Array, obs: Array, critic_obs: Array | None) -> tuple[Array, Array, Array]:
        """One control step: (action mean, action log std, next carry). With `critic_obs` (a training rollout) a
        critic with memory steps along, so that the update can replay both from the rollout's start."""

    @abstractmethod
    def replay(
        self, params: Any, carry: Array | None, obs: Array, critic_obs: Array, starts: Array | None
    ) -> tuple[Array, Array, Array, Array | None]:
        """Time-major sequences (T, E, ...) from `carry` (E, 2, N), zeroed where `starts`: each step's (action mean,
        action log std, value) and the carry after it. Without memory, steps in any layout (carry, starts: None)."""

    @abstractmethod
    def value_after(self, params: Any, carries: Array | None, critic_obs: Array) -> Array:
        """The value of `critic_obs` one step after `carries` (a rollout's next states)."""

    def action_mean(self, params: Any, obs: Array) -> Array:
        """The action mean of memoryless inputs (the symmetry loss)."""
        raise NotImplementedError(f"{type(self).__name__} has no memoryless action mean")

    def estimate(self, params: Any, obs: Array) -> Array:
        """The estimator's prediction from the actor's input (concurrent state estimation)."""
        raise NotImplementedError(f"{type(self).__name__} has no estimator")


@dataclass(frozen=True)
class Feedforward(PolicyNetwork):
    """MLPs (`ActorCritic`): no memory, every step at once."""

    module: ActorCritic

    def init(self, rng: Array, obs: Array, critic_obs: Array) -> Any:
        return self.module.init(rng, obs, critic_obs)

    def act(self, params: Any, carry: Array, obs: Array, critic_obs: Array | None) -> tuple[Array, Array, Array]:
        mean, log_std = cast(tuple[Array, Array], self.module.apply(params, obs, method=ActorCritic.policy))
        return mean, log_std, carry

    def replay(
        self, params: Any, carry: Array | None, obs: Array, critic_obs: Array, starts: Array | None
    ) -> tuple[Array, Array, Array, Array | None]:
        mean, log_std, value = cast(tuple[Array, Array, Array], self.module.apply(params, obs, critic_obs))
        return mean, log_std, value, carry

    def value_after(self, params: Any, carries: Array | None, critic_obs: Array) -> Array:
        return cast(Array, self.module.apply(params, critic_obs, method=ActorCritic.value))

    def action_mean(self, params: Any, obs: Array) -> Array:
        return cast(tuple[Array, Array], self.module.apply(params, obs, method=ActorCritic.policy))[0]

    def estimate(self, params: Any, obs: Array) -> Array:
        return cast(Array, self.module.apply(params, obs, method=ActorCritic.estimate))


@dataclass(frozen=True)
class Recurrent(PolicyNetwork):
    """GRUs in front of the MLPs (`RecurrentActorCritic`): replayed step by step from a rollout's first carry."""

    module: RecurrentActorCritic

    @property
    def carry_size(self) -> int:
        return self.module.recurrent_size

    def init(self, rng: Array, obs: Array, critic_obs: Array) -> Any:
        return self.module.init(rng, jnp.zeros((1, 2, self.carry_size)), obs, critic_obs)

    def act(self, params: Any, carry: Array, obs: Array, critic_obs: Array | None) -> tuple[Array, Array, Array]:
        module = self.module
        actor_carry, mean, log_std = cast(
            tuple[Array, Array, Array],
            module.apply(params, carry[..., ACTOR, :], obs, method=RecurrentActorCritic.policy),
        )
        critic_carry = carry[..., CRITIC, :]
        if critic_obs is not None:
            critic_carry, _ = module.apply(params, critic_carry, critic_obs, method=RecurrentActorCritic.value)
        return mean, log_std, jnp.stack([actor_carry, critic_carry], axis=-2)

    def replay(
        self, params: Any, carry: Array | None, obs: Array, critic_obs: Array, starts: Array | None
    ) -> tuple[Array, Array, Array, Array | None]:
        assert carry is not None and starts is not None, "a recurrent replay starts from a carry and knows the starts"

        def step(carry: Array, obs: Array, critic_obs: Array) -> tuple[Array, Array, Array, Array]:
            return cast(tuple[Array, Array, Array, Array], self.module.apply(params, carry, obs, critic_obs))

        return unroll(step, carry, obs, critic_obs, starts)

    def value_after(self, params: Any, carries: Array | None, critic_obs: Array) -> Array:
        assert carries is not None
        method = RecurrentActorCritic.value
        return cast(tuple[Array, Array], self.module.apply(params, carries[..., CRITIC, :], critic_obs, method=method))[
            1
        ]


def gaussian_log_prob(action: Array, mean: Array, log_std: Array) -> Array:
    """Log-density of a diagonal Gaussian, summed over the action dimensions."""
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: Array) -> Array:
    return jnp.sum(log_std + 0.5 * (1.0 + jnp.log(2.0 * jnp.pi)), axis=-1)
