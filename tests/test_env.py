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
    return jax.jit(task.step_shard)


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


def test_terminated_env_starts_its_next_episode_and_others_go_on(task, state, step_shard) -> None:
    env = tipped(state.env)
    next_env, transition = step_shard(state.shared, env)
    trajectory = transition.trajectory
    assert bool(trajectory.terminated[0]) and not bool(trajectory.truncated[0])
    assert not np.any(np.asarray(trajectory.terminated[1:]))
    # env 0 starts a new episode near the default pose; the others continue theirs.
    assert int(next_env.current.episode_length[0]) == 0 and float(next_env.current.episode_return[0]) == 0.0
    assert abs(float(next_env.data.qpos[0, 1])) < 0.1
    assert abs(float(trajectory.next_obs[0, 0])) > 0.3  # the terminal observation is kept for bootstrapping
    np.testing.assert_array_equal(next_env.current.episode_length[1:], np.asarray(env.current.episode_length[1:]) + 1)
    assert float(next_env.current.episode_return[1]) == pytest.approx(3.0 + float(trajectory.reward[1]))
    np.testing.assert_array_equal(next_env.episodes_started, [2] + [1] * (task.config.num_envs - 1))


def test_next_start_is_the_pooled_state_for_that_env_and_episode(task, state, step_shard) -> None:
    ready = task.refill_next_starts(state.env)
    next_env, _ = step_shard(state.shared, tipped(ready))
    np.testing.assert_array_equal(next_env.data.qpos[0], ready.next_start.data.qpos[0])  # no reset physics here
    assert not bool(next_env.next_start_ready[0]) and bool(np.all(next_env.next_start_ready[1:]))
    # The pooled start of env i, episode k, is a function of (env key, k) alone.
    expected = task.start_episode(jax.random.fold_in(state.env.reset_key[0], 1))
    np.testing.assert_allclose(ready.next_start.data.qpos[0], expected.data.qpos, atol=1e-7)


def test_episode_starts_differ_per_env_and_per_episode(task, state, step_shard) -> None:
    starts = [state.env.data.qpos]
    env = state.env
    for _ in range(3):  # each round every env ends (tipped pole): episodes 2, 3, 4 start
        current = env.current
        env = env.replace(current=current.replace(data=current.data.replace(qpos=current.data.qpos.at[:, 1].set(1.0))))
        env, transition = step_shard(state.shared, env)  # refills inside: every start was used
        assert bool(np.all(transition.trajectory.terminated))
        starts.append(env.data.qpos)
    np.testing.assert_array_equal(env.episodes_started, 4)
    poles = np.stack([np.asarray(qpos[:, 1]) for qpos in starts])  # (episode, env)
    assert len(np.unique(poles)) == poles.size  # no two starts alike, across envs and episodes
    assert np.all(np.abs(poles) <= 0.05 + 1e-6)


def test_truncation_at_episode_length(task, state, step_shard) -> None:
    current = state.env.current
    current = current.replace(episode_length=jnp.full_like(current.episode_length, task.max_episode_steps - 1))
    next_env, transition = step_shard(state.shared, state.env.replace(current=current))
    truncated = np.asarray(transition.trajectory.truncated)
    terminated = np.asarray(transition.trajectory.terminated)
    np.testing.assert_array_equal(truncated, ~terminated)
    np.testing.assert_array_equal(next_env.current.episode_length, 0)


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
