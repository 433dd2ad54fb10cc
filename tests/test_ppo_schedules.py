"""The update's step size: the adaptive (KL-driven), linear and cosine learning-rate schedules, reward scaling and
return normalization."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DistributedCartpoleTask, cartpole_config, distributed_cartpole_config

from examples.cartpole import CartpoleTask
from ksim.checkpoint import with_unset_fields
from ksim.config import ConfigError
from ksim.learner.normalization import Normalizer, scale_by_return_std
from ksim.learner.ppo_update import (
    UpdateHooks,
    adapt_learning_rate,
    gaussian_kl,
    identity,
    ppo_epochs,
    scaled_average_decay,
    scaled_clip_eps,
    scaled_desired_kl,
)
from ksim.task.rl import Metrics

# 2 passes x 2 minibatches: 4 optimizer steps per update.
STEPS_PER_UPDATE = 4


def test_adaptive_rule_moves_the_rate_by_1_5_within_its_bounds() -> None:
    rate, desired = jnp.asarray(1e-3), 0.01

    def adapted(kl: float, low: float = 1e-5, high: float = 1e-2) -> float:
        return float(adapt_learning_rate(rate, jnp.asarray(kl), desired, low, high))

    assert adapted(0.03) == pytest.approx(1e-3 / 1.5)  # over 2 x desired
    assert adapted(0.002) == pytest.approx(1.5e-3)  # under desired / 2
    assert adapted(0.01) == pytest.approx(1e-3) and adapted(0.019) == pytest.approx(1e-3)
    assert adapted(0.0) == pytest.approx(1e-3)  # no change measured (the first minibatch): no rise
    assert adapted(0.03, low=9e-4) == pytest.approx(9e-4) and adapted(0.002, high=1.2e-3) == pytest.approx(1.2e-3)


def test_gaussian_kl_is_the_closed_form() -> None:
    mean, log_std = jnp.array([[0.0, 1.0]]), jnp.array([[0.0, np.log(2.0)]])
    new_mean, new_log_std = jnp.array([[1.0, 1.0]]), jnp.array([[np.log(2.0), np.log(2.0)]])
    # Per dimension: log(s1/s0) + (s0^2 + (m0 - m1)^2) / (2 s1^2) - 1/2.
    expected = (np.log(2.0) + (1.0 + 1.0) / 8.0 - 0.5) + 0.0
    assert float(gaussian_kl(mean, log_std, new_mean, new_log_std)[0]) == pytest.approx(expected, rel=1e-6)
    assert float(gaussian_kl(mean, log_std, mean, log_std)[0]) == 0.0


@pytest.fixture(scope="module")
def rollout() -> tuple[Any, Any]:
    task = CartpoleTask(cartpole_config())
    state = task.init_train_state()
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    return jax.device_get(state.shared.normalizer), jax.device_get(trajectory)


def updated(config_overrides: dict[str, Any], rollout: tuple[Any, Any], steps_done: int = 0) -> tuple[Any, Metrics]:
    """One update of the rollout, `steps_done` optimizer steps into the run."""
    task = CartpoleTask(cartpole_config(**config_overrides))
    normalizer, trajectory = rollout
    shared = task.init_shared(jax.random.PRNGKey(0)).replace(normalizer=normalizer)
    if steps_done:
        shared = shared.replace(opt_state=shared.opt_state._replace(count=jnp.asarray(steps_done, jnp.int32)))
    return jax.device_get(task.programs["update"](shared, trajectory, jax.random.PRNGKey(1)))


def test_adaptive_schedule_lowers_the_rate_after_every_minibatch_over_the_kl(rollout: tuple[Any, Any]) -> None:
    # Any KL exceeds 2e-9: every minibatch step after the first (whose params are the rollout's: KL 0) divides.
    shared, metrics = updated(
        {"learning_rate_schedule": "adaptive", "desired_kl": 1e-9, "learning_rate": 3e-4}, rollout
    )
    expected = 3e-4 / 1.5 ** (STEPS_PER_UPDATE - 1)
    assert float(shared.opt_state.hyperparams["learning_rate"]) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["learning_rate"]) < 3e-4 and float(metrics["kl"]) > 0.0


def test_adaptive_schedule_raises_the_rate_while_the_kl_is_small(rollout: tuple[Any, Any]) -> None:
    shared, _ = updated({"learning_rate_schedule": "adaptive", "desired_kl": 1e3, "learning_rate": 1e-4}, rollout)
    assert float(shared.opt_state.hyperparams["learning_rate"]) == pytest.approx(1e-4 * 1.5 ** (STEPS_PER_UPDATE - 1))


def test_annealed_adaptive_schedule_steers_to_a_kl_target_falling_to_zero(rollout: tuple[Any, Any]) -> None:
    # num_steps=2: 8 optimizer steps in the run. With desired_kl=1e3 every KL is far under the target at the start
    # (the rate rises after each minibatch but the first, as plain adaptive's does); at the run's end the target is
    # 0, which any KL exceeds (the rate falls).
    config = {"learning_rate_schedule": "adaptive_annealed", "desired_kl": 1e3, "learning_rate": 1e-4}
    start, _ = updated(config, rollout)
    assert float(start.opt_state.hyperparams["learning_rate"]) == pytest.approx(1e-4 * 1.5 ** (STEPS_PER_UPDATE - 1))
    end, metrics = updated(config, rollout, steps_done=8)
    assert float(end.opt_state.hyperparams["learning_rate"]) == pytest.approx(1e-4 / 1.5 ** (STEPS_PER_UPDATE - 1))
    assert float(metrics["kl"]) > 0.0


def test_linear_schedule_anneals_to_zero_over_the_run(rollout: tuple[Any, Any]) -> None:
    # num_steps=2: 8 optimizer steps in the run; after one update's 4 the last rate used is lr * (1 - 3/8).
    shared, metrics = updated({"learning_rate_schedule": "linear", "learning_rate": 1e-3}, rollout)
    assert float(shared.opt_state.hyperparams["learning_rate"]) == pytest.approx(1e-3 * (1 - 3 / 8), rel=1e-5)
    assert float(metrics["learning_rate"]) == pytest.approx(np.mean([1e-3 * (1 - k / 8) for k in range(4)]), rel=1e-5)


def test_cosine_schedule_decays_to_zero_along_a_half_cosine(rollout: tuple[Any, Any]) -> None:
    # 8 optimizer steps in the run, as above: step k uses lr * (1 + cos(pi * k / 8)) / 2.
    def rate(k: int) -> float:
        return 1e-3 * (1 + np.cos(np.pi * k / 8)) / 2

    shared, metrics = updated({"learning_rate_schedule": "cosine", "learning_rate": 1e-3}, rollout)
    assert float(shared.opt_state.hyperparams["learning_rate"]) == pytest.approx(rate(3), rel=1e-5)
    assert float(metrics["learning_rate"]) == pytest.approx(np.mean([rate(k) for k in range(4)]), rel=1e-5)


def test_reward_scaling_is_the_update_of_scaled_rewards(rollout: tuple[Any, Any]) -> None:
    normalizer, trajectory = rollout
    scaled, _ = updated({"reward_scaling": 0.1}, rollout)
    by_hand, _ = updated({}, (normalizer, trajectory.replace(reward=trajectory.reward * np.float32(0.1))))
    jax.tree.map(np.testing.assert_array_equal, scaled.params, by_hand.params)
    unscaled, _ = updated({}, rollout)
    assert not np.array_equal(scaled.params["params"]["log_std"], unscaled.params["params"]["log_std"])


class LocalKlTask(DistributedCartpoleTask):
    """The adaptive rule on each device's own KL: what the cross-device average prevents."""

    def adapt_optimizer(self, opt_state: Any, metrics: Metrics) -> Any:
        rate = opt_state.hyperparams["learning_rate"]
        rate = adapt_learning_rate(rate, metrics["kl"], self.config.desired_kl, 1e-5, 1e-2)
        return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": rate})


@pytest.mark.parametrize(
    ("task_class", "schedule", "same"),
    [
        (DistributedCartpoleTask, "adaptive", True),
        (DistributedCartpoleTask, "adaptive_annealed", True),
        (LocalKlTask, "adaptive", False),
    ],
)
def test_adaptive_rate_is_the_same_on_every_device(task_class: type, schedule: str, same: bool) -> None:
    config = distributed_cartpole_config(
        num_devices=4, num_envs=16, batch_size=8, learning_rate_schedule=schedule, desired_kl=2e-4
    )
    task = task_class(config)
    state = task.init_train_state()
    for _ in range(2):
        state, _ = task.train_step(state)
    rates = np.asarray(state.shared.opt_state.hyperparams["learning_rate"])  # one per device
    assert rates.shape == (4,)
    assert (len(set(rates.tolist())) == 1) == same, rates
    if same:
        assert not task.replica_divergences(state)


def test_scale_by_return_std_divides_by_the_running_std_and_clips() -> None:
    rng = np.random.default_rng(0)
    returns = jnp.asarray(rng.normal(3.0, 2.0, size=(8, 4)), jnp.float32)
    reward = jnp.asarray(rng.normal(0.0, 1.0, size=(8, 4)), jnp.float32).at[0, 0].set(1e3)
    statistics, scaled = scale_by_return_std(Normalizer.create(1), reward, returns, identity, identity)
    assert float(statistics.count) == pytest.approx(32 + 1e-4)
    assert float(statistics.var[0]) == pytest.approx(np.var(np.asarray(returns)), rel=1e-3)  # the prior weighs 1e-4
    expected = np.clip(np.asarray(reward) / np.sqrt(float(statistics.var[0]) + 1e-8), -10, 10)
    np.testing.assert_allclose(np.asarray(scaled), expected, rtol=1e-6)
    assert float(scaled[0, 0]) == 10.0


def test_unset_fields_fill_in_for_a_checkpoint_written_before_them() -> None:
    expected = {"params": {"w": 1}, "return_normalizer": None}
    assert with_unset_fields(expected, {"params": {"w": 2}}) == {"params": {"w": 2}, "return_normalizer": None}
    assert with_unset_fields({"n": {"mean": 0}}, {}) == {}  # a field that is set stays missing: refused later


@pytest.fixture(scope="module")
def normalized() -> CartpoleTask:
    # Episodes of 3 steps: every 8-step rollout crosses episode starts.
    return CartpoleTask(
        cartpole_config(normalize_returns=True, gamma=0.9, episode_length_s=None, episode_length_steps=3)
    )


def test_each_episode_carries_its_discounted_return(normalized: CartpoleTask) -> None:
    state = normalized.init_train_state()
    _, trajectory, _ = jax.device_get(normalized.programs["rollout"](state.shared, state.env))
    reward, returns = np.asarray(trajectory.reward), np.asarray(trajectory.discounted_return)
    done = np.asarray(trajectory.terminated | trajectory.truncated)
    np.testing.assert_allclose(returns[0], reward[0], rtol=1e-6)  # every env's first episode starts here
    continuing = 0.9 * returns[:-1] * ~done[:-1] + reward[1:]
    np.testing.assert_allclose(returns[1:], continuing, rtol=1e-5)
    assert done[2].all() and done[5].all()  # the accumulator restarts with every episode


def test_normalize_returns_updates_on_rewards_over_the_return_std(normalized: CartpoleTask) -> None:
    state = normalized.init_train_state()
    assert state.shared.return_normalizer is not None
    after, _ = jax.device_get(normalized.train_step(state))
    # By hand: the same rollout, its rewards over the statistics' std, the same update.
    _, trajectory, _ = normalized.programs["rollout"](state.shared, state.env)
    update_key, _ = jax.random.split(state.rng)
    statistics, reward = scale_by_return_std(
        state.shared.return_normalizer, trajectory.reward, trajectory.discounted_return, identity, identity
    )
    shared = state.shared.replace(return_normalizer=statistics)
    expected, _ = normalized.programs["update"](shared, trajectory.replace(reward=reward), update_key)
    assert float(after.shared.return_normalizer.count) == pytest.approx(8 * 8 + 1e-4)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), after.shared.params, expected.params
    )


def test_return_statistics_are_the_same_on_every_device() -> None:
    config = distributed_cartpole_config(num_devices=4, num_envs=16, batch_size=8, normalize_returns=True)
    task = DistributedCartpoleTask(config)
    state, _ = task.train_step(task.init_train_state())
    counts = np.asarray(state.shared.return_normalizer.count)
    assert counts.shape == (4,) and np.all(counts == counts[0])
    assert float(counts[0]) == pytest.approx(16 * 8 + 1e-4)  # every device's returns, not its own
    assert not task.replica_divergences(state)


def test_step_shuffling_is_the_update_of_one_step_trajectories(rollout: tuple[Any, Any]) -> None:
    """minibatch_shuffle=steps: an epoch's minibatches draw single steps from any env."""
    normalizer, trajectory = rollout
    task = CartpoleTask(cartpole_config(minibatch_shuffle="steps"))
    shared = task.init_shared(jax.random.PRNGKey(0)).replace(normalizer=normalizer)
    batch = task.prepare_batch(shared, trajectory)
    steps = jax.tree.map(lambda x: x.reshape(-1, 1, *x.shape[2:]), batch)
    hooks = UpdateHooks(task.normalize_advantage, task.sync_gradients)
    expected = ppo_epochs(
        task.model,
        task.optimizer,
        task.config,
        shared.params,
        shared.opt_state,
        steps,
        jax.random.PRNGKey(1),
        2,
        2,
        hooks,
    )
    result, _ = jax.device_get(task.programs["update"](shared, trajectory, jax.random.PRNGKey(1)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), result.params, expected[0])
    assert steps.advantage.shape == (64, 1)  # 8 envs x 8 steps, 32 per minibatch
    with pytest.raises(ConfigError, match="minibatch_shuffle='steps' needs a memoryless policy"):
        CartpoleTask(cartpole_config(minibatch_shuffle="steps", recurrent_size=4))


def test_the_kl_target_grows_with_the_envs_to_the_three_quarters() -> None:
    assert scaled_desired_kl(0.02, 2048, 0) == 0.02  # no reference: no scaling
    assert scaled_desired_kl(0.02, 256, 256) == 0.02
    assert scaled_desired_kl(0.02, 4096, 256) == pytest.approx(0.16)  # 16x the envs: 8x the KL target
    assert scaled_desired_kl(0.02, 2048, 256) == pytest.approx(0.02 * 8**0.75)
    assert scaled_desired_kl(0.02, 16, 256) == pytest.approx(0.0025)  # fewer envs: a smaller step


def test_the_clip_widens_with_the_square_root_of_the_kl_target() -> None:
    assert scaled_clip_eps(0.2, 2048, 0) == 0.2
    assert scaled_clip_eps(0.2, 256, 256) == 0.2
    assert scaled_clip_eps(0.2, 4096, 256) == pytest.approx(0.2 * 8**0.5)  # 16x the envs: 8x the KL target
    for envs in (512, 1024, 2048):  # the log-ratio spread sqrt(2 KL) grows as the clip does
        kl_growth = scaled_desired_kl(0.02, envs, 256) / 0.02
        assert scaled_clip_eps(0.2, envs, 256) / 0.2 == pytest.approx(kl_growth**0.5)


def test_the_parameters_average_spans_as_many_env_steps_at_any_env_count() -> None:
    assert scaled_average_decay(0.995, 2048, 0) == 0.995  # no reference: no scaling
    assert scaled_average_decay(0.0, 2048, 128) == 0.0  # no average stays none
    for envs in (128, 512, 2048):
        decay = scaled_average_decay(0.995, envs, 128)
        assert envs / (1 - decay) == pytest.approx(128 / (1 - 0.995))  # env steps the average spans
    assert scaled_average_decay(0.9, 2048, 128) == 0.0  # a span under one train step: the latest parameters
    task = DistributedCartpoleTask(
        distributed_cartpole_config(num_envs=32, batch_size=4, reference_num_envs=8, policy_average_decay=0.99)
    )
    assert task.policy_average_decay == pytest.approx(0.96)
    assert task.learner_line().endswith(", policy_average_decay 0.96 (1 - 0.01 x 4)")


@pytest.mark.parametrize("num_devices", [1, 2, 4])
@pytest.mark.parametrize("num_envs", [8, 16, 32])
def test_the_learner_follows_the_global_env_count_on_any_device_count(num_envs: int, num_devices: int) -> None:
    config = distributed_cartpole_config(
        num_envs=num_envs,
        batch_size=4,
        reference_num_envs=8,
        learning_rate_schedule="adaptive",
        desired_kl=0.01,
        num_devices=num_devices,
    )
    task = DistributedCartpoleTask(config)  # builds and checks; nothing compiles
    assert task.num_minibatches == num_envs // 4
    assert task.desired_kl == pytest.approx(0.01 * (num_envs / 8) ** 0.75)
    assert task.clip_eps == pytest.approx(0.2 * (num_envs / 8) ** 0.375)
    line = task.learner_line()
    if num_envs == 8:
        assert line == ""
    else:
        assert line == (
            f"learner: {num_envs} envs, {num_envs // 8}x the reference_num_envs=8: {num_envs // 4} minibatches of 4 "
            f"envs, desired_kl {task.desired_kl:.3g} (0.01 x {num_envs // 8}^(3/4)), clip_eps {task.clip_eps:.3g} "
            f"(0.2 x {num_envs // 8}^(3/8))"
        )
