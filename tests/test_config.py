"""Bad settings fail with one clear message naming the setting and the rule, before anything compiles."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DistributedCartpoleTask, cartpole_config, distributed_cartpole_config

from examples.cartpole import DEFAULT_CONFIG, CartpoleTask
from ksim.config import ConfigError, help_text, parse_overrides
from ksim.modes import check as check_mode
from ksim.modes import split_arguments

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_envs": 0}, "num_envs=0 must be positive"),
        ({"batch_size": -2}, "batch_size=-2 must be positive"),
        ({"num_passes": 0}, "num_passes=0 must be positive"),
        ({"rollout_length_frames": 0}, "rollout_length_frames=0 must be positive"),
        ({"num_envs": 6, "batch_size": 4}, "num_envs=6 is not divisible by batch_size=4"),
        ({"ctrl_dt": 0.02, "dt": 0.003}, "dt=0.003 must divide ctrl_dt=0.02"),
        ({"ctrl_dt": 0.005, "dt": 0.01}, "dt=0.01 must divide ctrl_dt=0.005"),
        ({"mode": "fly"}, "mode='fly' must be one of 'train', 'eval'"),
        ({"mode": "eval"}, "mode='eval' needs load_from_ckpt_path"),
        ({"gamma": 1.5}, "gamma=1.5 must be in [0, 1]"),
        ({"learning_rate": 0.0}, "learning_rate=0.0 must be positive"),
        ({"episode_length_steps": 100}, "set exactly one of episode_length_s=10.0 and episode_length_steps=100"),
        ({"episode_length_s": None}, "set exactly one of episode_length_s=None and episode_length_steps=None"),
        ({"episode_length_s": None, "episode_length_steps": 0}, "episode_length_steps=0 must be positive"),
        ({"max_grad_norm": -1.0}, "max_grad_norm=-1.0 must be >= 0"),
        ({"base_body": "pole_tip"}, "base_body: no body named 'pole_tip'; the model's bodies are 'cart', 'pole'"),
        ({"base_body": "world"}, "base_body='world' is the world"),
        ({"eval_every_n_steps": -1}, "eval_every_n_steps=-1 must be >= 0"),
        ({"learning_rate_schedule": "step"}, "learning_rate_schedule='step' must be one of 'constant', 'linear'"),
        ({"activation": "gelu"}, "activation='gelu' must be one of 'tanh', 'elu', 'silu', 'relu'"),
        ({"desired_kl": -0.01}, "desired_kl=-0.01 must be positive"),
        ({"reward_scaling": 0.0}, "reward_scaling=0.0 must be positive"),
        (
            {"learning_rate_schedule": "adaptive", "learning_rate": 0.1},
            "learning_rate=0.1 must be in [min_learning_rate=1e-05, max_learning_rate=0.01]",
        ),
    ],
)
def test_single_device_rules(overrides: dict, message: str) -> None:
    config = cartpole_config(**overrides)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_mode(config)  # as launch and run do: the mode's own rules, then the task's
        CartpoleTask(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"num_envs": 6, "batch_size": 2, "num_devices": 4},
            "num_envs=6 is not divisible by the 4 devices in use",
        ),
        (
            {"num_envs": 8, "batch_size": 2, "num_devices": 4},
            "batch_size=2 is not divisible by the 4 devices in use",
        ),
        ({"num_envs": 12, "batch_size": 8, "num_devices": 4}, "num_envs=12 is not divisible by batch_size=8"),
        ({"num_devices": 5}, "num_devices=5 must be between 1 and the 4 local devices"),
        ({"num_devices": 0}, "num_devices=0 must be between 1 and the 4 local devices"),
        ({"grad_sync_period": 0}, "grad_sync_period=0 must be >= 1"),
        ({"pmap_axis_name": " "}, "pmap_axis_name must be a non-empty name"),
        ({"on_divergence": "ignore"}, "on_divergence='ignore' must be one of 'raise', 'resync'"),
        ({"consistency_check_every_n_steps": -1}, "consistency_check_every_n_steps=-1 must be >= 0"),
        ({"heartbeat_timeout_s": 0}, "heartbeat_timeout_s=0 must be a whole number of seconds >= 1"),
        ({"startup_timeout_s": 0.5}, r"startup_timeout_s=0\.5 must be a whole number of seconds >= 1"),
        (
            {"coordinator_address": "127.0.0.1:1", "num_processes": 2, "shutdown_timeout_s": -3},
            "shutdown_timeout_s=-3 must be a whole number of seconds >= 1",
        ),
        (
            {"coordinator_address": "127.0.0.1:1", "num_processes": 2, "process_id": 2},
            r"process_id=2 must be in 0 \.\. num_processes - 1 \(num_processes=2\)",
        ),
    ],
)
def test_distributed_rules(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DistributedCartpoleTask(distributed_cartpole_config(**overrides))


def test_all_local_devices_by_default() -> None:
    task = DistributedCartpoleTask(distributed_cartpole_config())
    assert task.num_devices == 4
    assert task.envs_per_device == 2


def test_overrides_parse_and_type_check() -> None:
    config = parse_overrides(DEFAULT_CONFIG, ["num_envs=32", "learning_rate=1e-4", "actor_hidden=[8,8]"])
    assert (config.num_envs, config.learning_rate, config.actor_hidden) == (32, 1e-4, [8, 8])
    assert type(config) is type(DEFAULT_CONFIG)
    with pytest.raises(ConfigError, match="unknown setting 'num_env'"):
        parse_overrides(DEFAULT_CONFIG, ["num_env=3"])
    with pytest.raises(ConfigError, match="num_envs=lots is not valid"):
        parse_overrides(DEFAULT_CONFIG, ["num_envs=lots"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides(DEFAULT_CONFIG, ["num_envs"])


def test_help_lists_every_field_with_its_help_then_each_modes_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        CartpoleTask.launch(DEFAULT_CONFIG, ["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(help_text(DEFAULT_CONFIG) + "\n\nSettings of mode=eval (override with key=value):\n")
    assert "num_envs: int = 64" in out
    assert "Environments per minibatch" in out
    assert "clip_eps: float = 0.2" in out
    assert "video_path: str = ''" in out and "export_path: str = ''" in out and "view_port: int = 8080" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mode=eval", "load_from_ckpt_path=c.bin", "video_path=out.avi"], "video_path='out.avi' must end in .mp4"),
        (["mode=eval", "load_from_ckpt_path=c.bin", "video_width=0"], "video_width=0 must be positive"),
        (["mode=eval", "load_from_ckpt_path=c.bin", "geom_groups=[0,7]"], "geom_groups=[0, 7] may hold only"),
        (["video_path=run.gif"], "video_path is a setting of mode=eval, not of mode=train"),
        (["mode=export", "geom_groups=[3]"], "geom_groups is a setting of mode=eval and mode=view, not of mode=export"),
        (["mode=eval", "load_from_ckpt_path=c.bin", "video_pth=a.gif"], "unknown setting 'video_pth'"),
    ],
)
def test_a_modes_own_settings_follow_its_rules_and_no_other_mode_takes_them(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_mode(*split_arguments(DEFAULT_CONFIG, args))
    assert str(error.value).startswith(message)


def test_command_line_error_exits_before_writing_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "examples.cartpole", "num_envs=6", "batch_size=4", f"run_dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().endswith("error: num_envs=6 is not divisible by batch_size=4")
    assert not run_dir.exists()


def test_importing_xax_leaves_forced_device_count_intact() -> None:
    script = "import os, xax, jax; print(os.environ['XLA_FLAGS'], jax.local_device_count())"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=3"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["--xla_force_host_platform_device_count=3", "3"]


def test_episode_length_in_steps_and_gradient_clipping_off() -> None:
    import jax.numpy as jnp
    import numpy as np
    import optax

    task = CartpoleTask(cartpole_config(episode_length_s=None, episode_length_steps=123, max_grad_norm=0.0))
    assert task.environment.settings.max_episode_steps == 123
    params = {"w": jnp.zeros(3)}
    huge = {"w": jnp.full(3, 1e6)}
    updates, _ = task.optimizer.update(huge, task.optimizer.init(params), params)
    expected, _ = optax.adam(task.config.learning_rate).update(huge, optax.adam(1.0).init(params), params)
    np.testing.assert_allclose(updates["w"], expected["w"], rtol=1e-6)  # no clipping before Adam


def test_an_empty_value_sets_a_text_setting_to_the_empty_string() -> None:
    config = parse_overrides(DEFAULT_CONFIG, ["compilation_cache_dir=", "run_dir=out"])
    assert config.compilation_cache_dir == "" and config.run_dir == "out"
