"""The viewer's simulation (ksim.viewer.sim) without a browser: held commands, pushes, resets, and refusals."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import (
    MEMORY_EPISODE_STEPS,
    BallTask,
    DistributedBallTask,
    MemoryTask,
    ball_config,
    cartpole_config,
    distributed_ball_config,
    memory_config,
)

from examples.cartpole import CartpoleTask
from ksim.modes.export import exported_policy
from ksim.modes.view import view_shared
from ksim.task.run_checkpoints import checkpoint_contents, save_run_checkpoint
from ksim.viewer.sim import ViewerSim


@pytest.fixture(scope="module")
def ball() -> tuple[BallTask, ViewerSim]:
    """The ball (velocity command, Command observation last, a free base) with its initial policy."""
    task = BallTask(ball_config(mode="view", episode_length_steps=12))
    shared = jax.device_get(task.init_shared(jax.random.PRNGKey(0)))
    return task, ViewerSim(task.environment, shared, seed=0)


def test_held_command_reaches_the_policy_and_stays(ball: tuple[BallTask, ViewerSim]) -> None:
    _, sim = ball
    sim.reset()
    sim.held_command = np.asarray([0.7, -0.2, 0.3], np.float32)
    sim.step()  # the episode's first observation holds the command it started with
    for _ in range(8):  # past the ball's 0.04-0.1 s command redraws
        report = sim.step()
        np.testing.assert_allclose(report.obs[-3:], sim.held_command, atol=1e-6)
    sim.held_command = None


def test_push_kicks_the_base_and_reset_starts_a_new_episode(ball: tuple[BallTask, ViewerSim]) -> None:
    task, sim = ball
    linear = task.engine.layout.free_root_qvel("test")[:3]
    before = np.asarray(sim.episode.data.qvel)[linear]
    sim.push_base()
    assert np.linalg.norm(np.asarray(sim.episode.data.qvel)[linear] - before) > 1e-3
    sim.step()
    sim.reset()
    assert int(sim.episode.episode_length) == 0


def test_episode_end_names_the_time_limit(ball: tuple[BallTask, ViewerSim]) -> None:
    _, sim = ball
    sim.reset()
    endings = [sim.step().ended_by for _ in range(12)]
    assert endings == [None] * 11 + ["time limit"]
    assert int(sim.episode.episode_length) == 0  # the next episode has started
    assert sim._step._cache_size() == 1  # across resets, pushes and held commands: compiled once


def test_checkpoint_of_another_task_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = BallTask(ball_config())
    contents = checkpoint_contents(jax.device_get(task.init_shared(jax.random.PRNGKey(0))), jax.random.PRNGKey(1), 0, 0)
    path = save_run_checkpoint(tmp_path, contents, task.checkpoints.metadata, 0, 1)
    with pytest.raises(SystemExit) as exit_info:
        CartpoleTask.launch(cartpole_config(compilation_cache_dir=""), ["mode=view", f"load_from_ckpt_path={path}"])
    assert exit_info.value.code == 2
    assert "BallTask" in capsys.readouterr().err


def test_a_recurrent_history_policy_carries_its_memory_and_restarts_it_each_episode() -> None:
    """The viewer steps a GRU policy with an observation history through the env: its state moves from step to
    step, and every new episode starts it afresh (zero GRU state, the history filled with the first frame)."""
    task = MemoryTask(memory_config(recurrent_size=8, observation_history=3, compilation_cache_dir=""))
    sim = ViewerSim(task.environment, jax.device_get(task.init_shared(jax.random.PRNGKey(0))), seed=0)
    carries = []
    for _ in range(MEMORY_EPISODE_STEPS):
        carries.append(np.asarray(sim.episode.policy_state.carry))
        report = sim.step()
    assert report.ended_by == "time limit"
    assert not np.any(carries[0]) and np.any(carries[1]) and not np.allclose(carries[1], carries[2])
    restarted = sim.episode.policy_state
    assert not np.any(np.asarray(restarted.carry))
    frames = np.asarray(restarted.past_frames)
    np.testing.assert_array_equal(frames, np.broadcast_to(frames[-1], frames.shape))
    assert sim._step._cache_size() == 1


def test_a_two_device_checkpoint_drives_the_viewer_with_the_trained_policy(tmp_path: Path) -> None:
    """mode=view of a checkpoint written by a 2-device run: the viewer holds one (un-replicated) copy of the
    trained state, and its deterministic action is the trained policy's on the observation it acted on."""
    trained_task = DistributedBallTask(distributed_ball_config(num_devices=2, num_steps=1, run_dir=str(tmp_path)))
    trained = trained_task.fetch_replicated(trained_task.run().shared)
    ckpt = tmp_path / "checkpoints" / "ckpt_latest.bin"
    task = DistributedBallTask(distributed_ball_config(num_devices=2, mode="view", load_from_ckpt_path=str(ckpt)))
    sim = ViewerSim(task.environment, view_shared(task), seed=0)
    for viewed, wanted in zip(jax.tree.leaves(sim.shared), jax.tree.leaves(trained), strict=True):
        assert viewed.shape == np.shape(wanted)  # no device axis left
        np.testing.assert_array_equal(np.asarray(viewed), wanted)
    initial = view_shared(trained_task)  # no checkpoint: the policy the run started from
    for _ in range(3):
        report = sim.step(deterministic=True)
        (action,) = exported_policy(trained_task, trained)(report.obs[None])
        np.testing.assert_allclose(report.action, np.asarray(action)[0], rtol=1e-5, atol=1e-6)
    (untrained,) = exported_policy(trained_task, initial)(report.obs[None])
    assert not np.allclose(report.action, np.asarray(untrained)[0], rtol=0, atol=1e-6)


def test_the_native_engine_steps_the_viewer() -> None:
    """physics_impl='mujoco' (C MuJoCo through host callbacks) behind the viewer: held commands, pushes, the
    ball's contact-reading reward and the episode's end, compiled once."""
    task = BallTask(ball_config(mode="view", episode_length_steps=6, physics_impl="mujoco"))
    assert task.engine.physics_impl == "mujoco"
    sim = ViewerSim(task.environment, jax.device_get(task.init_shared(jax.random.PRNGKey(0))), seed=0)
    sim.held_command = np.asarray([0.5, 0.0, -0.2], np.float32)
    start = sim.qpos
    reports = [sim.step() for _ in range(5)]
    np.testing.assert_allclose(reports[-1].obs[-3:], sim.held_command, atol=1e-6)
    assert np.all(np.isfinite(reports[-1].qpos)) and not np.allclose(reports[-1].qpos, start)
    assert {"FeetAirTime", "LinearVelocityTracking"} <= set(reports[-1].reward_terms)
    linear = task.engine.layout.free_root_qvel("test")[:3]
    before = np.asarray(sim.episode.data.qvel)[linear]
    sim.push_base()
    assert np.linalg.norm(np.asarray(sim.episode.data.qvel)[linear] - before) > 1e-3
    assert sim.step().ended_by == "time limit"
    assert int(sim.episode.episode_length) == 0
    assert sim._step._cache_size() == 1


def test_on_a_terrain_every_episode_starts_on_a_tile_of_the_chosen_level() -> None:
    """Each new episode on the next terrain type's tile of the level (not at the field's centre, a seam)."""
    from test_terrain import GRID, ball_on_terrain

    task = ball_on_terrain(num_devices=1, physics_impl="mujoco", mode="view")
    terrain, base = task.terrain, task.engine.layout.base_body
    assert terrain is not None
    sim = ViewerSim(task.environment, jax.device_get(task.init_shared(jax.random.PRNGKey(0))), terrain_level=2)
    for column in range(len(GRID.types) + 1):
        xy = np.asarray(sim.episode.data.xpos[base, :2])
        expected = terrain.origins[2, column % len(GRID.types)]
        np.testing.assert_allclose(xy, expected, atol=task.environment.spawn_jitter + 0.05)
        sim.reset()
    fixed = ViewerSim(task.environment, sim.shared, terrain_level=1, terrain_column=0)
    fixed.reset()
    np.testing.assert_allclose(
        np.asarray(fixed.episode.data.xpos[base, :2]), terrain.origins[1, 0], atol=task.environment.spawn_jitter + 0.05
    )
