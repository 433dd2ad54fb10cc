"""Flax networks: an actor with a state-independent Gaussian head and a critic, MLPs or GRU + MLP.

`ActorCritic` is memoryless. `RecurrentActorCritic` puts a GRU of `recurrent_size` units in front of each
MLP (observation -> GRU -> MLP): the actor and the critic each keep their own GRU state, stacked in one
carry of shape (..., 2, recurrent_size) (index 0: the actor's, 1: the critic's).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

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


def gaussian_log_prob(action: Array, mean: Array, log_std: Array) -> Array:
    """Log-density of a diagonal Gaussian, summed over the action dimensions."""
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: Array) -> Array:
    return jnp.sum(log_std + 0.5 * (1.0 + jnp.log(2.0 * jnp.pi)), axis=-1)
