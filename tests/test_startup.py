"""Speed features: pooled episode starts equal on 1/2/4 devices, compile cache, AOT compile, eval early stop."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import DistributedCartpoleTask, cartpole_config, distributed_cartpole_config

from examples.cartpole import CartpoleTask
from ksim.task.devices import unshard_env_axis

ROOT = Path(__file__).resolve().parents[1]
# Episodes of 3 steps in rollouts of 8: every env ends twice or more per rollout, so the pool refills mid-rollout.
SHORT_EPISODES = {"episode_length_s": None, "episode_length_steps": 3}


def rollout_on(num_devices: int) -> tuple:
    task = DistributedCartpoleTask(distributed_cartpole_config(num_devices=num_devices, **SHORT_EPISODES))
    state = task.init_train_state()
    env, first, _ = task.programs["rollout"](state.shared, state.env)
    env, second, _ = task.programs["rollout"](state.shared, env)
    # (devices, T, envs per device, ...) -> (T, envs, ...)
    trajectories = [jax.tree.map(lambda x: np.concatenate(list(np.asarray(x)), axis=1), t) for t in (first, second)]
    return unshard_env_axis(jax.device_get(env)), trajectories


@pytest.fixture(scope="module")
def one_device() -> tuple:
    return rollout_on(1)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_pooled_starts_are_the_same_on_any_device_count(one_device: tuple, num_devices: int) -> None:
    (env_1, trajectories_1), (env_n, trajectories_n) = one_device, rollout_on(num_devices)
    np.testing.assert_array_equal(env_1.episodes_started, env_n.episodes_started)
    assert int(np.min(env_1.episodes_started)) >= 5  # several episodes per env, several refills
    np.testing.assert_allclose(env_1.data.qpos, env_n.data.qpos, atol=1e-6)
    np.testing.assert_allclose(env_1.next_start.data.qpos, env_n.next_start.data.qpos, atol=1e-6)
    for t_1, t_n in zip(trajectories_1, trajectories_n, strict=True):
        np.testing.assert_allclose(t_1.obs, t_n.obs, atol=1e-5)
        np.testing.assert_array_equal(t_1.truncated, t_n.truncated)


def test_evaluation_stops_when_every_episode_has_ended() -> None:
    task = CartpoleTask(cartpole_config(eval_episodes=4))
    state = task.init_train_state()
    stats, qpos, steps = jax.device_get(task.evaluator.program(*task.evaluator.inputs(state.shared)))
    returns, lengths = stats.returns, stats.lengths
    assert task.environment.settings.max_episode_steps == 500
    assert int(steps) == int(np.max(lengths)) < 500  # the untrained policy drops the pole long before 10 s
    np.testing.assert_allclose(returns, lengths)  # +1 per step
    assert np.all(qpos[int(steps) :] == 0) and np.all(qpos[: int(steps), 1] != 0)  # recorded while running


def test_nothing_compiles_after_the_first_train_step(tmp_path: Path) -> None:
    compiles: list[tuple[int, str]] = []
    steps_done = [0]

    class Counting(DistributedCartpoleTask):
        def train_step(self, state):  # type: ignore[no-untyped-def]
            result = super().train_step(state)
            steps_done[0] += 1
            return result

    def listener(event: str, duration: float, **kwargs: object) -> None:
        if event.startswith("/jax/core/compile/"):
            compiles.append((steps_done[0], event))

    jax.monitoring.register_event_duration_secs_listener(listener)
    config = distributed_cartpole_config(
        num_devices=2,
        num_steps=4,
        grad_sync_period=2,
        consistency_check_every_n_steps=2,
        eval_every_n_steps=2,
        eval_episodes=2,
        log_every_n_steps=1,
        run_dir=str(tmp_path),
    )
    Counting(config).run()
    assert steps_done[0] == 4 and any(step == 0 for step, _ in compiles)
    assert [c for c in compiles if c[0] >= 1] == []
    assert (tmp_path / "scalars.jsonl").read_text().count("eval/return") == 2
    assert (tmp_path / "learning_curve.png").is_file()  # written when training ends


def run_cartpole(*args: str) -> subprocess.CompletedProcess:
    tiny = ["num_envs=8", "batch_size=4", "rollout_length_frames=8", "actor_hidden=[16,16]", "critic_hidden=[16,16]"]
    return subprocess.run(
        [sys.executable, "-m", "examples.cartpole", *tiny, "num_steps=1", *args],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": "", "PJRT_NPROC": ""},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_compilation_cache_setting(tmp_path: Path) -> None:
    # MJX programs: a program stepping native physics holds host-callback addresses, which JAX puts in its key.
    cache, mjx = tmp_path / "cache", "physics_impl=jax"
    first = run_cartpole(f"compilation_cache_dir={cache}", f"run_dir={tmp_path / 'a'}", mjx)
    second = run_cartpole(f"compilation_cache_dir={cache}", f"run_dir={tmp_path / 'b'}", mjx)
    off = run_cartpole("compilation_cache_dir=", f"run_dir={tmp_path / 'c'}", mjx)
    for result in (first, second, off):
        assert result.returncode == 0, result.stderr
    # Both programs are named up front, then each gets its line with its own cache answers (compiled on
    # worker threads while the next one traces).
    assert "compiling train step, evaluation ..." in first.stdout
    for program in ("train step", "evaluation"):
        assert re.search(rf"^  {program}: [0-9.]+ s \(cache: 0 hit\(s\), 1 miss\(es\)\)$", first.stdout, re.M)
        assert re.search(rf"^  {program}: [0-9.]+ s \(cache: 1 hit\(s\), 0 miss\(es\)\)$", second.stdout, re.M)
        assert re.search(rf"^  {program}: [0-9.]+ s \(cache off\)$", off.stdout, re.M)
    assert any(cache.iterdir())


def test_a_native_task_runs_without_importing_mjx() -> None:
    # MJX brings trimesh and SciPy: half a second of every start that C MuJoCo does not need.
    code = (
        "import sys, dataclasses\n"
        "from examples.cartpole import CartpoleTask, DEFAULT_CONFIG\n"
        "task = CartpoleTask(dataclasses.replace(DEFAULT_CONFIG, num_envs=8, batch_size=4, physics_impl='mujoco'))\n"
        "task.train_step(task.init_train_state())\n"
        "print(sorted(name for name in sys.modules if name.startswith('mujoco.mjx')))\n"
    )
    env = {**os.environ, "XLA_FLAGS": "", "PJRT_NPROC": ""}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
