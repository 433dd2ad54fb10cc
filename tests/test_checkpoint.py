"""Checkpoints: exact round trip, resume with counters, shape checks, eval mode, save on SIGTERM."""

import ctypes.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim.checkpoint import load_checkpoint, save_checkpoint
from ksim.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[CartpoleTask, object, Path]:
    run_dir = tmp_path_factory.mktemp("run")
    task = CartpoleTask(cartpole_config(run_dir=str(run_dir), num_steps=2))
    state = task.run()
    return task, state, run_dir


def assert_trees_equal(a: object, b: object) -> None:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_exact(trained: tuple) -> None:
    task, state, run_dir = trained
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["ckpt_00000002.bin", "ckpt_latest.bin"]  # no temp files left behind
    contents = task.load_contents(run_dir / "checkpoints" / "ckpt_latest.bin")
    assert_trees_equal(contents["shared"], task.fetch_replicated(state.shared))
    assert_trees_equal(contents["rng"], task.fetch_replicated(state.rng))
    assert int(contents["step"]) == 2
    assert int(contents["env_steps"]) == 2 * task.env_steps_per_train_step
    assert (run_dir / "config.yaml").read_text().startswith("num_envs: 8")


def test_resume_continues_counters_and_state(trained: tuple, tmp_path: Path) -> None:
    task, _, run_dir = trained
    ckpt = run_dir / "checkpoints" / "ckpt_latest.bin"
    resumed = CartpoleTask(cartpole_config(run_dir=str(tmp_path), num_steps=3, load_from_ckpt_path=str(ckpt)))
    state = resumed.run()
    contents = resumed.load_contents(tmp_path / "checkpoints" / "ckpt_latest.bin")
    assert int(contents["step"]) == 3 and (tmp_path / "checkpoints" / "ckpt_00000003.bin").exists()
    assert int(contents["env_steps"]) == 3 * task.env_steps_per_train_step
    before = task.load_contents(ckpt)
    # Training went on from the loaded params (one more step changed them), with the Adam count carried.
    assert not np.array_equal(
        jax.tree.leaves(before["shared"].params)[0], jax.tree.leaves(contents["shared"].params)[0]
    )
    adam_count = [leaf for leaf in jax.tree.leaves(state.shared.opt_state) if np.asarray(leaf).dtype == np.int32]
    assert int(np.asarray(adam_count[0])) == 3 * task.num_minibatches * task.config.num_passes


def test_shape_mismatch_is_a_clear_error(trained: tuple) -> None:
    _, _, run_dir = trained
    other = CartpoleTask(cartpole_config(actor_hidden=[8, 8]))
    with pytest.raises(
        ConfigError, match=r"does not match the model: .*kernel has shape \(\d+, 16\) in the checkpoint but \(\d+, 8\)"
    ):
        other.load_contents(run_dir / "checkpoints" / "ckpt_latest.bin")
    with pytest.raises(ConfigError, match="does not exist"):
        other.load_contents(run_dir / "missing.bin")


def test_eval_mode_runs_deterministic_episodes(trained: tuple) -> None:
    _, _, run_dir = trained
    ckpt = str(run_dir / "checkpoints" / "ckpt_latest.bin")
    task = CartpoleTask(cartpole_config(mode="eval", load_from_ckpt_path=ckpt, eval_episodes=3, episode_length_s=1.0))
    first, second = task.run(), task.run()
    assert first.shape == (3,)
    np.testing.assert_array_equal(first, second)
    assert np.all(first > 0) and np.all(first <= 50 + 1e-3)  # at most 1 s / 0.02 s steps of reward <= 1


def test_save_is_atomic_on_failure(tmp_path: Path) -> None:
    class Unserialisable:
        pass

    with pytest.raises(Exception):  # noqa: B017 - msgpack's own error type
        save_checkpoint(tmp_path / "ckpt.bin", {"x": Unserialisable()})
    assert list(tmp_path.iterdir()) == []
    save_checkpoint(tmp_path / "ckpt.bin", {"x": np.arange(3)})
    np.testing.assert_array_equal(load_checkpoint(tmp_path / "ckpt.bin", {"x": np.zeros(3, int)})["x"], [0, 1, 2])


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(ROOT / ".jax_cache"), "PYTHONUNBUFFERED": "1"}
    args = [
        "num_envs=8",
        "batch_size=4",
        "rollout_length_frames=8",
        "actor_hidden=[16,16]",
        "critic_hidden=[16,16]",
        "save_every_n_steps=0",
        "log_every_n_steps=5",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "examples.cartpole", *args, "num_steps=100000", f"run_dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 10/"):
            process.send_signal(signal.SIGTERM)
            break
    output = process.stdout.read()
    assert process.wait(timeout=120) == 0, output
    assert "received SIGTERM" in output and "saved checkpoint" in output
    assert (tmp_path / "checkpoints" / "ckpt_latest.bin").exists()


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no EGL library for headless rendering")
def test_eval_writes_a_video_of_the_first_episode(trained: tuple, tmp_path: Path) -> None:
    _, _, run_dir = trained
    video = tmp_path / "episode.gif"
    args = ["actor_hidden=[16,16]", "critic_hidden=[16,16]", "episode_length_s=0.2", "eval_episodes=2"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.cartpole",
            "mode=eval",
            *args,
            f"video_path={video}",
            f"load_from_ckpt_path={run_dir / 'checkpoints' / 'ckpt_latest.bin'}",
        ],
        cwd=ROOT,
        env={**os.environ, "MUJOCO_GL": "egl"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "2 episodes, mean return" in result.stdout and f"wrote {video}" in result.stdout
    import imageio.v2 as imageio

    frames = imageio.mimread(video)
    assert len(frames) == 10  # 0.2 s at ctrl_dt=0.02
    assert np.asarray(frames[0]).std() > 0  # not a blank image
