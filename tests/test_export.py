"""Export: the ONNX policy matches the JAX deterministic policy; policy.json describes it; bad settings fail early."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from helpers import cartpole_config, onnxruntime_snippet

from examples.cartpole import CartpoleTask
from ksim.config import ConfigError
from ksim.export import PolicyInput, load_policy_spec
from ksim.modes import check as check_mode
from ksim.modes.export import deterministic_step

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[CartpoleTask, dict, Path]:
    """A 2-step training run, its checkpoint exported with mode=export."""
    run_dir = tmp_path_factory.mktemp("run")
    CartpoleTask(cartpole_config(run_dir=str(run_dir))).run()
    ckpt = str(run_dir / "checkpoints" / "ckpt_latest.bin")
    onnx_path = run_dir / "export" / "policy.onnx"
    task = CartpoleTask(cartpole_config(mode="export", load_from_ckpt_path=ckpt, export_path=str(onnx_path)))
    assert task.run() == onnx_path
    return task, task.checkpoints.load(ckpt), onnx_path


@pytest.fixture(scope="module")
def recorded_observations(exported: tuple) -> np.ndarray:
    """Raw observations of a short stochastic rollout of the checkpoint's policy (8 envs x 8 steps)."""
    task, contents, _ = exported
    state = task.init_train_state(contents["shared"], contents["rng"])
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    return np.asarray(trajectory.obs).reshape(-1, task.environment.observation_dim)


def jax_actions(task: CartpoleTask, contents: dict, observations: np.ndarray) -> np.ndarray:
    (actions,) = deterministic_step(task, contents["shared"])(jnp.asarray(observations))
    return np.asarray(actions)


def test_onnx_policy_matches_the_jax_deterministic_policy(exported: tuple, recorded_observations: np.ndarray) -> None:
    task, contents, onnx_path = exported
    assert recorded_observations.shape == (64, 3) and np.ptp(recorded_observations, axis=0).min() > 0
    assert not np.allclose(np.asarray(contents["shared"].normalizer.mean), 0)  # normalisation is exercised
    session = ort.InferenceSession(str(onnx_path))
    (onnx_actions,) = session.run(["action"], {"observation": recorded_observations.astype(np.float32)})
    expected = jax_actions(task, contents, recorded_observations)
    assert onnx_actions.shape == expected.shape == (64, 1)
    np.testing.assert_allclose(onnx_actions, expected, atol=1e-5, rtol=0)
    (single,) = session.run(None, {"observation": recorded_observations[:1]})  # any batch size
    np.testing.assert_allclose(single, expected[:1], atol=1e-5, rtol=0)


def test_policy_json_names_inputs_and_actions(exported: tuple) -> None:
    task, _, onnx_path = exported
    spec = load_policy_spec(onnx_path.with_suffix(".json"))
    assert spec.inputs == [PolicyInput("JointPosition", 1), PolicyInput("JointVelocity", 2)]
    assert spec.observation_size == task.environment.observation_dim == 3
    assert spec.actuators == ["slide"] and spec.action_size == 1 and spec.action_scale == 1.0
    assert spec.actuator_type == "TorqueActuators" and "motor control" in spec.action_meaning
    assert spec.task == "CartpoleTask" and spec.ctrl_dt == 0.02 and spec.onnx_file == "policy.onnx"
    assert spec.versions["jax"] == jax.__version__ and spec.checkpoint.endswith("ckpt_latest.bin")
    assert (spec.input_name, spec.output_name) == ("observation", "action")


def test_readme_snippet_runs_an_exported_policy(exported: tuple) -> None:
    task, contents, onnx_path = exported
    snippet = onnxruntime_snippet("real-robot.md")
    assert len(snippet.splitlines()) <= 10
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", snippet],  # -I: no ksim on the path, as on a robot
        cwd=onnx_path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed, _, every = result.stdout.strip().partition(" every ")
    assert every == "0.02 s"
    expected = jax_actions(task, contents, np.array([[0.05, 0.0, -0.1]], np.float32))[0]
    np.testing.assert_allclose(json.loads(printed)["slide"], expected[0], atol=1e-5, rtol=0)


def test_load_policy_spec_refuses_other_files(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(ConfigError, match="is not a ksim policy JSON"):
        load_policy_spec(tmp_path / "other.json")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mode": "export", "export_path": "policy.onnx"}, "mode='export' needs load_from_ckpt_path=<checkpoint file>"),
        ({"mode": "export", "load_from_ckpt_path": "ckpt.bin"}, "mode='export' needs export_path=<file>.onnx"),
        (
            {"mode": "export", "load_from_ckpt_path": "ckpt.bin", "export_path": "policy.pt"},
            "export_path='policy.pt' must end in .onnx",
        ),
    ],
)
def test_bad_export_settings_fail_before_anything_is_built(overrides: dict, message: str) -> None:
    config = cartpole_config(**overrides)
    with pytest.raises(ConfigError) as error:
        check_mode(config)  # the mode's rules, then validate_config: both before the engine or a compile
        CartpoleTask(config)
    assert str(error.value) == message


def test_export_without_checkpoint_is_one_line_on_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.cartpole", "mode=export", "export_path=policy.onnx"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: mode='export' needs load_from_ckpt_path=<checkpoint file>"]
    assert "Traceback" not in result.stderr
    assert "compiling" not in result.stdout
