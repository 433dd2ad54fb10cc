"""The examples run end to end, including the README's multi-device command on forced CPU devices."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import run_example

from examples.walking import CPU_CONFIG, DEFAULT_CONFIG, GPU_CONFIG, WalkingTask, preset_config
from ksim.config import ConfigError
from ksim.xla_setup import lapack_splits_batches


def test_walking_runs_two_train_steps(tmp_path: Path) -> None:
    config = dataclasses.replace(
        DEFAULT_CONFIG,
        num_envs=4,
        batch_size=2,
        rollout_length_frames=8,
        num_steps=2,
        actor_hidden=[32, 32],
        critic_hidden=[32, 32],
        run_dir=str(tmp_path),
    )
    task = WalkingTask(config)
    assert task.engine.action_dim == 21 and task.engine.num_substeps == 4
    state = task.run()
    for leaf in jax.tree.leaves((state.env.obs, state.shared)):
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert (tmp_path / "checkpoints" / "ckpt_latest.bin").exists()
    assert any((tmp_path / "tensorboard").iterdir())


def test_walking_distributed_command_line(tmp_path: Path) -> None:
    result = run_example(
        "examples.walking_distributed",
        "num_steps=3",
        "num_envs=8",
        "batch_size=4",
        f"run_dir={tmp_path}",
        devices=2,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/3", "3/3"]  # the first step, every 5 steps and the end
    assert "num_devices 2" in lines[-1] and "env_steps_per_s_per_device" in lines[-1]
    assert (tmp_path / "checkpoints" / "ckpt_00000003.bin").exists()


@pytest.mark.skipif(not lapack_splits_batches(), reason="the deadlock needs jaxlib >= 0.10")
def test_cpu_deadlock_configuration_is_refused_before_compiling(tmp_path: Path) -> None:
    # A pool of 2 threads with 2 devices and 32 humanoid envs per device is the known deadlock.
    result = run_example(
        "examples.walking_distributed",
        "num_envs=64",
        "batch_size=32",
        f"run_dir={tmp_path}",
        devices=2,
        extra_env={"PJRT_NPROC": "2"},
    )
    assert result.returncode == 2
    assert "Known issue" in result.stderr and "PJRT_NPROC=3" in result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_walking_presets_cpu_by_default_and_gpu_with_every_sim2real_component() -> None:
    assert (
        preset_config([]) is CPU_CONFIG is DEFAULT_CONFIG and preset_config(["preset=gpu", "num_envs=8"]) is GPU_CONFIG
    )
    cpu = WalkingTask(CPU_CONFIG)  # builds the model and checks every component; nothing compiles
    assert not cpu.components.randomizations and cpu.components.command is None and not cpu.components.events
    gpu = WalkingTask(GPU_CONFIG)
    gait_scales = [
        next(r.scale for r in task.components.rewards if r.name == "FootSwingTracking") for task in (cpu, gpu)
    ]
    assert gait_scales == [2.0, 2.0]  # the clock reward reaches the reward itself, the GPU preset's too
    # The GPU preset is the CPU preset's learner at 16x the envs, scaled by the learner's rule.
    assert cpu.learner_line() == ""
    assert gpu.learner_line() == (
        "learner: 2048 envs, 16x the reference_num_envs=128: 64 minibatches of 32 envs, "
        "desired_kl 0.08 (0.01 x 16^(3/4)), clip_eps 0.566 (0.2 x 16^(3/8)), policy_average_decay 0.92 (1 - 0.005 x 16)"
    )
    assert (
        len(gpu.components.randomizations) == 9
        and gpu.components.command is not None
        and len(gpu.components.events) == 1
    )
    assert gpu.environment.noisy_observations(deterministic=False)
    assert gpu.environment.observation_layout()[-1] == ("Command", 3)


def test_kbot_gpu_preset_is_the_cpu_learner_scaled_and_says_what_it_costs_on_a_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from examples import kbot

    assert kbot.preset_from_command_line(kbot.PRESETS, ["num_envs=8"]) is kbot.DEFAULT_CONFIG
    assert kbot.preset_from_command_line(kbot.PRESETS, ["preset=gpu"]) is kbot.GPU_CONFIG
    task = kbot.KBotTask(kbot.GPU_CONFIG)  # builds the model and checks every component; nothing compiles
    assert task.num_minibatches == 32 and task.desired_kl == pytest.approx(0.02 * 8**0.75)
    assert task.clip_eps == pytest.approx(0.2 * 8**0.375)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [
        "learner: 2048 envs, 8x the reference_num_envs=256: 32 minibatches of 64 envs, "
        "desired_kl 0.0951 (0.02 x 8^(3/4)), clip_eps 0.436 (0.2 x 8^(3/8))",
        "note: preset=gpu is sized for GPUs and runs here on the CPU: 49,152 env steps per train step, 8x preset=cpu's "
        "6,144, so each train step takes about 8x as long",
    ]
    with pytest.raises(ConfigError, match="preset='tpu' must be one of"):
        kbot.KBotTask(dataclasses.replace(kbot.DEFAULT_CONFIG, preset="tpu"))
