"""PPOTask: GAE, the clipped PPO objective and epochs of shuffled minibatches of whole trajectories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import xax
from flax import struct

from ksim.config import ConfigError, require_non_negative, require_positive
from ksim.networks import ActorCritic, gaussian_entropy, gaussian_log_prob
from ksim.task.rl import Metrics, RLConfig, RLTask, SharedState
from ksim.task.types import Trajectory

Array = jax.Array


@dataclass
class PPOConfig(RLConfig):
    learning_rate: float = xax.field(3e-4, help="Adam learning rate.")
    gamma: float = xax.field(0.99, help="Discount factor.")
    gae_lambda: float = xax.field(0.95, help="GAE lambda.")
    clip_eps: float = xax.field(0.2, help="PPO ratio clipping.")
    value_clip_eps: float = xax.field(0.2, help="Value clipping around the rollout's values (0 disables).")
    entropy_coef: float = xax.field(1e-3, help="Entropy bonus weight.")
    value_coef: float = xax.field(0.5, help="Value loss weight.")
    max_grad_norm: float = xax.field(1.0, help="Global gradient-norm clip after any cross-device average (0: off).")
    normalize_advantages: bool = xax.field(True, help="Normalise advantages per minibatch.")
    actor_hidden: list[int] = xax.field(lambda: [256, 256], help="Actor MLP hidden sizes.")
    critic_hidden: list[int] = xax.field(lambda: [256, 256], help="Critic MLP hidden sizes.")
    init_log_std: float = xax.field(-0.5, help="Initial log standard deviation of the Gaussian policy.")


PPOConfigT = TypeVar("PPOConfigT", bound=PPOConfig)


class PPOBatch(struct.PyTreeNode):
    """Env-major training data: leaves are (num_envs, rollout_length, ...)."""

    obs: Array
    action: Array
    log_prob: Array
    value: Array
    advantage: Array
    returns: Array


def compute_gae(
    reward: Array,
    value: Array,
    next_value: Array,
    terminated: Array,
    done: Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[Array, Array]:
    """Time-major GAE. `next_value` is V of the true next state (before any reset).

    A terminated step bootstraps with zero; a truncated one with V(next state); and the advantage
    recursion stops at every episode end (`done`), including across rollout boundaries.
    """
    delta = reward + gamma * next_value * (1.0 - terminated) - value

    def backward(next_advantage: Array, step: tuple[Array, Array]) -> tuple[Array, Array]:
        delta_t, done_t = step
        advantage = delta_t + gamma * gae_lambda * (1.0 - done_t) * next_advantage
        return advantage, advantage

    _, advantage = jax.lax.scan(backward, jnp.zeros_like(delta[0]), (delta, done.astype(delta.dtype)), reverse=True)
    return advantage, advantage + value


def ppo_loss(
    model: nn.Module, params: Any, batch: PPOBatch, config: PPOConfig, advantage: Array
) -> tuple[Array, Metrics]:
    """Clipped surrogate + clipped value loss - entropy bonus, on one minibatch."""
    mean, log_std, value = cast(tuple[Array, Array, Array], model.apply(params, batch.obs))
    log_ratio = gaussian_log_prob(batch.action, mean, log_std) - batch.log_prob
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -jnp.mean(jnp.minimum(ratio * advantage, clipped_ratio * advantage))
    value_error = jnp.square(value - batch.returns)
    if config.value_clip_eps > 0:
        clipped_value = batch.value + jnp.clip(value - batch.value, -config.value_clip_eps, config.value_clip_eps)
        value_error = jnp.maximum(value_error, jnp.square(clipped_value - batch.returns))
    value_loss = 0.5 * jnp.mean(value_error)
    entropy = jnp.mean(gaussian_entropy(log_std))
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    metrics = {
        "loss": loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > config.clip_eps).astype(jnp.float32)),
    }
    return loss, metrics


class PPOTask(RLTask[PPOConfigT]):
    """PPO on an RLTask: subclasses add only the robot (model file and components)."""

    def validate_config(self) -> None:
        super().validate_config()
        config = self.config
        require_positive(config, "learning_rate", "clip_eps")
        require_non_negative(config, "max_grad_norm", "value_clip_eps", "entropy_coef", "value_coef")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(config, name) <= 1.0:
                raise ConfigError(f"{name}={getattr(config, name)} must be in [0, 1]")

    def get_model(self) -> nn.Module:
        return ActorCritic(
            action_dim=self.engine.action_dim,
            actor_hidden=tuple(self.config.actor_hidden),
            critic_hidden=tuple(self.config.critic_hidden),
            init_log_std=self.config.init_log_std,
        )

    def get_optimizer(self) -> optax.GradientTransformation:
        adam = optax.adam(self.config.learning_rate)
        if self.config.max_grad_norm == 0:
            return adam
        return optax.chain(optax.clip_by_global_norm(self.config.max_grad_norm), adam)

    def normalize_obs(self, shared: SharedState, obs: Array) -> Array:
        return shared.normalizer.normalize(obs) if self.config.normalize_observations else obs

    def sample_action(self, shared: SharedState, obs: Array, rng: Array, deterministic: bool = False) -> Array:
        obs = self.normalize_obs(shared, obs)
        mean, log_std = cast(tuple[Array, Array], self.model.apply(shared.params, obs, method=ActorCritic.policy))
        if deterministic:
            return mean
        return mean + jnp.exp(log_std) * jax.random.normal(rng, mean.shape)

    def sync_gradients(self, grads: Any) -> Any:
        """Hook before the optimizer step; DistributedPPOTask averages gradients over devices here."""
        return grads

    def prepare_batch(self, shared: SharedState, trajectory: Trajectory) -> PPOBatch:
        """Log-probs, values and GAE under the rollout's params, reordered env-major."""
        obs = self.normalize_obs(shared, trajectory.obs)
        mean, log_std, value = cast(tuple[Array, Array, Array], self.model.apply(shared.params, obs))
        next_obs = self.normalize_obs(shared, trajectory.next_obs)
        next_value = cast(Array, self.model.apply(shared.params, next_obs, method=ActorCritic.value))
        done = trajectory.terminated | trajectory.truncated
        advantage, returns = compute_gae(
            trajectory.reward,
            value,
            next_value,
            trajectory.terminated.astype(value.dtype),
            done,
            self.config.gamma,
            self.config.gae_lambda,
        )
        log_prob = gaussian_log_prob(trajectory.action, mean, log_std)
        batch = PPOBatch(obs, trajectory.action, log_prob, value, advantage, returns)
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)

    def normalize_advantage(self, advantage: Array) -> Array:
        """Standardises with the whole minibatch's statistics (over every device's part of it)."""
        if not self.config.normalize_advantages:
            return advantage
        mean = self.cross_device_mean(jnp.mean(advantage))
        var = self.cross_device_mean(jnp.mean(jnp.square(advantage - mean)))
        return (advantage - mean) / jnp.sqrt(var + 1e-8)

    def update_shard(self, shared: SharedState, trajectory: Trajectory, rng: Array) -> tuple[SharedState, Metrics]:
        """`num_passes` epochs over shuffled minibatches of this shard's whole env trajectories."""
        batch = self.prepare_batch(shared, trajectory)
        shard_envs = batch.advantage.shape[0]
        envs_per_minibatch = shard_envs // self.num_minibatches
        grad_fn = jax.grad(lambda p, b, a: ppo_loss(self.model, p, b, self.config, a), has_aux=True)

        def minibatch_step(carry: tuple[Any, Any], minibatch: PPOBatch) -> tuple[tuple[Any, Any], Metrics]:
            params, opt_state = carry
            grads, metrics = grad_fn(params, minibatch, self.normalize_advantage(minibatch.advantage))
            metrics["local_grad_norm"] = optax.tree.norm(grads)
            grads = self.sync_gradients(grads)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry: tuple[Any, Any], key: Array) -> tuple[tuple[Any, Any], Metrics]:
            order = jax.random.permutation(key, shard_envs)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape(self.num_minibatches, envs_per_minibatch, *x.shape[1:]), batch
            )
            return jax.lax.scan(minibatch_step, carry, minibatches)

        keys = jax.random.split(rng, self.config.num_passes)
        (params, opt_state), metrics = jax.lax.scan(epoch, (shared.params, shared.opt_state), keys)
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["value_mean"] = jnp.mean(batch.value)
        self.debug_print("update", {k: metrics[k] for k in ("loss", "local_grad_norm", "approx_kl")})
        return shared.replace(params=params, opt_state=opt_state), self.cross_device_mean(metrics)
