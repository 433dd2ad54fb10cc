"""GAE and the PPO loss against straightforward NumPy references on random data."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ksim.learner.memory import episode_starts, unroll
from ksim.learner.networks import ActorCritic, Feedforward, RecurrentActorCritic, gaussian_entropy, gaussian_log_prob
from ksim.learner.ppo_update import PPOBatch, compute_gae, ppo_loss, ppo_minibatch_update
from ksim.task.ppo import PPOConfig


def numpy_gae(reward, value, next_value, terminated, truncated, gamma, lam):
    """Per env, walk backwards; bootstrap truncations with V(next state), stop at episode ends."""
    steps, envs = reward.shape
    advantage = np.zeros_like(reward)
    for env in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            done = terminated[t, env] or truncated[t, env]
            bootstrap = 0.0 if terminated[t, env] else next_value[t, env]
            delta = reward[t, env] + gamma * bootstrap - value[t, env]
            running = delta + gamma * lam * (0.0 if done else running)
            advantage[t, env] = running
    return advantage, advantage + value


def test_gae_matches_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    steps, envs = 37, 6
    reward = rng.normal(size=(steps, envs)).astype(np.float32)
    value = rng.normal(size=(steps, envs)).astype(np.float32)
    next_value = rng.normal(size=(steps, envs)).astype(np.float32)
    terminated = rng.random((steps, envs)) < 0.08
    truncated = (rng.random((steps, envs)) < 0.05) & ~terminated
    expected_adv, expected_ret = numpy_gae(reward, value, next_value, terminated, truncated, 0.97, 0.9)
    adv, ret = compute_gae(
        jnp.asarray(reward),
        jnp.asarray(value),
        jnp.asarray(next_value),
        jnp.asarray(terminated, jnp.float32),
        jnp.asarray(terminated | truncated),
        0.97,
        0.9,
    )
    np.testing.assert_allclose(adv, expected_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, expected_ret, rtol=1e-5, atol=1e-5)


def test_gae_truncation_bootstraps_but_termination_does_not() -> None:
    reward = jnp.ones((1, 2))
    value = jnp.zeros((1, 2))
    next_value = jnp.full((1, 2), 10.0)
    terminated = jnp.array([[1.0, 0.0]])
    done = jnp.array([[True, True]])  # env 0 terminated, env 1 truncated
    adv, _ = compute_gae(reward, value, next_value, terminated, done, 0.9, 0.95)
    np.testing.assert_allclose(adv, [[1.0, 1.0 + 0.9 * 10.0]])


def numpy_log_prob(action, mean, log_std):
    var = np.exp(2 * log_std)
    return np.sum(-((action - mean) ** 2) / (2 * var) - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


@pytest.mark.parametrize("value_clip_eps", [0.0, 0.2])
def test_ppo_loss_matches_numpy_reference(value_clip_eps: float) -> None:
    config = PPOConfig(value_clip_eps=value_clip_eps, entropy_coef=0.01, value_coef=0.5, clip_eps=0.2)
    model = ActorCritic(action_dim=3, actor_hidden=(8,), critic_hidden=(8,), init_log_std=-0.3)
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(4, 5, 7)).astype(np.float32)
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(obs))
    mean, log_std, value = (np.asarray(x) for x in model.apply(params, jnp.asarray(obs)))
    action = (mean + rng.normal(size=mean.shape)).astype(np.float32)
    old_log_prob = (numpy_log_prob(action, mean, log_std) + rng.normal(scale=0.3, size=(4, 5))).astype(np.float32)
    old_value = (value + rng.normal(scale=0.5, size=value.shape)).astype(np.float32)
    returns = rng.normal(size=value.shape).astype(np.float32)
    advantage = rng.normal(size=value.shape).astype(np.float32)
    batch = PPOBatch(
        jnp.asarray(obs),
        jnp.asarray(action),
        jnp.asarray(old_log_prob),
        jnp.asarray(old_value),
        jnp.asarray(advantage),
        jnp.asarray(returns),
    )

    loss, metrics = ppo_loss(Feedforward(model), params, batch, config, jnp.asarray(advantage))

    ratio = np.exp(numpy_log_prob(action, mean, log_std) - old_log_prob)
    surrogate = np.minimum(ratio * advantage, np.clip(ratio, 0.8, 1.2) * advantage)
    value_error = (value - returns) ** 2
    if value_clip_eps:
        clipped = old_value + np.clip(value - old_value, -value_clip_eps, value_clip_eps)
        value_error = np.maximum(value_error, (clipped - returns) ** 2)
    entropy = np.sum(log_std + 0.5 * (1 + np.log(2 * np.pi)), axis=-1).mean()
    expected = -surrogate.mean() + 0.5 * 0.5 * value_error.mean() - 0.01 * entropy
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], entropy, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_fraction"], np.mean(np.abs(ratio - 1) > 0.2), rtol=1e-6)


def test_gaussian_helpers_match_closed_forms() -> None:
    mean = jnp.array([[0.5, -1.0]])
    log_std = jnp.array([[0.1, -0.2]])
    action = jnp.array([[0.0, 0.3]])
    np.testing.assert_allclose(
        gaussian_log_prob(action, mean, log_std),
        numpy_log_prob(*(np.asarray(x) for x in (action, mean, log_std))),
        rtol=1e-6,
    )
    assert gaussian_entropy(log_std).shape == (1,)
    assert isinstance(ActorCritic(action_dim=1), nn.Module)


def random_batch(model: nn.Module, params: object, obs: np.ndarray, rng: np.random.Generator) -> PPOBatch:
    mean, _, value = (np.asarray(x) for x in model.apply(params, jnp.asarray(obs)))
    action = (mean + rng.normal(size=mean.shape)).astype(np.float32)
    old_log_prob = rng.normal(size=value.shape).astype(np.float32)
    returns = rng.normal(size=value.shape).astype(np.float32)
    advantage = rng.normal(size=value.shape).astype(np.float32)
    return PPOBatch(*(jnp.asarray(x) for x in (obs, action, old_log_prob, value, advantage, returns)))


def test_minibatch_update_needs_no_task_and_lowers_the_loss() -> None:
    config = PPOConfig(value_clip_eps=0.0, max_grad_norm=0.0)
    model = ActorCritic(action_dim=2, actor_hidden=(8,), critic_hidden=(8,))
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(4, 6, 5)).astype(np.float32)
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(obs))
    batch = random_batch(model, params, obs, rng)
    optimizer = optax.sgd(1e-2)
    network = Feedforward(model)
    new_params, _, metrics = ppo_minibatch_update(network, optimizer, config, params, optimizer.init(params), batch)
    before, _ = ppo_loss(network, params, batch, config, batch.advantage)
    after, _ = ppo_loss(network, new_params, batch, config, batch.advantage)
    np.testing.assert_allclose(metrics["loss"], before, rtol=1e-6)
    assert float(after) < float(before) and float(metrics["local_grad_norm"]) > 0


def test_replay_restarts_the_gru_where_an_episode_starts() -> None:
    model = RecurrentActorCritic(action_dim=2, recurrent_size=4, actor_hidden=(8,), critic_hidden=(8,))
    obs = jax.random.normal(jax.random.PRNGKey(1), (7, 3, 5))  # time-major: 7 steps of 3 envs
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 2, 4)), obs[0], obs[0])
    carry = jax.random.normal(jax.random.PRNGKey(2), (3, 2, 4))  # the state before step 0

    def step(carry: jax.Array, obs: jax.Array, critic_obs: jax.Array) -> tuple:
        return model.apply(params, carry, obs, critic_obs)

    done = jnp.zeros((7, 3), bool).at[2, 1].set(True)  # env 1's episode ends at step 2: a new one at step 3
    mean, _, value, _ = unroll(step, carry, obs, obs, episode_starts(done))
    tail_mean, _, tail_value, _ = unroll(step, jnp.zeros((3, 2, 4)), obs[3:], obs[3:], jnp.zeros((4, 3), bool))
    np.testing.assert_allclose(mean[3:, 1], tail_mean[:, 1], atol=1e-6)
    np.testing.assert_allclose(value[3:, 1], tail_value[:, 1], atol=1e-6)
    assert np.abs(mean[3:, 0] - tail_mean[:, 0]).max() > 1e-4  # the others carry on from their state
