"""Env stepping: auto-reset of finished envs only, documented shapes, finite values over a rollout."""

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


def test_terminated_env_is_reset_and_others_are_not(task: CartpoleTask, state: TrainState) -> None:
    env = state.env
    # Tip env 0's pole past the 0.3 rad limit; give env 1 a running episode.
    qpos = env.data.qpos.at[0, 1].set(1.0)
    env = env.replace(
        data=env.data.replace(qpos=qpos),
        episode_length=env.episode_length.at[1].set(7),
        episode_return=env.episode_return.at[1].set(3.0),
    )
    step = jax.jit(jax.vmap(task.step_env, in_axes=(None, 0)))
    next_env, transition = step(state.shared, env)
    trajectory = transition.trajectory
    assert bool(trajectory.terminated[0]) and not bool(trajectory.truncated[0])
    assert not np.any(np.asarray(trajectory.terminated[1:]))
    # env 0 starts a new episode near the default pose; the others continue theirs.
    assert int(next_env.episode_length[0]) == 0 and float(next_env.episode_return[0]) == 0.0
    assert abs(float(next_env.data.qpos[0, 1])) < 0.1
    assert abs(float(trajectory.next_obs[0, 0])) > 0.3  # the terminal observation is kept for bootstrapping
    np.testing.assert_array_equal(next_env.episode_length[1:], np.asarray(env.episode_length[1:]) + 1)
    assert float(next_env.episode_return[1]) == pytest.approx(3.0 + float(trajectory.reward[1]))


def test_truncation_at_episode_length(task: CartpoleTask, state: TrainState) -> None:
    env = state.env.replace(episode_length=jnp.full_like(state.env.episode_length, task.max_episode_steps - 1))
    next_env, transition = jax.jit(jax.vmap(task.step_env, in_axes=(None, 0)))(state.shared, env)
    truncated = np.asarray(transition.trajectory.truncated)
    terminated = np.asarray(transition.trajectory.terminated)
    np.testing.assert_array_equal(truncated, ~terminated)
    np.testing.assert_array_equal(next_env.episode_length, 0)


def test_rollout_shapes_and_finite_values(task: CartpoleTask, state: TrainState) -> None:
    config = task.config
    env, trajectory, metrics = task.rollout(state.shared, state.env)
    steps, envs = config.rollout_length_frames, config.num_envs
    assert trajectory.obs.shape == (steps, envs, task.observation_dim) == trajectory.next_obs.shape
    assert task.observation_dim == 3  # pole angle, cart and pole velocities
    assert trajectory.action.shape == (steps, envs, 1)
    assert trajectory.reward.shape == trajectory.terminated.shape == trajectory.truncated.shape == (steps, envs)
    assert isinstance(env, EnvState) and env.obs.shape == (envs, task.observation_dim)
    for leaf in jax.tree.leaves((trajectory, metrics)):
        assert np.all(np.isfinite(np.asarray(leaf, dtype=np.float64)))
    assert set(metrics) >= {"reward/StayAlive", "reward/total", "episodes_finished"}


def test_reset_randomises_each_env(task: CartpoleTask, state: TrainState) -> None:
    qpos = np.asarray(state.env.data.qpos)
    assert qpos.shape == (task.config.num_envs, 2)
    assert len(np.unique(qpos[:, 1])) == task.config.num_envs
    assert np.all(np.abs(qpos) <= 0.05 + 1e-6)


def test_rotate_inverse_matches_rotation_matrix() -> None:
    angle = 0.7
    quat = jnp.array([np.cos(angle / 2), 0.0, 0.0, np.sin(angle / 2)])  # yaw by `angle`
    vec = jnp.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(rotate_inverse(quat, vec), [np.cos(angle), -np.sin(angle), 0.0], atol=1e-6)
