"""Motion tracking (ksim.tracking) on a floating torso with two arms and two short clips: frames played one per
control step, episodes truncated at a clip's end, starts drawn where episodes fail, rewards that are 1 on the
reference and ignore the robot's horizontal drift, and an evaluation that reports success and errors per clip."""

from __future__ import annotations

import ctypes.util
import dataclasses
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import run_example

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim import tracking as trk
from ksim.actuators import Actuators, PositionServoActuators
from ksim.commands import Command
from ksim.config import ConfigError
from ksim.engine import StepContext
from ksim.policy_spec import (
    REFERENCE_ANCHOR_ORIENTATION,
    REFERENCE_JOINTS,
    RUNTIME,
    ActuationSpec,
    PolicyInput,
    PolicySpec,
)
from ksim.resets import Reset
from ksim.runtime import MotionFile, PolicyRuntime
from ksim.task.evaluation import summary_scalars
from ksim.task.ppo import PPOConfig, PPOTask
from ksim.viewer.sim import ViewerSim
from ksim.viewer_settings import command_ranges

XML = """
<mujoco>
  <option timestep="0.01" gravity="0 0 0"/>
  <worldbody>
    <body name="torso" pos="0 0 1">
      <freejoint name="root"/>
      <geom type="box" size="0.1 0.1 0.2" mass="5" contype="0" conaffinity="0"/>
      <body name="left_arm" pos="0 0.15 0.1">
        <joint name="left_shoulder" axis="0 1 0" range="-2 2"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03" mass="0.5" contype="0" conaffinity="0"/>
      </body>
      <body name="right_arm" pos="0 -0.15 0.1">
        <joint name="right_shoulder" axis="0 1 0" range="-2 2"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03" mass="0.5" contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <position joint="left_shoulder" kp="50" kv="2"/>
    <position joint="right_shoulder" kp="50" kv="2"/>
  </actuator>
</mujoco>
"""
CTRL_DT = 0.02
FRAMES = {"swing": 11, "raise": 21}  # at 50 fps: 10 and 20 start frames
BODIES = ("torso", "left_arm", "right_arm")


def write_clip(path: Path, frames: int, amplitude: float) -> Path:
    """The torso still at 1 m, the arms swinging in opposite directions; CSV at 50 fps."""
    t = np.arange(frames) * CTRL_DT
    angle = amplitude * np.sin(2 * np.pi * t)
    rows = np.column_stack([0 * t, 0 * t, 1 + 0 * t, 1 + 0 * t, 0 * t, 0 * t, 0 * t, angle, -angle])
    np.savetxt(path, rows, delimiter=",")
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("clips")
    return [write_clip(folder / f"{name}.csv", n, 0.5 + i) for i, (name, n) in enumerate(FRAMES.items())]


def load(clips: Sequence[Path], **settings: object) -> trk.MotionCommand:
    model = mujoco.MjModel.from_xml_string(XML)
    return trk.MotionCommand.load(clips, model, CTRL_DT, BODIES, "torso", 0.1, 1 / CTRL_DT, **settings)  # type: ignore[arg-type]


@dataclasses.dataclass
class ArmsConfig(PPOConfig):
    clips: list[str] = dataclasses.field(default_factory=list)


class ArmsTask(PPOTask[ArmsConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(XML)

    @property
    def motion(self) -> trk.MotionCommand:
        clips, model = self.config.clips, self.engine.mj_model
        return trk.MotionCommand.load(clips, model, CTRL_DT, BODIES, "torso", bin_s=0.1, input_fps=1 / CTRL_DT)

    def get_command(self) -> Command | None:
        return self.motion

    def get_observations(self) -> Sequence[obs.Observation]:
        motion = self.motion
        return [trk.ReferenceJoints(motion), trk.ReferenceAnchorOrientation(motion), obs.JointPosition()]

    def get_critic_observations(self) -> Sequence[obs.Observation]:
        return [*self.get_observations(), trk.ReferenceAnchorPosition(self.motion), trk.TrackedBodyPoses(self.motion)]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [trk.BodyPositionTracking(scale=1.0, motion=self.motion)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [trk.AnchorHeightDeviation(self.motion), trk.BodyHeightDeviation(self.motion, bodies=("left_arm",))]

    def get_resets(self) -> Sequence[Reset]:
        return []

    def get_actuators(self) -> Actuators:
        return PositionServoActuators.from_model(self.engine.mj_model, action_scale=0.0)  # holds the default pose


@pytest.fixture(scope="module")
def task(clips: list[Path]) -> ArmsTask:
    config = ArmsConfig(
        clips=[str(c) for c in clips],
        num_envs=4,
        batch_size=4,
        rollout_length_frames=4,
        num_passes=1,
        actor_hidden=[8],
        critic_hidden=[8],
        ctrl_dt=CTRL_DT,
        dt=0.01,
        episode_length_s=2.0,
        eval_episodes=8,
        num_steps=1,
        save_every_n_steps=0,
    )
    return ArmsTask(config)


def test_frames_are_packed_with_start_bins_per_clip(clips: list[Path]) -> None:
    table = load(clips).table
    assert table.values.shape[0] == 32 and list(table.clip_first) == [0, 11]
    assert list(table.last[[0, 10, 11, 31]]) == [10, 10, 31, 31]
    # 5-frame bins; a clip's last frame starts nothing: swing 0..9, raise 11..30.
    assert list(table.bin_first) == [0, 5, 11, 16, 21, 26] and list(table.bin_stop) == [5, 10, 16, 21, 26, 31]
    assert list(table.bin_after) == [1, -1, 3, 4, 5, -1]


def test_starts_follow_failures_with_a_uniform_share(clips: list[Path]) -> None:
    motion = load(clips, uniform_share=0.1, lookback=0.5)
    np.testing.assert_allclose(motion.start_probabilities(jnp.zeros(6)), np.full(6, 1 / 6), rtol=1e-6)
    failures = jnp.zeros(6).at[1].set(3.0)  # episodes fail late in the first clip
    expected = 0.1 / 6 + 0.9 * np.array([0.5, 1.0, 0, 0, 0, 0]) / 1.5  # the bin before it shares the blame
    np.testing.assert_allclose(motion.start_probabilities(failures), expected, rtol=1e-6)
    starts = jax.vmap(lambda key: motion.start(key, CTRL_DT, failures, False)[1])(
        jax.random.split(jax.random.PRNGKey(0), 4000)
    )
    late_in_swing = np.mean((np.asarray(starts) >= 5) & (np.asarray(starts) < 10))
    assert abs(late_in_swing - expected[1]) < 0.03


def test_failures_are_counted_in_the_bin_where_an_episode_fails_and_fade(clips: list[Path]) -> None:
    motion = load(clips, failure_memory_s=1.0)
    failures = motion.record_failures(jnp.ones(6), jnp.asarray(17), jnp.asarray(True), CTRL_DT)
    np.testing.assert_allclose(failures, 0.98 + np.eye(6)[3], rtol=1e-6)  # frame 17 is in bin 3
    unchanged = motion.record_failures(jnp.ones(6), jnp.asarray(17), jnp.asarray(False), CTRL_DT)
    np.testing.assert_allclose(unchanged, np.full(6, 0.98), rtol=1e-6)


def test_an_episode_plays_its_clip_one_frame_per_step_and_ends_at_its_last(task: ArmsTask) -> None:
    environment, motion = task.environment, task.motion
    shared = task.init_train_state().shared
    starts = jax.vmap(lambda key: environment.start_episode(key, from_beginning=True))(
        jax.random.split(jax.random.PRNGKey(3), 8)
    )
    assert set(np.asarray(starts.command_state).tolist()) <= {0, 11}
    episode = jax.tree.map(lambda leaf: leaf[0], starts)
    first = int(episode.command_state)
    np.testing.assert_allclose(episode.data.qpos, motion.table.qpos[first], atol=1e-6)  # placed at its frame
    step = jax.jit(environment.step_env)
    length = FRAMES["swing" if first == 0 else "raise"] - 1
    for t in range(length):
        np.testing.assert_allclose(episode.command, motion.table.values[first + t + 1], atol=1e-6)
        episode, transition = step(shared, episode)
        assert int(episode.command_state) == first + t + 1
        assert bool(transition.trajectory.truncated) == (t == length - 1)
        assert not bool(transition.trajectory.terminated)


@dataclasses.dataclass(frozen=True)
class SwingPeak(term.Termination):
    """Ends an episode where the reference's left arm slows near 0.45-0.5 rad: the swing clip's peak (its frames 9
    and 10; the raise clip passes there fast)."""

    motion: trk.MotionCommand

    def terminated(self, ctx: StepContext) -> jax.Array:
        reference = self.motion.reference(ctx.command)
        angle, speed = reference.joint_pos[0], jnp.abs(reference.joint_vel[0])
        return (angle > 0.45) & (angle < 0.5) & (speed < 3.0)


class FailingArmsTask(ArmsTask):
    def get_terminations(self) -> Sequence[term.Termination]:
        return [SwingPeak(self.motion)]


def test_envs_count_their_failures_and_start_more_episodes_before_them(task: ArmsTask) -> None:
    failing = FailingArmsTask(dataclasses.replace(task.config, num_envs=16))
    pool, shared = failing.env_pool, failing.init_train_state().shared
    env = pool.reset(jax.random.split(jax.random.PRNGKey(0), 16), jnp.asarray(0))
    env, trajectory, _ = jax.jit(lambda env: pool.rollout(shared, env, 200))(env)
    failures = np.asarray(env.start_failures).sum(axis=0)
    assert int(np.asarray(trajectory.terminated).sum()) > 0
    assert failures[1] > 0 and np.all(np.delete(failures, 1) == 0)  # every failure in the swing's second bin
    starts = jax.vmap(lambda key: failing.motion.start(key, CTRL_DT, jnp.asarray(failures), False)[1])(
        jax.random.split(jax.random.PRNGKey(1), 2000)
    )
    in_swing = np.asarray(starts) < 10
    assert in_swing.mean() > 0.85  # 0.9 of the starts go to the failing bin and the one before it, 0.1 spread


def on_reference(
    task: ArmsTask, frame: int, shift: np.ndarray, yaw: float, push: tuple[float, float, float] = (0.0, 0.0, 0.0)
) -> StepContext:
    """A context whose robot is the reference's pose at `frame` + 1, moved by `shift`, turned by `yaw` and its root
    moving at the reference's velocity + `push` (world, m/s)."""
    motion, engine = task.motion, task.environment.engine
    qpos = np.array(motion.table.qpos[frame + 1])
    qpos[:3] += shift
    qpos[3:7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
    qvel = np.array(motion.table.qvel[frame + 1])
    qvel[:3] += np.asarray(push)
    data = engine.make_data(jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))
    action = jnp.zeros(engine.action_dim)
    return engine.context(data, data, action, action, data.ctrl, motion.value_at(jnp.asarray(frame)))


def test_rewards_are_one_on_the_reference_and_the_bodies_ignore_the_robots_drift(task: ArmsTask) -> None:
    motion = task.motion
    exact = on_reference(task, 4, np.zeros(3), 0.0)
    for reward in (
        trk.AnchorPositionTracking(scale=1.0, motion=motion),
        trk.AnchorHorizontalVelocityTracking(scale=1.0, motion=motion),
        trk.AnchorOrientationTracking(scale=1.0, motion=motion),
        trk.BodyPositionTracking(scale=1.0, motion=motion),
        trk.BodyOrientationTracking(scale=1.0, motion=motion),
        trk.BodyLinearVelocityTracking(scale=1.0, motion=motion),
        trk.BodyAngularVelocityTracking(scale=1.0, motion=motion),
    ):
        assert float(reward.value(exact)) == pytest.approx(1.0, abs=1e-3), reward.name
    np.testing.assert_allclose(list(motion.measures(exact).values()), 0.0, atol=1e-4)
    drifted = on_reference(task, 4, np.array([0.3, -0.2, 0.0]), 0.7)
    assert float(trk.BodyPositionTracking(scale=1.0, motion=motion).value(drifted)) == pytest.approx(1.0, abs=1e-3)
    assert float(trk.BodyOrientationTracking(scale=1.0, motion=motion).value(drifted)) == pytest.approx(1.0, abs=1e-3)
    assert float(trk.AnchorPositionTracking(scale=1.0, motion=motion).value(drifted)) == pytest.approx(
        np.exp(-0.13 / 0.09), rel=1e-3
    )
    # Drifting back at 0.1 m/s (and sinking at 0.2, which it ignores): the horizontal velocity kernel's std is 0.25.
    drifting = on_reference(task, 4, np.zeros(3), 0.0, push=(-0.1, 0.0, -0.2))
    assert float(trk.AnchorHorizontalVelocityTracking(scale=1.0, motion=motion).value(drifting)) == pytest.approx(
        np.exp(-0.01 / 0.0625), rel=1e-3
    )
    errors = motion.measures(drifted)
    assert float(errors["body_error_anchor"]) == pytest.approx(0.0, abs=1e-4)  # the pose itself is right
    assert float(errors["body_error_world"]) > 0.3
    sunk = on_reference(task, 4, np.array([0.0, 0.0, -0.3]), 0.0)
    assert bool(trk.AnchorHeightDeviation(motion, threshold=0.25).terminated(sunk))
    assert not bool(trk.AnchorHeightDeviation(motion, threshold=0.25).terminated(drifted))


def test_evaluation_starts_every_clip_at_its_first_frame_and_reports_it(task: ArmsTask) -> None:
    result = task.evaluate(task.init_train_state().shared)
    assert result.clip is not None and set(result.clip.tolist()) == {0, 1}
    np.testing.assert_array_equal(result.lengths, np.where(result.clip == 0, 10, 20))  # each clip's whole length
    scalars = summary_scalars(result)
    assert scalars["eval/success_rate"] == 1.0 and scalars["eval/raise/success_rate"] == 1.0
    assert scalars["eval/swing/episodes"] + scalars["eval/raise/episodes"] == len(result.clip)
    assert scalars["eval/swing/episodes"] == np.sum(result.clip == 0)
    # The policy holds the arms still (action_scale 0): the reference's swing is the error.
    assert 0.05 < scalars["eval/swing/joint_error"] < scalars["eval/raise/joint_error"]
    # Env 0's video shows the reference beside it: the clip's frames from its first, one per control step.
    qpos, reference = result.poses(task.environment.engine.mj_model.nq)
    first = int(task.motion.table.clip_first[result.clip[0]])
    assert reference is not None and len(reference) == len(qpos) == result.lengths[0]
    np.testing.assert_allclose(reference, task.motion.table.qpos[first : first + len(reference)], atol=1e-6)


def test_the_viewer_poses_the_reference_at_the_motions_frame(task: ArmsTask) -> None:
    sim = ViewerSim(task.environment, task.init_train_state().shared)
    report = sim.step()
    frame = int(sim.episode.command_state)
    assert report.reference_qpos is not None
    np.testing.assert_allclose(report.reference_qpos, task.motion.table.qpos[frame], atol=1e-6)
    assert command_ranges(task.motion) == ()  # a motion plays by itself: no sliders
    endings = [sim.step().ended_by for _ in range(max(FRAMES.values()))]
    assert "end of the command" in endings and "time limit" not in endings  # a clip's end, not the episode's


RENDER_BOTH = """
import sys, mujoco, numpy as np
from ksim.render import render_frames
model = mujoco.MjModel.from_xml_path(sys.argv[1])
poses = np.load(sys.argv[2])
moved = poses.copy()
moved[:, 0] += 0.4  # the reference beside the robot
frames = [render_frames(model, poses, 64, 48)[0], render_frames(model, poses, 64, 48, reference=moved)[0]]
np.save(sys.argv[3], np.stack(frames))
"""


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no EGL library for headless rendering")
def test_videos_draw_the_reference_as_a_green_copy(task: ArmsTask, tmp_path: Path) -> None:
    (tmp_path / "arms.xml").write_text(XML)
    np.save(tmp_path / "poses.npy", task.motion.table.qpos[:2])
    args = [str(tmp_path / name) for name in ("arms.xml", "poses.npy", "frames.npy")]
    env = {**os.environ, "MUJOCO_GL": "egl"}
    done = subprocess.run([sys.executable, "-c", RENDER_BOTH, *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plain, with_reference = np.load(tmp_path / "frames.npy")
    changed = np.any(plain != with_reference, axis=-1)
    assert changed.sum() > 20
    pixels = with_reference[changed].astype(float)
    assert pixels[:, 1].mean() > pixels[:, 0].mean()  # greener than it was


def test_what_cannot_apply_is_refused_in_one_line(clips: list[Path]) -> None:
    model = mujoco.MjModel.from_xml_string(XML)
    with pytest.raises(ConfigError, match="anchor='head' must be one of the tracked bodies"):
        trk.MotionCommand.load(clips, model, CTRL_DT, BODIES, "head", input_fps=50)
    with pytest.raises(ConfigError, match="no body 'tail'"):
        trk.MotionCommand.load(clips, model, CTRL_DT, (*BODIES, "tail"), "torso", input_fps=50)
    with pytest.raises(ConfigError, match=r"uniform_share=1.5 must be in"):
        load(clips, uniform_share=1.5)
    motion = load(clips)
    with pytest.raises(ConfigError, match=r"loaded for ctrl_dt=0.02; the task.s is 0.01"):
        motion.start(jax.random.PRNGKey(0), 0.01, jnp.zeros(6), False)
    with pytest.raises(ConfigError, match=r"BodyHeightDeviation.bodies must name tracked bodies"):
        trk.BodyHeightDeviation(motion, bodies=("pelvis",)).bind(None)  # type: ignore[arg-type]


def test_g1_tracking_runs_every_clip_on_two_devices_and_reports_each(tmp_path: Path) -> None:
    refused = run_example("examples.g1_tracking", "motion=run", devices=1)
    assert refused.returncode != 0
    assert "motion='run' must be one of walk, wave, high5, dance, jumpjack or 'all'" in refused.stderr
    assert "compiling" not in refused.stdout
    args = ("motion=all", "num_steps=2", "num_envs=8", "batch_size=4", "eval_every_n_steps=2", "eval_episodes=10")
    result = run_example("examples.g1_tracking", *args, f"run_dir={tmp_path}", devices=2)
    assert result.returncode == 0, result.stdout + result.stderr
    (evaluation,) = [line for line in result.stdout.splitlines() if line.startswith("eval step 2")]
    assert "eval/success_rate" in evaluation and "eval/body_error_anchor" in evaluation
    assert "eval/walk/success_rate" in evaluation and "eval/jumpjack/joint_error" in evaluation
    # Exported with its clips and run by the runtime in plain MuJoCo, judged per clip as mode=eval judges it.
    checkpoint, policy = tmp_path / "checkpoints" / "ckpt_latest.bin", tmp_path / "policy.onnx"
    export = ("mode=export", "motion=all", f"load_from_ckpt_path={checkpoint}", f"export_path={policy}")
    exported = run_example("examples.g1_tracking", *export, devices=1)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert f"and {tmp_path / 'policy.motion.npz'}" in exported.stdout and (tmp_path / "policy.motion.npz").exists()
    judged = run_example("ksim.sim2sim", str(policy), "--episodes", "5", "--checkpoint", str(checkpoint), devices=1)
    assert judged.returncode == 0, judged.stdout + judged.stderr
    lines = [line for line in judged.stdout.splitlines() if line.startswith(("sim2sim   ", "mode=eval "))]
    assert len(lines) == 2 and all("success_rate" in line and "walk/body_error_anchor" in line for line in lines)


def motion_runtime(motion: trk.MotionCommand) -> PolicyRuntime:
    """A runtime whose policy reads only the motion: its next joints and its anchor's orientation (no ONNX run)."""
    inputs = [
        PolicyInput("ReferenceJoints", 4, source=RUNTIME, transform=REFERENCE_JOINTS),
        PolicyInput("ReferenceAnchorOrientation", 6, "anchor", 4, transform=REFERENCE_ANCHOR_ORIENTATION),
    ]
    actuation = ActuationSpec("torque", ["a", "b"], ["left_shoulder", "right_shoulder"], 1.0, [1, 1], [-1, -1], [1, 1])
    spec = PolicySpec("arms", "", inputs, ["a", "b"], "motor", "", 1.0, CTRL_DT, {}, actuation=actuation)
    arrays = motion.robot_arrays()
    with io.BytesIO() as buffer:
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        buffer.seek(0)
        return PolicyRuntime(spec, None, MotionFile.load(buffer))  # type: ignore[arg-type]


def test_the_runtime_plays_a_clip_on_its_own_clock_turned_to_the_robots_heading(clips: list[Path]) -> None:
    motion = load(clips)
    runtime = motion_runtime(motion)
    runtime.reset(clip="raise")
    assert runtime.motion_frame == 12  # the robot is at the clip's first frame (11): it is shown the next
    joints = motion.table.values[12, :4]
    level = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    np.testing.assert_allclose(runtime.observation({"anchor": level})[:4], joints, atol=1e-6)
    # A robot whose IMU reads another heading sees the motion turned to it: the same as a robot that agrees.
    turned = np.array([np.cos(0.6), 0.0, 0.0, np.sin(0.6)], np.float32)
    agreeing = runtime.observation({"anchor": level})
    runtime.reset(clip="raise")
    np.testing.assert_allclose(runtime.observation({"anchor": turned}), agreeing, atol=1e-6)
    runtime.reset(clip="raise", heading=0.0)  # unless told the frames agree: then the turn is an error
    assert np.abs(runtime.observation({"anchor": turned})[4:] - agreeing[4:]).max() > 0.5
    with pytest.raises(ConfigError, match=r"clip='jump' must be one of the motion's clips: swing, raise"):
        runtime.reset(clip="jump")
    with pytest.raises(ConfigError, match=r"frame=10 must be a frame of the motion before its clip's last"):
        runtime.reset(frame=10)
