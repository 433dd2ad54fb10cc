"""The PPO update as pure functions, apart from any task: GAE, the clipped loss, one minibatch's optimizer
step and the epochs of shuffled minibatches (`ppo_epochs`). `PPOTask` calls them with its model and config;
they are testable on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ksim.learner.networks import PolicyNetwork, gaussian_entropy, gaussian_log_prob

Array = jax.Array
Metrics = dict[str, Array]


class LossSettings(Protocol):
    """The settings the loss reads (a PPOConfig has them)."""

    clip_eps: float
    value_clip_eps: float
    value_coef: float
    entropy_coef: float
    symmetry_coef: float
    estimator_coef: float


class PPOBatch(struct.PyTreeNode):
    """Env-major training data: leaves are (num_envs, rollout_length, ...), but `carry` (num_envs, 2, N)."""

    obs: Array  # the actor's normalised input
    action: Array
    log_prob: Array
    value: Array
    advantage: Array
    returns: Array
    critic_obs: Array | None = None  # the critic's own normalised input (None: it reads `obs`)
    carry: Array | None = None  # recurrent policies: the GRU states before the rollout's first step
    starts: Array | None = None  # recurrent policies: where an episode starts inside the rollout
    mean: Array | None = None  # the rollout policy's action mean and log std (for the analytic KL)
    log_std: Array | None = None
    mirror_obs: Array | None = None  # the symmetry loss: the normalised mirror image of the actor's raw input
    mirror_target: Array | None = None  # and the mirror image of the rollout policy's action mean
    estimate_target: Array | None = None  # the estimator's targets: the estimated critic observations, normalised


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


def network_outputs(network: PolicyNetwork, params: Any, batch: PPOBatch) -> tuple[Array, Array, Array]:
    """(action mean, action log std, value) of every step of the batch's env-major trajectories; a network with
    memory replays each from its recorded carry (truncated backpropagation through the rollout)."""
    critic_obs = batch.obs if batch.critic_obs is None else batch.critic_obs
    if batch.carry is None:  # no memory: the steps at once, in the batch's own layout
        mean, log_std, value, _ = network.replay(params, None, batch.obs, critic_obs, None)
        return mean, log_std, value
    time_major = [None if x is None else jnp.swapaxes(x, 0, 1) for x in (batch.obs, critic_obs, batch.starts)]
    mean, log_std, value, _ = network.replay(params, batch.carry, *time_major)  # type: ignore[arg-type]
    return jnp.swapaxes(mean, 0, 1), jnp.swapaxes(log_std, 0, 1), jnp.swapaxes(value, 0, 1)


def ppo_loss(
    network: PolicyNetwork, params: Any, batch: PPOBatch, config: LossSettings, advantage: Array
) -> tuple[Array, Metrics]:
    """Clipped surrogate + clipped value loss - entropy bonus (+ the symmetry loss where the batch has mirror
    images, + the estimator's mean squared error where it has estimate targets), on one minibatch."""
    mean, log_std, value = network_outputs(network, params, batch)
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
    if batch.mean is not None and batch.log_std is not None:
        kl = gaussian_kl(batch.mean, batch.log_std, mean, log_std)
        metrics["kl"] = jax.lax.stop_gradient(jnp.mean(kl))
    if batch.mirror_obs is not None and batch.mirror_target is not None:
        symmetry = symmetry_loss(network, params, batch.mirror_obs, batch.mirror_target)
        metrics["symmetry_loss"] = symmetry
        loss = loss + config.symmetry_coef * symmetry
        metrics["loss"] = loss
    if batch.estimate_target is not None:
        estimate = network.estimate(params, batch.obs)
        estimator_loss = jnp.mean(jnp.square(estimate - batch.estimate_target))
        metrics["estimator_loss"] = estimator_loss
        loss = loss + config.estimator_coef * estimator_loss
        metrics["loss"] = loss
    return loss, metrics


def symmetry_loss(network: PolicyNetwork, params: Any, mirror_obs: Array, mirror_target: Array) -> Array:
    """rsl_rl's mirror loss: the mean squared distance between the action mean on mirrored inputs and the mirror
    image of the rollout's action mean."""
    return jnp.mean(jnp.square(network.action_mean(params, mirror_obs) - mirror_target))


def gaussian_kl(mean: Array, log_std: Array, new_mean: Array, new_log_std: Array) -> Array:
    """KL(old || new) of two diagonal Gaussians, summed over the action dimensions."""
    variance_ratio = jnp.exp(2.0 * (log_std - new_log_std))
    mean_term = jnp.square(mean - new_mean) * jnp.exp(-2.0 * new_log_std)
    return jnp.sum(new_log_std - log_std + 0.5 * (variance_ratio + mean_term) - 0.5, axis=-1)


def adapt_learning_rate(
    learning_rate: Array, kl: Array, desired_kl: float | Array, min_learning_rate: float, max_learning_rate: float
) -> Array:
    """rsl_rl's adaptive rule: divide by 1.5 where the KL is over twice `desired_kl`, multiply by 1.5 where it
    is under half of it, within [min_learning_rate, max_learning_rate]."""
    lower, raise_ = kl > 2.0 * desired_kl, (kl < 0.5 * desired_kl) & (kl > 0.0)
    adapted = jnp.where(lower, learning_rate / 1.5, jnp.where(raise_, learning_rate * 1.5, learning_rate))
    return jnp.clip(adapted, min_learning_rate, max_learning_rate)


# The power of num_envs / reference_num_envs that scales the adaptive KL target; the clip takes half of it.
KL_TARGET_POWER = Fraction(3, 4)


def scaled_desired_kl(desired_kl: float, num_envs: int, reference_num_envs: int) -> float:
    """The adaptive rule's KL target for `num_envs` envs, from `desired_kl` tuned at `reference_num_envs`
    (0: no reference, no scaling): times (num_envs / reference_num_envs) ** (3/4).

    The adaptive rule holds each update's KL from the rollout's policy near its target whatever the batch, so
    without this a larger batch buys a better-aimed step of the same size, not a larger one (docs/training.md,
    "Adding envs"). At k times the envs a train step makes k times the optimizer steps, which at an unchanged rate
    would move the policy k (steps that are noise) to k ** 2 (steps that agree) times as far in KL. A target
    sqrt(k) times as large made the rule halve K-Bot's rate at 8x the envs and bought 3.3x fewer train steps to its
    target; k ** (3/4) bought 4.3x (docs/multi-device.md)."""
    if reference_num_envs <= 0:
        return desired_kl
    return desired_kl * (num_envs / reference_num_envs) ** float(KL_TARGET_POWER)


def scaled_clip_eps(clip_eps: float, num_envs: int, reference_num_envs: int) -> float:
    """The ratio clip for `num_envs` envs where the KL target follows `scaled_desired_kl`: times
    (num_envs / reference_num_envs) ** (3/8), the square root of the KL target's factor (0: no reference, no
    scaling).

    A KL of d between nearby policies spreads the log-ratios over about sqrt(2 d), so a KL target m times as
    large needs a clip sqrt(m) times as wide to clip the same share of samples; with the clip left as it was,
    K-Bot at 8x the envs clipped 53% of them (27-33% at the reference) and the wider target bought less."""
    if reference_num_envs <= 0:
        return clip_eps
    return clip_eps * (num_envs / reference_num_envs) ** float(KL_TARGET_POWER / 2)


def scaled_average_decay(decay: float, num_envs: int, reference_num_envs: int) -> float:
    """The parameters' moving-average decay for `num_envs` envs, from `decay` tuned at `reference_num_envs` (0: no
    reference, no scaling): 1 - (1 - decay) * num_envs / reference_num_envs, at least 0.

    The average spans about 1 / (1 - decay) train steps. At k times the envs a train step takes k times the
    optimizer steps (the minibatch count follows num_envs) and the policy moves about as much further, so the same
    span of train steps would average over k times the policy's change: the walking humanoid at 16x the envs
    reached the reference's final training return by train step 240 of 3000, when an average over 200 train steps
    still held the falling policies of its first hundred. The scaled decay spans the same number of env steps."""
    if reference_num_envs <= 0 or decay <= 0:
        return decay
    return max(0.0, 1.0 - (1.0 - decay) * num_envs / reference_num_envs)


def identity(tree: Any) -> Any:
    return tree


@dataclass(frozen=True)
class UpdateHooks:
    """Where the update meets the devices and the schedule: advantage statistics and gradients over devices
    (identity on one), and a change of the optimizer's state from a minibatch's metrics (its learning rate)."""

    normalize_advantage: Callable[[Array], Array] = identity
    sync_gradients: Callable[[Any], Any] = identity
    adapt_optimizer: Callable[[Any, Metrics], Any] | None = None


def ppo_minibatch_update(
    network: PolicyNetwork,
    optimizer: optax.GradientTransformation,
    config: LossSettings,
    params: Any,
    opt_state: Any,
    minibatch: PPOBatch,
    hooks: UpdateHooks = UpdateHooks(),
) -> tuple[Any, Any, Metrics]:
    """One optimizer step on one minibatch: the PPO loss's gradient (`hooks.sync_gradients`: averaged over
    devices where the caller needs it), then the optimizer, whose state `hooks.adapt_optimizer(opt_state,
    metrics)` may change first from this minibatch's metrics. Returns the new params, optimizer state and
    metrics."""
    advantage = hooks.normalize_advantage(minibatch.advantage)
    grads, metrics = jax.grad(lambda p: ppo_loss(network, p, minibatch, config, advantage), has_aux=True)(params)
    metrics["local_grad_norm"] = optax.tree.norm(grads)
    grads = hooks.sync_gradients(grads)
    if hooks.adapt_optimizer is not None:
        opt_state = hooks.adapt_optimizer(opt_state, metrics)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    if isinstance(opt_state, optax.InjectHyperparamsState | optax.InjectStatefulHyperparamsState):
        metrics["learning_rate"] = opt_state.hyperparams["learning_rate"]
    return optax.apply_updates(params, updates), opt_state, metrics


def ppo_epochs(
    network: PolicyNetwork,
    optimizer: optax.GradientTransformation,
    config: LossSettings,
    params: Any,
    opt_state: Any,
    batch: PPOBatch,
    rng: Array,
    num_passes: int,
    num_minibatches: int,
    hooks: UpdateHooks = UpdateHooks(),
) -> tuple[Any, Any, Metrics]:
    """`num_passes` epochs over `batch` (env-major), each shuffling its envs and cutting them into
    `num_minibatches` minibatches of whole trajectories. Returns the new params, optimizer state and the
    minibatch metrics averaged over every step."""
    num_envs = batch.advantage.shape[0]
    envs_per_minibatch = num_envs // num_minibatches

    def minibatch_step(carry: tuple[Any, Any], minibatch: PPOBatch) -> tuple[tuple[Any, Any], Metrics]:
        params, opt_state = carry
        params, opt_state, metrics = ppo_minibatch_update(
            network, optimizer, config, params, opt_state, minibatch, hooks
        )
        return (params, opt_state), metrics

    def epoch(carry: tuple[Any, Any], key: Array) -> tuple[tuple[Any, Any], Metrics]:
        order = jax.random.permutation(key, num_envs)
        minibatches = jax.tree.map(lambda x: x[order].reshape(num_minibatches, envs_per_minibatch, *x.shape[1:]), batch)
        return jax.lax.scan(minibatch_step, carry, minibatches)

    keys = jax.random.split(rng, num_passes)
    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), keys)
    return params, opt_state, jax.tree.map(jnp.mean, metrics)
