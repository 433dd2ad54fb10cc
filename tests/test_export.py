"""Export: the ONNX policy matches the JAX deterministic policy; policy.json describes it; bad settings fail early."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from helpers import BLOCK_JAX, cartpole_config

from examples.cartpole import CartpoleTask
from ksim.config import ConfigError
from ksim.deploy.onnx import load_policy_spec
from ksim.modes import check as check_mode
from ksim.modes import export, split_arguments
from ksim.modes.export import exported_policy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[CartpoleTask, dict, Path]:
    """A 2-step training run, its checkpoint exported with mode=export."""
    run_dir = tmp_path_factory.mktemp("run")
    CartpoleTask(cartpole_config(run_dir=str(run_dir))).run()
    ckpt = str(run_dir / "checkpoints" / "ckpt_latest.bin")
    onnx_path = run_dir / "export" / "policy.onnx"
    task = CartpoleTask(cartpole_config(mode="export", load_from_ckpt_path=ckpt))
    assert task.run(export.Settings(export_path=str(onnx_path))) == onnx_path
    return task, task.checkpoints.load(ckpt), onnx_path


@pytest.fixture(scope="module")
def recorded_observations(exported: tuple) -> np.ndarray:
    """Raw observations of a short stochastic rollout of the checkpoint's policy (8 envs x 8 steps)."""
    task, contents, _ = exported
    state = task.init_train_state(contents["shared"], contents["rng"])
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    return np.asarray(trajectory.obs).reshape(-1, task.environment.observation_dim)


def jax_actions(task: CartpoleTask, contents: dict, observations: np.ndarray) -> np.ndarray:
    (actions,) = exported_policy(task, contents["shared"])(jnp.asarray(observations))
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


def test_an_elu_policy_exports_to_the_same_actions(tmp_path: Path, recorded_observations: np.ndarray) -> None:
    """ONNX has its own Elu: the export of an `activation='elu'` policy computes what JAX computes."""
    CartpoleTask(cartpole_config(run_dir=str(tmp_path), activation="elu")).run()
    ckpt, onnx_path = str(tmp_path / "checkpoints" / "ckpt_latest.bin"), tmp_path / "policy.onnx"
    task = CartpoleTask(cartpole_config(mode="export", load_from_ckpt_path=ckpt, activation="elu"))
    task.run(export.Settings(export_path=str(onnx_path)))
    (onnx_actions,) = ort.InferenceSession(str(onnx_path)).run(
        ["action"], {"observation": recorded_observations.astype(np.float32)}
    )
    expected = jax_actions(task, task.checkpoints.load(ckpt), recorded_observations)
    np.testing.assert_allclose(onnx_actions, expected, atol=1e-5)
    tanh_task = CartpoleTask(cartpole_config(allow_checkpoint_mismatch=True))  # same shapes, another function
    with pytest.raises(ConfigError, match=r"activation=elu in the checkpoint, tanh here \(the setting must match"):
        tanh_task.checkpoints.load(ckpt)


def test_policy_json_names_inputs_and_actions(exported: tuple) -> None:
    task, _, onnx_path = exported
    spec = load_policy_spec(onnx_path.with_suffix(".json"))
    assert [(item.name, item.size, item.reading) for item in spec.inputs] == [
        ("JointPosition", 1, "joint_positions"),
        ("JointVelocity", 2, "joint_velocities"),
    ]
    assert spec.joints == ["slider", "hinge"] and spec.inputs[0].indices == [1]  # the encoders; the hinge
    assert spec.actuation is not None and spec.actuation.kind == "torque" and spec.model_file == "policy.mjb"
    assert spec.task_class == "examples.cartpole:CartpoleTask" and (onnx_path.parent / "policy.mjb").exists()
    assert spec.observation_size == task.environment.observation_dim == 3
    assert spec.actuators == ["slide"] and spec.action_size == 1 and spec.action_scale == 1.0
    assert spec.actuator_type == "TorqueActuators" and "motor control" in spec.action_meaning
    assert spec.task == "CartpoleTask" and spec.ctrl_dt == 0.02 and spec.onnx_file == "policy.onnx"
    assert spec.versions["jax"] == jax.__version__ and spec.checkpoint.endswith("ckpt_latest.bin")
    assert (spec.input_name, spec.output_name) == ("observation", "action")


STAND_IN_ROBOT = """
import numpy as np
class Robot:
    sent = []
    def joint_positions(self): return np.array([0.1, 0.05])
    def joint_velocities(self): return np.array([0.0, -0.1])
    def send(self, ctrl): self.sent.append(ctrl); print(ctrl.tolist())
robot = Robot()
"""


def runtime_snippet() -> str:
    text = (ROOT / "docs" / "real-robot.md").read_text()
    (snippet,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "ksim.runtime" in block]
    return snippet


def test_docs_runtime_loop_runs_an_exported_policy_without_jax(exported: tuple) -> None:
    task, contents, onnx_path = exported
    snippet = runtime_snippet()
    assert len(snippet.splitlines()) <= 12
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_JAX + STAND_IN_ROBOT + snippet],
        cwd=onnx_path.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    reads, *sent = result.stdout.strip().splitlines()
    assert reads == "reads {'joint_positions': 2, 'joint_velocities': 2}" and len(sent) == 3
    expected = jax_actions(task, contents, np.array([[0.05, 0.0, -0.1]], np.float32))[0]
    low, high = task.engine.mj_model.actuator_ctrlrange[0]
    np.testing.assert_allclose(json.loads(sent[0]), np.clip(expected, low, high), atol=1e-5, rtol=0)


def test_sim2sim_runs_the_export_in_plain_mujoco_beside_mode_eval(exported: tuple) -> None:
    _, _, onnx_path = exported
    checkpoint = load_policy_spec(onnx_path.with_suffix(".json")).checkpoint
    video = onnx_path.parent / "sim2sim.gif"
    command = [sys.executable, "-m", "ksim.sim2sim", str(onnx_path), "--episodes", "4", "--checkpoint", checkpoint]
    env = {**os.environ, "MUJOCO_GL": "egl"}
    result = subprocess.run(
        [*command, "--video", str(video)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr
    assert video.stat().st_size > 0
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("sim2sim: every reading from the joint state and named sensors")
    ours, theirs = lines[-2:]
    assert ours.startswith("sim2sim   CartpoleTask: 4 episodes, mean return ") and "fall_rate" in ours
    assert theirs.startswith("mode=eval CartpoleTask: 4 episodes, mean return ")
    for line in (ours, theirs):  # the cart-pole's one termination ended every episode that fell, in both
        fields = dict(field.rsplit(" ", 1) for field in line.split(", ")[1:] if " " in field)
        assert fields["ended_by/JointOutOfRange"] == fields["fall_rate"]


def test_sim2sim_refuses_a_timestep_that_does_not_divide_ctrl_dt(exported: tuple) -> None:
    _, _, onnx_path = exported
    command = [sys.executable, "-m", "ksim.sim2sim", str(onnx_path), "--timestep", "0.003"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --timestep=0.003 must divide the policy's ctrl_dt=0.02"


def test_load_policy_spec_refuses_other_files(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(ConfigError, match="is not a ksim policy JSON"):
        load_policy_spec(tmp_path / "other.json")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mode=export", "export_path=policy.onnx"], "mode='export' needs load_from_ckpt_path=<checkpoint file>"),
        (["mode=export", "load_from_ckpt_path=ckpt.bin"], "mode='export' needs export_path=<file>.onnx"),
        (
            ["mode=export", "load_from_ckpt_path=ckpt.bin", "export_path=policy.pt"],
            "export_path='policy.pt' must end in .onnx",
        ),
        (["export_path=policy.onnx"], "export_path is a setting of mode=export, not of mode=train"),
    ],
)
def test_bad_export_settings_fail_before_anything_is_built(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_mode(*split_arguments(cartpole_config(), args))  # as launch does, before the task is built
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
