"""Flax networks: an MLP actor with a state-independent Gaussian head and an MLP critic."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


class MLP(nn.Module):
    hidden_sizes: Sequence[int]
    out_size: int
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x: Array) -> Array:
        for size in self.hidden_sizes:
            x = nn.tanh(nn.Dense(size, kernel_init=nn.initializers.orthogonal(jnp.sqrt(2.0)))(x))
        return nn.Dense(self.out_size, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class ActorCritic(nn.Module):
    """`__call__(obs) -> (action_mean, action_log_std, value)`; params are a plain dict pytree."""

    action_dim: int
    actor_hidden: Sequence[int] = (256, 256)
    critic_hidden: Sequence[int] = (256, 256)
    init_log_std: float = -0.5

    def setup(self) -> None:
        # A small final actor layer starts the policy near the default pose / zero torque.
        self.actor = MLP(self.actor_hidden, self.action_dim, out_scale=0.01)
        self.critic = MLP(self.critic_hidden, 1, out_scale=1.0)
        self.log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))

    def __call__(self, obs: Array) -> tuple[Array, Array, Array]:
        return (*self.policy(obs), self.value(obs))

    def policy(self, obs: Array) -> tuple[Array, Array]:
        return self.actor(obs), jnp.broadcast_to(self.log_std, (*obs.shape[:-1], self.action_dim))

    def value(self, obs: Array) -> Array:
        return self.critic(obs)[..., 0]


def gaussian_log_prob(action: Array, mean: Array, log_std: Array) -> Array:
    """Log-density of a diagonal Gaussian, summed over the action dimensions."""
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: Array) -> Array:
    return jnp.sum(log_std + 0.5 * (1.0 + jnp.log(2.0 * jnp.pi)), axis=-1)
