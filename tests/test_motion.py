"""Reference motions (ksim.motion) and the G1's motors (ksim.actuators.ElectricMotor): no JAX, nothing compiled."""

from __future__ import annotations

import re
from pathlib import Path

import mujoco
import numpy as np
import pytest

from examples.g1_robot import FEET_SITES, G1_MOTORS, MOTIONS_DIR, g1_model
from ksim import motion as km
from ksim.actuators import ElectricMotor, joint_motors, motor_gains, reflected_inertia, with_motor_armature
from ksim.config import ConfigError
from ksim.engine import load_mujoco_model

CLIPS = ("walk", "wave", "high5", "dance", "jumpjack")


@pytest.fixture(scope="module")
def g1() -> mujoco.MjModel:
    return load_mujoco_model("g1/g1.xml")


def synthetic_clip(g1: mujoco.MjModel, frames: int = 31, fps: float = 30.0) -> km.Clip:
    """A root moving at (0.5, -0.2, 0) m/s and turning about z at 0.8 rad/s, every joint at 0.3 rad/s from 0."""
    t = np.arange(frames) / fps
    root_pos = np.stack([0.5 * t, -0.2 * t, np.full_like(t, 0.8)], axis=1)
    half = 0.8 * t / 2
    root_quat = np.stack([np.cos(half), 0 * t, 0 * t, np.sin(half)], axis=1)
    joints = np.outer(t, np.full(g1.nu, 0.3))
    return km.Clip(fps, root_pos, root_quat, joints)


def write_csv(path: Path, clip: km.Clip, quaternion: str = "wxyz") -> Path:
    quat = clip.root_quat if quaternion == "wxyz" else clip.root_quat[:, [1, 2, 3, 0]]
    np.savetxt(path, np.concatenate([clip.root_pos, quat, clip.joint_pos], axis=1), delimiter=",")
    return path


@pytest.mark.parametrize("name", CLIPS)
def test_each_bundled_clip_loads_on_the_g1_at_the_control_rate(g1: mujoco.MjModel, name: str) -> None:
    motion = km.load_motion(MOTIONS_DIR / f"{name}.csv", g1, fps=50.0)
    source = km.read_clip(MOTIONS_DIR / f"{name}.csv")
    assert motion.fps == 50.0 and abs(motion.duration - source.duration) < 1 / 50
    assert motion.body_names[0] == "pelvis" and motion.body_pos.shape == (motion.num_frames, g1.nbody - 1, 3)
    np.testing.assert_allclose(motion.body_pos[0, 0], source.root_pos[0], atol=1e-9)  # frame 0 is the clip's
    np.testing.assert_allclose(np.linalg.norm(motion.body_quat, axis=-1), 1.0, atol=1e-9)
    # Every frame is the model placed at that frame's qpos.
    data = mujoco.MjData(g1)
    data.qpos[:] = motion.qpos(motion.num_frames // 2)
    mujoco.mj_kinematics(g1, data)
    np.testing.assert_allclose(motion.body_pos[motion.num_frames // 2], data.xpos[1:], atol=1e-9)


def test_velocities_by_central_differences_match_a_known_motion(g1: mujoco.MjModel) -> None:
    motion = km.place(synthetic_clip(g1), g1)
    np.testing.assert_allclose(motion.joint_vel, 0.3, atol=1e-9)
    np.testing.assert_allclose(motion.body_lin_vel[:, 0], np.tile([0.5, -0.2, 0.0], (motion.num_frames, 1)), atol=1e-9)
    np.testing.assert_allclose(motion.body_ang_vel[:, 0], np.tile([0.0, 0.0, 0.8], (motion.num_frames, 1)), atol=1e-6)
    # A body off the root's axis turns with it: its world angular velocity is the root's plus its joints'.
    assert np.all(np.linalg.norm(motion.body_ang_vel[:, 5], axis=-1) > 0.8)


def test_resampling_keeps_the_source_frames_and_interpolates_between_them(g1: mujoco.MjModel) -> None:
    clip = synthetic_clip(g1, frames=31, fps=30.0)  # 1 s
    at_60 = km.resample(clip, 60.0)
    assert at_60.num_frames == 61 and at_60.duration == pytest.approx(1.0)
    np.testing.assert_allclose(at_60.joint_pos[::2], clip.joint_pos, atol=1e-12)  # every other frame is a source one
    np.testing.assert_allclose(at_60.root_quat[::2], clip.root_quat, atol=1e-12)
    yaw = 2 * np.arctan2(at_60.root_quat[1:, 3], at_60.root_quat[1:, 0])  # slerp: the yaw grows evenly
    np.testing.assert_allclose(yaw, 0.8 * np.arange(1, 61) / 60, atol=1e-9)
    at_50 = km.resample(clip, 50.0)
    assert at_50.num_frames == 51 and at_50.root_pos[-1, 0] == pytest.approx(0.5)


def test_the_shortest_arc_is_taken_between_opposite_signs(g1: mujoco.MjModel) -> None:
    clip = synthetic_clip(g1, frames=3)
    flipped = km.Clip(clip.fps, clip.root_pos, clip.root_quat * np.array([[1], [-1], [1]]), clip.joint_pos)
    np.testing.assert_allclose(
        np.abs(km.resample(flipped, 60.0).root_quat), np.abs(km.resample(clip, 60.0).root_quat), atol=1e-12
    )


def test_unitree_csv_and_npz_read_as_the_same_clip(g1: mujoco.MjModel, tmp_path: Path) -> None:
    clip = synthetic_clip(g1)
    ours = km.read_clip(write_csv(tmp_path / "ours.csv", clip))
    unitree = km.read_clip(write_csv(tmp_path / "unitree.csv", clip, "xyzw"), quaternion="xyzw")
    np.testing.assert_allclose(unitree.root_quat, ours.root_quat, atol=1e-12)
    placed = km.place(km.check_clip(ours, g1, "ours"), g1)
    again = km.read_clip(placed.save(tmp_path / "clip.npz"))
    assert again.fps == 30.0
    np.testing.assert_allclose(km.place(km.check_clip(again, g1, "npz"), g1).body_pos, placed.body_pos, atol=1e-9)


def test_the_command_prints_what_a_clip_does_on_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = str(tmp_path / "missing.xml")
    lines = km.main([str(MOTIONS_DIR / "dance.csv"), "--model", str(g1_xml()), "--out", str(tmp_path / "d.npz")])
    assert lines[0] == "150 frames at 30 fps: 4.97 s"
    assert re.fullmatch(r"past their ranges: left_elbow_joint by 0\.01\d rad", lines[1])
    assert lines[2] == "lowest height of left_foot, right_foot: -0.026 m" and (tmp_path / "d.npz").exists()
    with pytest.raises(SystemExit) as exit_:
        km.main([str(MOTIONS_DIR / "walk.csv"), "--model", model])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith(f"error: --model {model}: ")
    with pytest.raises(SystemExit):
        km.main([str(MOTIONS_DIR / "walk.csv"), "--model", str(g1_xml()), "--feet", "left_toe"])
    assert capsys.readouterr().err == "error: --feet: the model has no site left_toe\n"
    with pytest.raises(SystemExit):
        km.main([str(MOTIONS_DIR / "walk.csv"), "--model", str(g1_xml()), "--fps", "0"])
    assert capsys.readouterr().err == "error: fps=0.0 must be positive\n"


def g1_xml() -> Path:
    return MOTIONS_DIR.parent.parent / "g1" / "g1.xml"


def test_a_clip_that_does_not_fit_is_refused_in_one_line(g1: mujoco.MjModel, tmp_path: Path) -> None:
    clip = synthetic_clip(g1)
    longer = clip.root_quat * np.where(np.arange(31) == 7, 1.1, 1.0)[:, None]
    refusals = {
        "fewer joints": (
            km.Clip(clip.fps, clip.root_pos, clip.root_quat, clip.joint_pos[:, :-1]),
            "motion fewer joints: 28 joint angles per frame, the model has 29 joints",
        ),
        "nan": (
            km.Clip(clip.fps, clip.root_pos, clip.root_quat, np.where(np.eye(31, 29, k=-4) > 0, np.nan, 0.0)),
            "motion nan: a joint angle of frame 4 is nan, not finite",
        ),
        "long quaternion": (
            km.Clip(clip.fps, clip.root_pos, longer, clip.joint_pos),
            "motion long quaternion: the root quaternion of frame 7 has length 1.1000, not 1 "
            "(a CSV in Unitree's x, y, z, w order needs quaternion=xyzw)",
        ),
        "other names": (
            km.Clip(clip.fps, clip.root_pos, clip.root_quat, clip.joint_pos, ("a", *km.robot_joints(g1)[1:])),
            "motion other names: joint 0 is 'a', the model's is 'left_hip_pitch_joint'",
        ),
    }
    for source, (bad, message) in refusals.items():
        with pytest.raises(ConfigError) as error:
            km.check_clip(bad, g1, source)
        assert str(error.value) == message
    (tmp_path / "clip.txt").write_text("1,2")
    with pytest.raises(ConfigError, match=r"clip.txt: a clip is a .csv or an .npz file$"):
        km.read_clip(tmp_path / "clip.txt")
    with pytest.raises(ConfigError, match=r"^quaternion='zyxw' must be one of 'wxyz', 'xyzw'$"):
        km.read_clip(tmp_path / "clip.txt", quaternion="zyxw")
    with pytest.raises(ConfigError, match="first joint is a free joint"):
        km.check_clip(clip, load_mujoco_model("cartpole.xml"), "cartpole")


def test_reflected_inertia_counts_each_stage_by_its_speed_up_squared() -> None:
    # The rotor turns 4 x 5 = 20 times as fast as the joint, the first stage's carrier 5 times, the last stage 1.
    assert reflected_inertia((1e-4, 2e-4, 3e-4), (1.0, 4.0, 5.0)) == pytest.approx(1e-4 * 400 + 2e-4 * 25 + 3e-4)
    with pytest.raises(ConfigError, match="one gear per inertia: 2 inertias, 3 gears"):
        reflected_inertia((1.0, 2.0), (1.0, 2.0, 3.0))


def test_motor_gains_make_each_joint_a_second_order_system_of_the_asked_frequency_and_damping() -> None:
    drive = ElectricMotor((0.489e-4, 0.098e-4, 0.533e-4), (1.0, 4.5, 1.0 + 48 / 22), 88.0, 32.0)
    kp, kd = drive.gains(natural_frequency_hz=10.0, damping_ratio=2.0)
    inertia = drive.armature  # a x'' + kd x' + kp x = 0
    assert np.sqrt(kp / inertia) == pytest.approx(2 * np.pi * 10.0)
    assert kd / (2 * np.sqrt(kp * inertia)) == pytest.approx(2.0)
    pair = ElectricMotor(drive.rotor_inertias, drive.gears, 88.0, 32.0, count=2)
    assert pair.armature == pytest.approx(2 * drive.armature) and pair.torque_limit == 176.0


def test_the_g1_gets_every_joints_drive_from_its_motor_table(g1: mujoco.MjModel) -> None:
    drives = joint_motors(g1, G1_MOTORS)
    names = km.robot_joints(g1)
    assert len(drives) == 29
    assert drives[names.index("left_knee_joint")].effort_limit == 139.0
    assert drives[names.index("right_ankle_roll_joint")].count == 2
    model = g1_model()
    gains = motor_gains(g1, G1_MOTORS)
    knee = names.index("left_knee_joint")
    assert model.dof_armature[g1.jnt_dofadr[g1.joint("left_knee_joint").id]] == pytest.approx(drives[knee].armature)
    assert model.actuator_forcerange[knee].tolist() == [-139.0, 139.0]
    assert model.actuator_gainprm[knee, 0] == pytest.approx(float(gains.kp[knee]))


@pytest.mark.parametrize("keyframe", [None, "knees_bent"])
def test_the_g1_holds_each_of_its_poses_on_its_servos(keyframe: str | None) -> None:
    model = g1_model(keyframe)
    assert model.key(0).name == (keyframe or "home") and model.nkey == (2 if keyframe is None else 1)
    data = mujoco.MjData(model)
    data.qpos[:] = model.key_qpos[0]
    data.ctrl[:] = model.key_qpos[0][model.jnt_qposadr[model.actuator_trnid[:, 0]]]
    for _ in range(200):
        mujoco.mj_step(model, data)
    assert data.qpos[2] > 0.65
    feet = [data.site_xpos[model.site(name).id, 2] for name in FEET_SITES]
    assert max(feet) < 0.05


def test_a_keyframe_the_model_lacks_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^keyframe='sitting': g1/g1.xml has no such keyframe; its keyframes are"):
        g1_model("sitting")


def test_a_motor_table_that_does_not_cover_the_joints_exactly_is_refused(g1: mujoco.MjModel) -> None:
    one = next(iter(G1_MOTORS.values()))
    with pytest.raises(ConfigError, match=r"^joint 'left_hip_pitch_joint' matches no motor pattern; each actuated"):
        joint_motors(g1, {"waist_.*": one})
    with pytest.raises(ConfigError, match=r"matches the motor patterns '.\*_joint', 'left_.\*'; each actuated"):
        joint_motors(g1, {".*_joint": one, "left_.*": one})
    with pytest.raises(ConfigError, match=r"^motor pattern 'tail_joint' matches no actuated joint of the model$"):
        joint_motors(g1, {".*_joint": one, "tail_joint": one})
    with pytest.raises(ConfigError, match="must be positive"):
        motor_gains(g1, {".*_joint": one}, natural_frequency_hz=0.0)
    assert with_motor_armature(g1, {".*_joint": one}).dof_armature[6:].tolist() == pytest.approx([one.armature] * 29)
