"""K-Bot: the firmware's gains from the robot's metadata, bad metadata refused in one line, and the example on two
devices (with the symmetry loss) with a checkpoint that mode=eval, mode=export and the viewer take, and its
first train step on one device; the same recipe on the G1."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from examples.kbot import DEFAULT_CONFIG, KBotTask
from ksim.actuators import gains_from_metadata, motor_gains
from ksim.commands import VelocityCommand
from ksim.config import ConfigError
from ksim.engine import ASSETS_DIR, ModelLayout, load_mujoco_model
from ksim.modes import evaluate, export, train
from ksim.policy_spec import load_policy_spec
from ksim.reporting import SCALARS_FILE
from ksim.viewer.sim import ViewerSim

ROOT = Path(__file__).resolve().parents[1]
METADATA = ASSETS_DIR / "kbot" / "metadata.json"
TINY = {
    "num_envs": 8,
    "batch_size": 4,
    "rollout_length_frames": 8,
    "num_passes": 1,
    "num_steps": 2,
    "eval_every_n_steps": 0,
    "save_every_n_steps": 0,
    "eval_episodes": 4,
}


def test_the_servos_take_the_firmwares_gains_and_torque_limits() -> None:
    model = load_mujoco_model("kbot/kbot.xml")
    gains = gains_from_metadata(model, METADATA)
    table = json.loads(METADATA.read_text())["joint_name_to_metadata"]
    for i in range(model.nu):
        joint = model.joint(int(model.actuator_trnid[i, 0])).name
        expected = [float(table[joint][field]) for field in ("kp", "kd", "soft_torque_limit")]
        np.testing.assert_allclose([gains.kp[i], gains.kd[i], gains.torque_limit[i]], expected, rtol=1e-6)
    servos = KBotTask(dataclasses.replace(DEFAULT_CONFIG, **TINY)).engine.mj_model  # the example's model
    np.testing.assert_allclose(servos.actuator_gainprm[:, 0], gains.kp, rtol=1e-6)
    np.testing.assert_allclose(-servos.actuator_biasprm[:, 2], gains.kd, rtol=1e-6)
    knee = servos.actuator("dof_left_knee_04_ctrl").id
    assert list(servos.actuator_forcerange[knee]) == pytest.approx([-84.0, 84.0])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("dof_left_knee_04"), "joint 'dof_left_knee_04' is missing (the model's actuator drives it)"),
        (
            lambda t: t["dof_right_ankle_02"].update(kp="stiff"),
            "joint 'dof_right_ankle_02' field 'kp' is 'stiff', not a positive number",
        ),
        (lambda t: t.update(dof_tail={"kp": "1"}), "joint 'dof_tail' is not driven by any actuator of the model"),
    ],
)
def test_metadata_that_does_not_match_the_model_is_one_line(tmp_path: Path, edit: object, message: str) -> None:
    data = json.loads(METADATA.read_text())
    edit(data["joint_name_to_metadata"])  # type: ignore[operator]
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as error:
        gains_from_metadata(load_mujoco_model("kbot/kbot.xml"), path)
    assert str(error.value) == f"{path}: {message}"


def test_a_command_range_with_low_above_high_is_one_line() -> None:
    layout = ModelLayout.create(load_mujoco_model("kbot/kbot.xml"))
    with pytest.raises(ConfigError) as error:
        VelocityCommand(forward=(1.2, -0.5)).bind(layout)
    assert str(error.value) == "VelocityCommand.forward=(1.2, -0.5) is an empty range (low must be <= high)"


def test_kbot_trains_on_two_devices_and_its_checkpoint_serves_eval_export_and_view(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    args = [f"{key}={value}" for key, value in TINY.items()]
    result = subprocess.run(
        [sys.executable, "-m", "examples.kbot", *args, "symmetry_coef=0.5", f"run_dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    last_step = [line for line in result.stdout.splitlines() if line.startswith("step ")][-1]
    assert "num_devices 2" in last_step and "symmetry_loss" in last_step
    checkpoint = str(tmp_path / "checkpoints" / "ckpt_latest.bin")
    config = dataclasses.replace(DEFAULT_CONFIG, **TINY, load_from_ckpt_path=checkpoint)

    returns = evaluate.run(KBotTask(dataclasses.replace(config, mode="eval")))
    line = capsys.readouterr().out
    assert len(returns) == 4 and "yaw_rate_error" in line and "command_error" in line

    policy = tmp_path / "policy.onnx"
    export.run(KBotTask(dataclasses.replace(config, mode="export")), export.Settings(export_path=str(policy)))
    spec = load_policy_spec(policy.with_suffix(".json"))
    assert spec.simulator_inputs == [] and len(spec.joints) == 20  # robot_inputs_only: the actor reads sensors
    assert {"sensor:imu_site_quat", "sensor:imu_gyro", "command"} <= set(spec.readings())

    task = KBotTask(dataclasses.replace(config, mode="view"))
    sim = ViewerSim(task.environment, jax.device_get(task.checkpoints.load(checkpoint)["shared"]), seed=0)
    reports = [sim.step() for _ in range(3)]
    assert all(report is not None for report in reports) and int(sim.episode.episode_length) > 0


def test_kbots_first_train_step_on_one_device_moves_the_policy(tmp_path: Path) -> None:
    settings = {**TINY, "num_steps": 1, "log_every_n_steps": 1, "num_devices": 1, "run_dir": str(tmp_path)}
    config = dataclasses.replace(DEFAULT_CONFIG, **settings)
    state = train.run(KBotTask(config))
    (row,) = [json.loads(line) for line in (tmp_path / SCALARS_FILE).read_text().splitlines()]
    assert row["num_devices"] == 1 and row["approx_kl"] > 1e-4  # an update on one device changed the policy
    assert all(np.isfinite(row[key]) for key in ("policy_loss", "value_loss", "entropy", "approx_kl"))
    assert all(bool(np.all(np.isfinite(leaf))) for leaf in jax.tree.leaves(state.shared))


def test_the_recipe_carries_to_the_g1_with_its_motors_and_pelvis_imu(tmp_path: Path) -> None:
    from examples.g1 import DEFAULT_CONFIG as G1_CONFIG
    from examples.g1 import G1Task
    from examples.g1_robot import G1_MOTORS

    config = dataclasses.replace(G1_CONFIG, **TINY, num_devices=1, run_dir=str(tmp_path))
    task = G1Task(config)
    model = task.engine.mj_model
    gains = motor_gains(load_mujoco_model("g1/g1.xml"), G1_MOTORS)
    np.testing.assert_allclose(model.actuator_gainprm[:, 0], gains.kp, rtol=1e-5)
    train.run(task)

    policy = tmp_path / "policy.onnx"
    checkpoint = str(tmp_path / "checkpoints" / "ckpt_latest.bin")
    exporter = G1Task(dataclasses.replace(config, mode="export", load_from_ckpt_path=checkpoint))
    export.run(exporter, export.Settings(export_path=str(policy)))
    spec = load_policy_spec(policy.with_suffix(".json"))
    assert spec.simulator_inputs == [] and len(spec.joints) == 29
    assert {"sensor:pelvis_orientation", "sensor:pelvis_gyro", "command"} <= set(spec.readings())
