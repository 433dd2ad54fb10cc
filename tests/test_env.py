"""Env stepping: pooled episode starts swapped in where episodes end, shapes, finite values, resets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim.engine import rotate_inverse
from ksim.task.rl import EnvState, TrainState


@pytest.fixture(scope="module")
def task() -> CartpoleTask:
    return CartpoleTask(cartpole_config())


@pytest.fixture(scope="module")
def state(task: CartpoleTask) -> TrainState:
    return task.init_train_state()


@pytest.fixture(scope="module")
def step_shard(task: CartpoleTask):
    return jax.jit(task.env_pool.step)


@pytest.fixture(scope="module")
def running(state: TrainState, step_shard) -> EnvState:
    """One control step after the start: every env one step into its first episode."""
    env, transition = step_shard(state.shared, state.env)
    assert not np.any(np.asarray(transition.trajectory.terminated))
    return env


def tipped(env: EnvState) -> EnvState:
    """Env 0's pole past the 0.3 rad limit; env 1 seven steps into an episode with a return of 3."""
    current = env.current
    return env.replace(
        current=current.replace(
            data=current.data.replace(qpos=current.data.qpos.at[0, 1].set(1.0)),
            episode_length=current.episode_length.at[1].set(7),
            episode_return=current.episode_return.at[1].set(3.0),
        )
    )


def test_a_fresh_state_starts_every_env_at_its_first_step(task, state, step_shard) -> None:
    assert bool(np.all(state.env.ended)) and int(np.max(state.env.episodes_started)) == 0
    env, transition = step_shard(state.shared, state.env)
    np.testing.assert_array_equal(env.episodes_started, 1)
    np.testing.assert_array_equal(env.current.episode_length, 1)
    first = task.environment.start_episode(jax.random.fold_in(state.env.reset_key[3], 0))  # env 3, episode 0
    np.testing.assert_allclose(transition.trajectory.obs[3], first.obs, atol=1e-6)


def test_terminated_env_starts_its_next_episode_and_others_go_on(task, state, running, step_shard) -> None:
    env = tipped(running)
    ended_env, transition = step_shard(state.shared, env)
    trajectory = transition.trajectory
    assert bool(trajectory.terminated[0]) and not bool(trajectory.truncated[0])
    assert not np.any(np.asarray(trajectory.terminated[1:]))
    assert bool(ended_env.ended[0]) and not np.any(np.asarray(ended_env.ended[1:]))
    assert abs(float(trajectory.next_obs[0, 0])) > 0.3  # the terminal observation is kept for bootstrapping
    next_env, next_transition = step_shard(state.shared, ended_env)
    # env 0 runs one step of a new episode from near the default pose; the others continue theirs.
    assert int(next_env.current.episode_length[0]) == 1 and abs(float(next_transition.trajectory.obs[0, 0])) < 0.1
    np.testing.assert_array_equal(next_env.current.episode_length[1:], np.asarray(env.current.episode_length[1:]) + 2)
    rewards = float(trajectory.reward[1]) + float(next_transition.trajectory.reward[1])
    assert float(next_env.current.episode_return[1]) == pytest.approx(3.0 + rewards)
    np.testing.assert_array_equal(next_env.episodes_started, [2] + [1] * (task.config.num_envs - 1))


def test_next_start_is_the_pooled_state_for_that_env_and_episode(task, state, running, step_shard) -> None:
    ready = task.env_pool.refill_next_starts(running)
    ended_env, _ = step_shard(state.shared, tipped(ready))
    next_env, transition = step_shard(state.shared, ended_env)
    np.testing.assert_array_equal(transition.trajectory.obs[0], ready.next_start.obs[0])  # no reset physics here
    assert not bool(next_env.next_start_ready[0]) and bool(np.all(next_env.next_start_ready[1:]))
    # The pooled start of env i, episode k, is a function of (env key, k) alone.
    expected = task.environment.start_episode(jax.random.fold_in(state.env.reset_key[0], 1))
    np.testing.assert_allclose(ready.next_start.data.qpos[0], expected.data.qpos, atol=1e-7)


def test_episode_starts_differ_per_env_and_per_episode(state, step_shard) -> None:
    env, transition = step_shard(state.shared, state.env)  # every env's first episode starts
    poles = [transition.trajectory.obs[:, 0]]  # pole angle at each start
    for _ in range(3):  # each round every env ends (tipped pole), then episodes 2, 3, 4 start
        current = env.current
        env = env.replace(current=current.replace(data=current.data.replace(qpos=current.data.qpos.at[:, 1].set(1.0))))
        env, transition = step_shard(state.shared, env)
        assert bool(np.all(transition.trajectory.terminated)) and bool(np.all(env.ended))
        env, transition = step_shard(state.shared, env)  # refills inside: every start was used
        poles.append(transition.trajectory.obs[:, 0])
    np.testing.assert_array_equal(env.episodes_started, 4)
    starts = np.stack([np.asarray(pole) for pole in poles])  # (episode, env)
    assert len(np.unique(starts)) == starts.size  # no two starts alike, across envs and episodes
    assert np.all(np.abs(starts) <= 0.05 + 1e-6)


def test_truncation_at_episode_length(task, state, running, step_shard) -> None:
    current = running.current
    current = current.replace(
        episode_length=jnp.full_like(current.episode_length, task.environment.settings.max_episode_steps - 1)
    )
    next_env, transition = step_shard(state.shared, running.replace(current=current))
    truncated = np.asarray(transition.trajectory.truncated)
    terminated = np.asarray(transition.trajectory.terminated)
    np.testing.assert_array_equal(truncated, ~terminated)
    assert bool(np.all(next_env.ended))


def test_rollout_shapes_and_finite_values(task: CartpoleTask, state: TrainState) -> None:
    config = task.config
    env, trajectory, metrics = task.programs["rollout"](state.shared, state.env)
    steps, envs = config.rollout_length_frames, config.num_envs
    assert trajectory.obs.shape == (steps, envs, task.environment.observation_dim) == trajectory.next_obs.shape
    assert task.environment.observation_dim == 3  # pole angle, cart and pole velocities
    assert trajectory.action.shape == (steps, envs, 1)
    assert trajectory.reward.shape == trajectory.terminated.shape == trajectory.truncated.shape == (steps, envs)
    assert isinstance(env, EnvState) and env.obs.shape == (envs, task.environment.observation_dim)
    for leaf in jax.tree.leaves((trajectory, metrics)):
        assert np.all(np.isfinite(np.asarray(leaf, dtype=np.float64)))
    assert set(metrics) >= {"reward/StayAlive", "reward/total", "episodes_finished"}


def test_first_starts_are_randomised_per_env(task: CartpoleTask, state: TrainState) -> None:
    qpos = np.asarray(task.env_pool.refill_next_starts(state.env).next_start.data.qpos)
    assert qpos.shape == (task.config.num_envs, 2)
    assert len(np.unique(qpos[:, 1])) == task.config.num_envs
    assert np.all(np.abs(qpos) <= 0.05 + 1e-6)


def test_rotate_inverse_matches_rotation_matrix() -> None:
    angle = 0.7
    quat = jnp.array([np.cos(angle / 2), 0.0, 0.0, np.sin(angle / 2)])  # yaw by `angle`
    vec = jnp.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(rotate_inverse(quat, vec), [np.cos(angle), -np.sin(angle), 0.0], atol=1e-6)
