"""Checkpoints: exact round trip, resume with counters, shape and metadata checks, unreadable files,
pruning, the best evaluation's checkpoint, eval mode, save on SIGTERM and surviving SIGKILL mid-save."""

import ctypes.util
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleConfig, CartpoleTask
from ksim import observations as obs
from ksim.checkpoint import load_checkpoint, load_metadata, prune_checkpoints, read_checkpoint, save_checkpoint
from ksim.config import ConfigError
from ksim.reporting import SCALARS_FILE
from ksim.task.loop import GracefulStop
from ksim.task.ppo import PPOTask

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


class HopperTask(PPOTask[CartpoleConfig]):
    """The cart-pole under another, unrelated class: same shapes, so only the metadata tells them apart."""

    get_mujoco_model = CartpoleTask.get_mujoco_model
    get_observations = CartpoleTask.get_observations
    get_rewards = CartpoleTask.get_rewards
    get_terminations = CartpoleTask.get_terminations
    get_resets = CartpoleTask.get_resets
    get_actuators = CartpoleTask.get_actuators


class SwappedObservationsTask(CartpoleTask):
    """Same observation size as CartpoleTask, components in another order."""

    def get_observations(self) -> Sequence[obs.Observation]:
        return [obs.JointVelocity(scale=1.0, joints=("slider", "hinge")), obs.JointPosition(joints=("hinge",))]


def test_round_trip_is_exact(trained: tuple) -> None:
    task, state, run_dir = trained
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["ckpt_00000002.bin", "ckpt_latest.bin"]  # no temp files left behind
    contents = task.checkpoints.load(run_dir / "checkpoints" / "ckpt_latest.bin")
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
    contents = resumed.checkpoints.load(tmp_path / "checkpoints" / "ckpt_latest.bin")
    assert int(contents["step"]) == 3 and (tmp_path / "checkpoints" / "ckpt_00000003.bin").exists()
    assert int(contents["env_steps"]) == 3 * task.env_steps_per_train_step
    before = task.checkpoints.load(ckpt)
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
        other.checkpoints.load(run_dir / "checkpoints" / "ckpt_latest.bin")
    with pytest.raises(ConfigError, match="does not exist"):
        other.checkpoints.load(run_dir / "missing.bin")


def test_metadata_round_trip(trained: tuple) -> None:
    task, _, run_dir = trained
    metadata = load_metadata(run_dir / "checkpoints" / "ckpt_latest.bin")
    assert metadata == task.checkpoints.metadata
    assert metadata is not None and metadata["task"] == "CartpoleTask"
    assert metadata["observations"] == [["JointPosition", 1], ["JointVelocity", 2]]
    assert metadata["actions"] == {"names": ["slide"], "type": "TorqueActuators", "scale": 1.0}
    assert metadata["ctrl_dt"] == 0.02 and set(metadata["versions"]) == {"ksim", "jax", "flax", "mujoco", "mujoco-mjx"}
    assert "actor_hidden:\n- 16\n- 16" in metadata["config"]


def test_checkpoint_of_another_task_is_refused_naming_both(trained: tuple) -> None:
    _, state, run_dir = trained
    ckpt = run_dir / "checkpoints" / "ckpt_latest.bin"
    with pytest.raises(ConfigError) as error:
        HopperTask(cartpole_config()).checkpoints.load(ckpt)
    message = str(error.value)
    assert message == (
        f"load_from_ckpt_path={str(ckpt)!r}: written by CartpoleTask (examples.cartpole:CartpoleTask), this is "
        f"HopperTask ({HopperTask.__module__}:HopperTask) (set allow_checkpoint_mismatch=true to load anyway)"
    )
    allowed = HopperTask(cartpole_config(allow_checkpoint_mismatch=True)).checkpoints.load(ckpt)
    assert_trees_equal(allowed["shared"], jax.device_get(state.shared))


def test_differing_observation_layout_is_refused(trained: tuple) -> None:
    _, _, run_dir = trained
    ckpt = run_dir / "checkpoints" / "ckpt_latest.bin"
    with pytest.raises(ConfigError, match=r"observations differ: the checkpoint has JointPosition\(1\), ") as error:
        SwappedObservationsTask(cartpole_config()).checkpoints.load(ckpt)
    assert "SwappedObservationsTask has JointVelocity(2), JointPosition(1)" in str(error.value)
    assert "\n" not in str(error.value)
    SwappedObservationsTask(cartpole_config(allow_checkpoint_mismatch=True)).checkpoints.load(ckpt)


def test_override_still_refuses_mismatched_shapes(trained: tuple) -> None:
    _, _, run_dir = trained
    other = CartpoleTask(cartpole_config(actor_hidden=[8, 8], allow_checkpoint_mismatch=True))
    with pytest.raises(ConfigError, match="does not match the model"):
        other.checkpoints.load(run_dir / "checkpoints" / "ckpt_latest.bin")


def test_checkpoint_without_metadata_is_refused_unless_allowed(trained: tuple, tmp_path: Path) -> None:
    task, _, run_dir = trained
    old = save_checkpoint(tmp_path / "old.bin", read_checkpoint(run_dir / "checkpoints" / "ckpt_latest.bin")[0])
    with pytest.raises(ConfigError, match=r"has no metadata \(written by an older ksim\) \(set allow_checkpoint_"):
        task.checkpoints.load(old)
    loaded = CartpoleTask(cartpole_config(allow_checkpoint_mismatch=True)).checkpoints.load(old)
    assert int(loaded["step"]) == 2


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        (b"", "is an empty file, not a checkpoint"),
        (b"num_envs: 8\nbatch_size: 4\n", "is truncated or not a ksim checkpoint"),
        (random.Random(0).randbytes(4096), "is truncated or not a ksim checkpoint"),
        (b"\x05", "is not a ksim checkpoint"),
        ("truncated", "is truncated or not a ksim checkpoint"),
    ],
    ids=["empty", "text", "random-bytes", "msgpack-int", "truncated"],
)
def test_unreadable_files_are_one_line_config_errors(
    trained: tuple, tmp_path: Path, content: bytes | str, rule: str
) -> None:
    task, _, run_dir = trained
    if content == "truncated":
        whole = (run_dir / "checkpoints" / "ckpt_latest.bin").read_bytes()
        content = whole[: len(whole) // 2]
    path = tmp_path / "bad.bin"
    path.write_bytes(content)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as error:
        task.checkpoints.load(path)
    message = str(error.value)
    assert message.startswith(f"load_from_ckpt_path={str(path)!r} {rule}") and "\n" not in message


def test_metadata_of_another_kind_is_refused(trained: tuple, tmp_path: Path) -> None:
    task, _, run_dir = trained
    state_dict, _ = read_checkpoint(run_dir / "checkpoints" / "ckpt_latest.bin")
    path = save_checkpoint(tmp_path / "odd.bin", state_dict, {"task": "CartpoleTask"})
    with pytest.raises(ConfigError, match="has metadata without observations, actions \\(not a task's checkpoint\\)"):
        task.checkpoints.load(path)


def test_keep_last_n_checkpoints_prunes_old_numbered_ones(trained: tuple, tmp_path: Path) -> None:
    _, state, _ = trained
    task = CartpoleTask(cartpole_config(keep_last_n_checkpoints=3))
    stale = tmp_path / "checkpoints" / ".ckpt_latest.bin.abc123.tmp"  # left by a writer killed mid-save
    stale.parent.mkdir()
    stale.write_bytes(b"half a checkpoint")
    for step in range(1, 7):
        task.checkpoints.save(tmp_path, state, step, step * 10)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt_00000004.bin", "ckpt_00000005.bin", "ckpt_00000006.bin", "ckpt_latest.bin"]
    assert int(task.checkpoints.load(tmp_path / "checkpoints" / "ckpt_latest.bin")["step"]) == 6
    for step in range(7, 9):  # 0 keeps all
        CartpoleTask(cartpole_config(keep_last_n_checkpoints=0)).checkpoints.save(tmp_path, state, step, 0)
    assert len(list((tmp_path / "checkpoints").glob("ckpt_0*.bin"))) == 5
    assert prune_checkpoints(tmp_path / "checkpoints", 1) == [
        tmp_path / "checkpoints" / f"ckpt_{step:08d}.bin" for step in range(4, 8)
    ]


def test_the_best_evaluation_is_kept_and_a_resumed_run_keeps_it(tmp_path: Path) -> None:
    settings = {"run_dir": str(tmp_path), "eval_every_n_steps": 1, "eval_episodes": 4, "save_every_n_steps": 1}
    CartpoleTask(cartpole_config(num_steps=4, **settings)).run()
    returns = [
        json.loads(line)["eval/return"]
        for line in (tmp_path / SCALARS_FILE).read_text().splitlines()
        if "eval/return" in line
    ]
    best_step = 1 + int(np.argmax(returns))  # the first of equal bests
    best = tmp_path / "checkpoints" / "ckpt_best.bin"
    assert load_metadata(best)["evaluation"]["step"] == best_step
    assert load_metadata(best)["evaluation"]["score"] == pytest.approx(max(returns))
    loader = CartpoleTask(cartpole_config())
    assert_trees_equal(
        loader.checkpoints.load(best), loader.checkpoints.load(tmp_path / "checkpoints" / f"ckpt_{best_step:08d}.bin")
    )

    resumed = CartpoleTask(
        cartpole_config(num_steps=6, load_from_ckpt_path=str(tmp_path / "checkpoints" / "ckpt_latest.bin"), **settings)
    )
    resumed.evaluation_score = lambda scalars: -1.0  # type: ignore[method-assign]  # worse than any return so far
    resumed.run()
    assert load_metadata(best)["evaluation"]["step"] == best_step


# Saves checkpoints of growing steps until it reaches its pause point: inside save number `pause_step`, before the
# temp file's fsync or before the rename, or after that save returned. There it says "paused" and waits to be
# killed, so each kill lands at a known point of a save, not at whatever a random delay hits.
KILL_WORKER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from ksim.checkpoint import save_checkpoint
    path, pause_at, pause_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    step = 0

    def pausing(point, call):
        def hooked(*args):
            if point == pause_at and step == pause_step:
                print("paused", flush=True)
                time.sleep(600)
            return call(*args)
        return hooked

    os.fsync = pausing("fsync", os.fsync)  # a save's first fsync is its temp file's
    os.replace = pausing("replace", os.replace)
    saved = pausing("saved", lambda: None)
    while True:
        step += 1
        tree = {"weights": np.full((1024, 1024), step, np.float32), "step": np.asarray(step)}
        save_checkpoint(path, tree, {"task": "KillTest", "step": step})
        saved()
    """
)


def test_latest_checkpoint_survives_sigkill_mid_save(tmp_path: Path) -> None:
    path = tmp_path / "ckpt_latest.bin"
    target = {"weights": np.zeros((1024, 1024), np.float32), "step": np.asarray(0)}
    # (pause point, save number, the step ckpt_latest.bin then holds: None for no file yet)
    kills = [("fsync", 1, None), ("replace", 2, 1), ("saved", 2, 2), ("fsync", 3, 2), ("replace", 3, 2)]
    for pause_at, pause_step, expected in kills:
        command = [sys.executable, "-c", KILL_WORKER, str(path), pause_at, str(pause_step)]
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline().strip() == "paused"
        process.kill()
        process.wait(timeout=30)
        process.stdout.close()
        if expected is None:
            assert not path.exists()
            continue
        loaded = load_checkpoint(path, target)
        assert int(loaded["step"]) == expected and np.all(loaded["weights"] == expected), (pause_at, pause_step)
        assert load_metadata(path) == {"task": "KillTest", "step": expected}
    assert len(list(tmp_path.glob(".ckpt_latest.bin.*.tmp"))) == 4  # left by the writers killed inside a save
    prune_checkpoints(tmp_path, keep_last=5)  # sweeps temp files of killed writers
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt_latest.bin"]


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
            # Twice, as `timeout` and schedulers send it (the child, then its process group): still one stop.
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGTERM)
            break
    output = process.stdout.read()
    assert process.wait(timeout=120) == 0, output
    assert "received SIGTERM" in output and "saved checkpoint" in output
    assert (tmp_path / "checkpoints" / "ckpt_latest.bin").exists()


def test_a_second_ctrl_c_stops_at_once_and_a_repeated_sigterm_does_not() -> None:
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
    with GracefulStop() as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no EGL library for headless rendering")
def test_eval_writes_a_video_of_the_first_episode(trained: tuple, tmp_path: Path) -> None:
    _, _, run_dir = trained
    video = tmp_path / "episode.gif"
    args = ["actor_hidden=[16,16]", "critic_hidden=[16,16]", "episode_length_s=0.2", "eval_episodes=2"]
    args += ["video_width=64", "video_height=48"]
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
    assert np.asarray(frames[0]).shape[:2] == (48, 64)
    assert np.asarray(frames[0]).std() > 0  # not a blank image
