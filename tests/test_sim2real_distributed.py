"""Randomization, commands, pushes, noise and action delay on 1, 2 and 4 devices: the same per-env values,
the same update, and replicated state that stays identical."""

import jax
import numpy as np
import pytest
from helpers import DistributedBallTask, distributed_ball_config
from test_distributed import relative_error

from ksim.task.devices import unshard_env_axis
from ksim.task.rl import EnvState, TrainState

DEVICE_COUNTS = (1, 2, 4)


def per_env_draws(env: EnvState) -> dict:
    """Every per-env random draw of the running and the pooled next episodes, env-major (host copies)."""
    env = jax.device_get(unshard_env_axis(env))
    return {
        f"{name}.{field}": value
        for name, episode in (("current", env.current), ("next_start", env.next_start))
        for field, value in {
            "randomized": episode.randomized,
            "command": episode.command,
            "command_state": episode.command_state,
            "event_timers": episode.event_timers,
            "rng": episode.rng,
            "component_state": episode.component_state,
        }.items()
    } | {"episodes_started": env.episodes_started}


@pytest.fixture(scope="module")
def runs() -> dict[int, tuple[DistributedBallTask, TrainState, TrainState, dict]]:
    """Per device count: the task, its first state, the state after one train step, and that step's metrics."""
    results = {}
    for num_devices in DEVICE_COUNTS:
        task = DistributedBallTask(distributed_ball_config(num_devices=num_devices, consistency_check_every_n_steps=1))
        start = task.init_train_state()
        stepped, metrics = task.train_step(start)
        results[num_devices] = (task, start, stepped, task.fetch_replicated(metrics))
    return results


def test_the_run_exercises_every_component(runs: dict) -> None:
    _, start, stepped, metrics = runs[1]
    draws = per_env_draws(stepped.env)
    assert np.all(draws["episodes_started"] == 2)  # 8 steps of 6-step episodes: each env's second episode runs
    initial = per_env_draws(start.env)
    assert not np.array_equal(draws["current.command"], initial["current.command"])  # redrawn since the start
    assert len(draws["current.randomized"].model_fields) == 8 and metrics["reward/LinearVelocityTracking"] > 0


@pytest.mark.parametrize("num_devices", DEVICE_COUNTS)
def test_component_state_starts_fresh_every_episode_and_is_carried_across_steps(runs: dict, num_devices: int) -> None:
    task, _, stepped, _ = runs[num_devices]
    current = jax.device_get(unshard_env_axis(stepped.env.current))
    air_time = current.component_state["FeetAirTime"]["air_time"][:, 0]
    assert air_time.shape == (task.config.num_envs,)
    # Never touching, the ball's air time is the time since its episode started: reset with each episode.
    np.testing.assert_allclose(air_time, current.episode_length * task.config.ctrl_dt, rtol=1e-5)
    assert np.any(air_time > 0)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_every_global_env_draws_the_same_values_on_any_device_count(runs: dict, num_devices: int) -> None:
    _, one_start, one_stepped, _ = runs[1]
    _, start, stepped, _ = runs[num_devices]
    for reference, state in ((one_start, start), (one_stepped, stepped)):
        expected, actual = per_env_draws(reference.env), per_env_draws(state.env)
        for name in expected:
            for want, got in zip(jax.tree.leaves(expected[name]), jax.tree.leaves(actual[name]), strict=True):
                np.testing.assert_array_equal(got, want, err_msg=name)  # bitwise: the same keys, the same draws
    qvel = unshard_env_axis(stepped.env.current.data.qvel)
    np.testing.assert_allclose(qvel, unshard_env_axis(one_stepped.env.current.data.qvel), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_one_minibatch_update_matches_one_device(runs: dict, num_devices: int) -> None:
    one_task, _, one_stepped, one_metrics = runs[1]
    task, _, stepped, metrics = runs[num_devices]
    shared = task.fetch_replicated(stepped.shared)
    assert relative_error(shared, one_task.fetch_replicated(one_stepped.shared)) < 1e-5
    assert relative_error(metrics["loss"], one_metrics["loss"]) < 1e-5
    assert metrics["episode_return_sum"] == pytest.approx(float(one_metrics["episode_return_sum"]), rel=1e-5)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_replicated_state_stays_identical_with_everything_on(runs: dict, num_devices: int) -> None:
    task, _, stepped, _ = runs[num_devices]
    state = task.after_train_step(stepped, step=1)  # the replica check (raise mode, tolerance 0)
    state, _ = task.train_step(state)
    state = task.after_train_step(state, step=2)
    assert task.replica_divergences(state) == []


@pytest.fixture(scope="module")
def servo_runs() -> dict[int, tuple[DistributedBallTask, TrainState]]:
    """Per device count: the ball task with an MJCF position servo, after one train step."""
    results = {}
    for num_devices in (1, 2):
        task = DistributedBallTask(distributed_ball_config(num_devices=num_devices, servo=True))
        stepped, _ = task.train_step(task.init_train_state())
        results[num_devices] = (task, stepped)
    return results


def test_servo_gain_randomization_is_the_same_per_env_on_any_device_count(servo_runs: dict) -> None:
    one_task, one = servo_runs[1]
    task, two = servo_runs[2]
    expected, actual = per_env_draws(one.env), per_env_draws(two.env)
    fields = expected["current.randomized"].model_fields
    gain, bias = np.asarray(fields["actuator_gainprm"]), np.asarray(fields["actuator_biasprm"])
    assert len(np.unique(gain[:, 0, 0])) == gain.shape[0]  # every env draws its own servo kp
    np.testing.assert_allclose(bias[:, 0, 1], -gain[:, 0, 0], rtol=1e-6)  # kp in gain and bias together
    assert expected["current.randomized"].gain_scales == {}  # the servo's gains live in the model fields
    for name in expected:
        for want, got in zip(jax.tree.leaves(expected[name]), jax.tree.leaves(actual[name]), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert relative_error(task.fetch_replicated(two.shared), one_task.fetch_replicated(one.shared)) < 1e-5
