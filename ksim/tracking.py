"""Motion tracking: a command that plays reference motions one frame per control step, and the observations,
rewards, terminations and measures that compare the robot with it.

The recipe follows BeyondMimic (Liao et al., 2025, "BeyondMimic: From Motion Tracking to Versatile Humanoid Control
via Guided Diffusion"): episodes start at a random frame of a clip, more often just before where episodes fail
(adaptive sampling), from the reference's own pose and velocities; the rewards are exponential kernels of the
anchor body's world pose error and of the tracked bodies' pose and velocity errors, the bodies' reference moved
under the robot's anchor (its horizontal position and heading: the robot is not asked to undo its drift); an
episode ends when the anchor or an end effector leaves the reference's height by more than a threshold, or the
anchor tilts away from it, and is truncated at the clip's end.

`MotionCommand.load` builds the command from clips (ksim.motion); every component here takes that command, so a
task names its bodies once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Self

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.commands import Command
from ksim.config import ConfigError
from ksim.engine import (
    ModelLayout,
    StepContext,
    quat_angle,
    quat_conjugate,
    quat_multiply,
    rotate,
    rotate_inverse,
    rotation_6d,
    yaw_quat,
)
from ksim.motion import DEFAULT_INPUT_FPS, Motion, load_motion, robot_joints
from ksim.observations import Observation, RobotContext, simulator_only
from ksim.policy_spec import (
    REFERENCE_ANCHOR_ORIENTATION,
    REFERENCE_JOINTS,
    ROBOT,
    RUNTIME,
    SENSOR_PREFIX,
    PolicyInput,
)
from ksim.rewards import Reward
from ksim.terminations import Termination

Array = jax.Array
GRAVITY = np.array([0.0, 0.0, -1.0])


class Reference(NamedTuple):
    """The reference at one frame: the joints' angles and velocities (J,) and the tracked bodies' world positions
    (K, 3), orientations (K, 4; w, x, y, z), linear and angular velocities (K, 3)."""

    joint_pos: Array
    joint_vel: Array
    body_pos: Array
    body_quat: Array
    body_lin_vel: Array
    body_ang_vel: Array


class MotionTable(NamedTuple):
    """Every frame of every clip, one after the other (F frames): what the command gathers from on the device."""

    values: np.ndarray  # (F, size): the command's value at each frame (a flattened `Reference`)
    qpos: np.ndarray  # (F, nq): the model's pose at each frame (an episode starting there)
    qvel: np.ndarray  # (F, nv)
    last: np.ndarray  # (F,): the last frame of each frame's clip
    clip_first: np.ndarray  # (C,): each clip's first frame
    frame_bin: np.ndarray  # (F,): each frame's start bin
    bin_first: np.ndarray  # (B,): each bin's first frame
    bin_stop: np.ndarray  # (B,): one past each bin's last start frame (a clip's last frame starts nothing)
    bin_after: np.ndarray  # (B,): the next bin of the same clip (-1: the clip's last bin)


@dataclass(frozen=True, eq=False)
class MotionCommand(Command):
    """Reference motions played one frame per control step. The state is the frame the robot is at (an index into
    all clips' frames); the value is the reference at the next frame, where the robot should be when the control
    step ends. Starts are drawn per bin of `bin_s` seconds: a share `uniform_share` uniformly, the rest in
    proportion to the shard's failures over the last `failure_memory_s` seconds in that bin plus `lookback` times
    those in the bin after it (a fall is often caused a little earlier)."""

    clip_names: tuple[str, ...]
    fps: float
    body_names: tuple[str, ...]  # the tracked bodies
    body_ids: tuple[int, ...]  # their model body ids
    anchor: int  # the anchor's index in body_names
    num_joints: int
    table: MotionTable = field(repr=False)
    uniform_share: float = 0.1
    failure_memory_s: float = 20.0
    lookback: float = 0.8

    @classmethod
    def load(
        cls,
        clips: Sequence[str | Path],
        mj_model: mujoco.MjModel,
        ctrl_dt: float,
        bodies: Sequence[str],
        anchor: str,
        bin_s: float = 1.0,
        input_fps: float = DEFAULT_INPUT_FPS,
        **settings: float,
    ) -> MotionCommand:
        """The clips (ksim.motion's layouts; a CSV's frames at `input_fps`) resampled to the control rate and placed
        on `mj_model`; `bodies` are tracked, `anchor` (one of them) is the body whose world pose the others are
        measured from."""
        if not clips:
            raise ConfigError("MotionCommand needs at least one clip")
        if anchor not in bodies:
            raise ConfigError(f"MotionCommand: anchor={anchor!r} must be one of the tracked bodies")
        if bin_s <= 0:
            raise ConfigError(f"MotionCommand: bin_s={bin_s} must be positive")
        model_bodies = [mj_model.body(b).name for b in range(mj_model.nbody)]
        unknown = [name for name in bodies if name not in model_bodies]
        if unknown:
            raise ConfigError(f"MotionCommand: the model has no body {', '.join(map(repr, unknown))}")
        motions = [load_motion(path, mj_model, 1.0 / ctrl_dt, input_fps=input_fps) for path in clips]
        body_ids = tuple(model_bodies.index(name) for name in bodies)
        table = motion_table(motions, [b - 1 for b in body_ids], round(bin_s / ctrl_dt), mj_model)
        command = cls(
            clip_names=tuple(Path(path).stem for path in clips),
            fps=1.0 / ctrl_dt,
            body_names=tuple(bodies),
            body_ids=body_ids,
            anchor=list(bodies).index(anchor),
            num_joints=len(robot_joints(mj_model)),
            table=table,
            **settings,
        )
        command.check_settings()
        return command

    def check_settings(self) -> None:
        if not 0.0 <= self.uniform_share <= 1.0:
            raise ConfigError(f"MotionCommand.uniform_share={self.uniform_share} must be in [0, 1]")
        if self.failure_memory_s <= 0:
            raise ConfigError(f"MotionCommand.failure_memory_s={self.failure_memory_s} must be positive")
        if self.lookback < 0:
            raise ConfigError(f"MotionCommand.lookback={self.lookback} must be >= 0")

    @property
    def size(self) -> int:
        return int(self.table.values.shape[1])

    @property
    def start_bins(self) -> int:
        return int(self.table.bin_first.shape[0])

    @property
    def num_clips(self) -> int:
        return len(self.clip_names)

    def bind(self, layout: ModelLayout) -> Self:
        layout.require_moving_base(self.name)
        for name, body in zip(self.body_names, self.body_ids, strict=True):
            if body >= len(layout.body_names) or layout.body_names[body] != name:
                raise ConfigError(f"MotionCommand: body {name!r} is not the task model's body {body}")
        if len(layout.robot_joints) != self.num_joints:
            raise ConfigError(
                f"MotionCommand: the clips move {self.num_joints} joints, the task's model has "
                f"{len(layout.robot_joints)}"
            )
        return self

    # ----- the command -------------------------------------------------------------------------------------------

    def value_at(self, frame: Array) -> Array:
        """The command's value while the robot is at `frame`: the reference at the frame after it."""
        target = jnp.minimum(frame + 1, jnp.asarray(self.table.last)[frame])
        return jnp.asarray(self.table.values, jnp.float32)[target]

    def start_probabilities(self, failures: Array) -> Array:
        """Where episodes start, per bin: `uniform_share` spread evenly, the rest after recent failures."""
        after = jnp.asarray(self.table.bin_after)
        later = jnp.where(after >= 0, failures[jnp.maximum(after, 0)], 0.0)
        weights = failures + self.lookback * later
        total = jnp.sum(weights)
        uniform = jnp.full(self.start_bins, 1.0 / self.start_bins)
        adaptive = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), uniform)
        return self.uniform_share * uniform + (1.0 - self.uniform_share) * adaptive

    def start(self, rng: Array, ctrl_dt: float, failures: Array, from_beginning: bool) -> tuple[Array, Array]:
        if abs(self.fps * ctrl_dt - 1.0) > 1e-6:
            raise ConfigError(f"MotionCommand was loaded for ctrl_dt={1.0 / self.fps:g}; the task's is {ctrl_dt:g}")
        bin_key, frame_key = jax.random.split(rng)
        if from_beginning:
            clip = jax.random.randint(bin_key, (), 0, self.num_clips)
            frame = jnp.asarray(self.table.clip_first, jnp.int32)[clip]
        else:
            chosen = jax.random.choice(bin_key, self.start_bins, p=self.start_probabilities(failures))
            first, stop = jnp.asarray(self.table.bin_first)[chosen], jnp.asarray(self.table.bin_stop)[chosen]
            frame = jax.random.randint(frame_key, (), first, stop).astype(jnp.int32)
        return self.value_at(frame), frame

    def advance(self, value: Array, state: Array, rng: Array, ctrl_dt: float) -> tuple[Array, Array]:
        frame = jnp.minimum(state + 1, jnp.asarray(self.table.last)[state])
        return self.value_at(frame), frame

    def ended(self, state: Array) -> Array:
        return state >= jnp.asarray(self.table.last)[state]

    def start_pose(self, state: Array, qpos: Array, qvel: Array) -> tuple[Array, Array]:
        return jnp.asarray(self.table.qpos, jnp.float32)[state], jnp.asarray(self.table.qvel, jnp.float32)[state]

    def reference_qpos(self, state: Array) -> Array:
        return jnp.asarray(self.table.qpos, jnp.float32)[state]

    def record_failures(self, failures: Array, state: Array, terminated: Array, ctrl_dt: float) -> Array:
        hit = jax.nn.one_hot(jnp.asarray(self.table.frame_bin)[state], self.start_bins) * terminated
        return failures * (1.0 - ctrl_dt / self.failure_memory_s) + hit

    def robot_arrays(self) -> dict[str, np.ndarray]:
        """What a robot's runtime plays the motion from (ksim.runtime; numpy only): per frame the joints' angles and
        velocities and the anchor's world orientation, each clip's first frame and name, each frame's clip's last."""
        joints, bodies, values = self.num_joints, len(self.body_ids), self.table.values
        quat = 2 * joints + 3 * bodies + 4 * self.anchor
        return {
            "fps": np.asarray(self.fps),
            "joint_pos": values[:, :joints],
            "joint_vel": values[:, joints : 2 * joints],
            "anchor_quat": values[:, quat : quat + 4],
            "clip_first": self.table.clip_first,
            "clip_names": np.asarray(self.clip_names),
            "last": self.table.last,
        }

    def clip_of(self, frame: Array) -> Array:
        """The clip that `frame` belongs to."""
        return jnp.sum(frame >= jnp.asarray(self.table.clip_first)) - 1

    # ----- reading it --------------------------------------------------------------------------------------------

    def reference(self, value: Array) -> Reference:
        """The command's value, unpacked."""
        joints, bodies = self.num_joints, len(self.body_ids)
        sizes = [joints, joints, 3 * bodies, 4 * bodies, 3 * bodies, 3 * bodies]
        parts = jnp.split(value, np.cumsum(sizes)[:-1])
        return Reference(
            parts[0],
            parts[1],
            parts[2].reshape(bodies, 3),
            parts[3].reshape(bodies, 4),
            parts[4].reshape(bodies, 3),
            parts[5].reshape(bodies, 3),
        )

    def robot(self, ctx: StepContext) -> Reference:
        """The robot's own joints and tracked bodies, in the reference's layout."""
        ids = np.asarray(self.body_ids)
        data = ctx.data
        angular, linear_at_com = data.cvel[ids, :3], data.cvel[ids, 3:]
        offset = data.xpos[ids] - data.subtree_com[np.asarray(ctx.layout.body_rootid)[ids]]
        return Reference(
            ctx.joint_pos,
            ctx.joint_vel,
            data.xpos[ids],
            data.xquat[ids],
            linear_at_com - jnp.cross(offset, angular),
            angular,
        )

    def aligned(self, reference: Reference, robot: Reference) -> tuple[Array, Array]:
        """The reference bodies' world (positions, orientations) moved under the robot's anchor: its horizontal
        position and heading, the reference's height."""
        a = self.anchor
        turn = yaw_quat(quat_multiply(robot.body_quat[a], quat_conjugate(reference.body_quat[a])))
        origin = jnp.concatenate([robot.body_pos[a, :2], reference.body_pos[a, 2:]])
        offsets = reference.body_pos - reference.body_pos[a]
        positions = origin + jax.vmap(rotate, in_axes=(None, 0))(turn, offsets)
        return positions, quat_multiply(turn, reference.body_quat)

    def in_anchor_frame(self, poses: Reference) -> Array:
        """The tracked bodies' positions in their anchor's frame (K, 3)."""
        a = self.anchor
        return jax.vmap(rotate_inverse, in_axes=(None, 0))(poses.body_quat[a], poses.body_pos - poses.body_pos[a])

    def measures(self, ctx: StepContext) -> dict[str, Array]:
        """Per control step: the mean body position error (m) in the anchor's frame and in the world, the mean
        joint angle error (rad)."""
        reference, robot = self.reference(ctx.command), self.robot(ctx)
        local = self.in_anchor_frame(robot) - self.in_anchor_frame(reference)
        return {
            "body_error_anchor": jnp.mean(jnp.linalg.norm(local, axis=-1)),
            "body_error_world": jnp.mean(jnp.linalg.norm(robot.body_pos - reference.body_pos, axis=-1)),
            "joint_error": jnp.mean(jnp.abs(robot.joint_pos - reference.joint_pos)),
        }


def motion_table(
    motions: Sequence[Motion], body_index: Sequence[int], bin_frames: int, mj_model: mujoco.MjModel
) -> MotionTable:
    """The clips' frames one after the other, packed as the command reads them; bins of `bin_frames` frames."""
    values: list[np.ndarray] = []
    qpos: list[np.ndarray] = []
    qvel: list[np.ndarray] = []
    last: list[np.ndarray] = []
    frame_bin: list[np.ndarray] = []
    clip_first: list[int] = []
    bin_first: list[int] = []
    bin_stop: list[int] = []
    bin_after: list[int] = []
    offset = 0
    for motion in motions:
        frames = motion.num_frames
        bodies = np.asarray(body_index)
        values.append(
            np.concatenate(
                [
                    motion.joint_pos,
                    motion.joint_vel,
                    motion.body_pos[:, bodies].reshape(frames, -1),
                    motion.body_quat[:, bodies].reshape(frames, -1),
                    motion.body_lin_vel[:, bodies].reshape(frames, -1),
                    motion.body_ang_vel[:, bodies].reshape(frames, -1),
                ],
                axis=1,
            )
        )
        qpos.append(np.stack([motion.qpos(frame) for frame in range(frames)]))
        qvel.append(start_velocities(motion))
        last.append(np.full(frames, offset + frames - 1))
        clip_first.append(offset)
        starts = frames - 1  # the last frame starts nothing: the episode would end at once
        count = max(1, int(np.ceil(starts / bin_frames)))
        first_bin = len(bin_first)
        for b in range(count):
            bin_first.append(offset + b * bin_frames)
            bin_stop.append(offset + min((b + 1) * bin_frames, starts))
            bin_after.append(first_bin + b + 1 if b + 1 < count else -1)
        frame_bin.append(first_bin + np.minimum(np.arange(frames) // bin_frames, count - 1))
        offset += frames
    if any(q.shape[1] != mj_model.nq for q in qpos):
        raise ConfigError("MotionCommand: a clip's pose does not fit the model's qpos")
    return MotionTable(
        values=np.concatenate(values).astype(np.float32),
        qpos=np.concatenate(qpos),
        qvel=np.concatenate(qvel),
        last=np.concatenate(last).astype(np.int32),
        clip_first=np.asarray(clip_first, np.int32),
        frame_bin=np.concatenate(frame_bin).astype(np.int32),
        bin_first=np.asarray(bin_first, np.int32),
        bin_stop=np.asarray(bin_stop, np.int32),
        bin_after=np.asarray(bin_after, np.int32),
    )


def start_velocities(motion: Motion) -> np.ndarray:
    """qvel at each frame: the root's world linear velocity, its angular velocity in its own frame (a free joint's
    convention), the joints' velocities."""
    root_quat, root_ang_vel = jnp.asarray(motion.body_quat[:, 0]), jnp.asarray(motion.body_ang_vel[:, 0])
    local = np.asarray(jax.vmap(rotate_inverse)(root_quat, root_ang_vel))
    return np.concatenate([motion.body_lin_vel[:, 0], local, motion.joint_vel], axis=1)


# ----- observations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tracking:
    """A component that reads the motion command."""

    motion: MotionCommand

    @property
    def command_size(self) -> int:
        return self.motion.size

    def poses(self, ctx: StepContext) -> tuple[Reference, Reference]:
        """(the reference, the robot) at the end of the control step."""
        return self.motion.reference(ctx.command), self.motion.robot(ctx)


@dataclass(frozen=True)
class ReferenceJoints(_Tracking, Observation):
    """The reference's joint angles and velocities (what the robot should reach by the end of the next step)."""

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, source=RUNTIME, transform=REFERENCE_JOINTS)

    def observe(self, ctx: StepContext) -> Array:
        reference = self.motion.reference(ctx.command)
        return jnp.concatenate([reference.joint_pos, reference.joint_vel])


@dataclass(frozen=True)
class ReferenceAnchorOrientation(_Tracking, Observation):
    """The reference anchor's orientation in the robot anchor's frame (6 values: two columns of its rotation). The
    robot's anchor orientation is `sensor`'s (a framequat on the anchor: what the robot's IMU there measures), or
    without one the anchor body's own (a simulator's)."""

    sensor: str = ""

    def bind(self, layout: ModelLayout) -> Self:
        if self.sensor:
            _, size = layout.sensor(self.sensor, f"{self.name}.sensor")
            if size != 4:
                raise ConfigError(f"{self.name}.sensor={self.sensor!r} has {size} values; an orientation has 4")
        return self

    def observe(self, ctx: StepContext) -> Array:
        reference = self.motion.reference(ctx.command)
        a = self.motion.anchor
        own = ctx.sensor(self.sensor) if self.sensor else self.motion.robot(ctx).body_quat[a]
        return rotation_6d(quat_multiply(quat_conjugate(own), reference.body_quat[a]))

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        if not self.sensor:
            return simulator_only(self, size, robot)
        reading = SENSOR_PREFIX + self.sensor
        return PolicyInput(self.name, size, reading, 4, ROBOT, REFERENCE_ANCHOR_ORIENTATION)


@dataclass(frozen=True)
class ReferenceAnchorPosition(_Tracking, Observation):
    """The reference anchor's position in the robot anchor's frame (m); a robot without odometry lacks it."""

    robot_input = simulator_only

    def observe(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        return rotate_inverse(robot.body_quat[a], reference.body_pos[a] - robot.body_pos[a])


@dataclass(frozen=True)
class TrackedBodyPoses(_Tracking, Observation):
    """The robot's tracked bodies in its anchor's frame: positions (K x 3) and orientations (K x 6)."""

    robot_input = simulator_only

    def observe(self, ctx: StepContext) -> Array:
        robot = self.motion.robot(ctx)
        a = self.motion.anchor
        turn = quat_multiply(quat_conjugate(robot.body_quat[a])[None], robot.body_quat)
        return jnp.concatenate([jnp.ravel(self.motion.in_anchor_frame(robot)), jnp.ravel(jax.vmap(rotation_6d)(turn))])


# ----- rewards: exp(-error^2 / std^2), each in [0, 1] ------------------------------------------------------------


def kernel(squared_error: Array, std: float) -> Array:
    return jnp.exp(-squared_error / std**2)


@dataclass(frozen=True)
class AnchorPositionTracking(_Tracking, Reward):
    """The anchor's world position against the reference's."""

    std: float = 0.3

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        return kernel(jnp.sum(jnp.square(reference.body_pos[a] - robot.body_pos[a])), self.std)


@dataclass(frozen=True)
class AnchorHorizontalVelocityTracking(_Tracking, Reward):
    """The anchor's horizontal world velocity against the reference's: a slow drift, which the position kernels
    barely price over a short episode, costs from its first step."""

    std: float = 0.25

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        return kernel(jnp.sum(jnp.square(reference.body_lin_vel[a, :2] - robot.body_lin_vel[a, :2])), self.std)


@dataclass(frozen=True)
class AnchorOrientationTracking(_Tracking, Reward):
    """The anchor's world orientation against the reference's (the angle between them)."""

    std: float = 0.4

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        return kernel(jnp.square(quat_angle(reference.body_quat[a], robot.body_quat[a])), self.std)


@dataclass(frozen=True)
class BodyPositionTracking(_Tracking, Reward):
    """The tracked bodies' positions against the reference moved under the robot's anchor (mean over bodies)."""

    std: float = 0.3

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        positions, _ = self.motion.aligned(reference, robot)
        return kernel(jnp.mean(jnp.sum(jnp.square(positions - robot.body_pos), axis=-1)), self.std)


@dataclass(frozen=True)
class BodyOrientationTracking(_Tracking, Reward):
    """The tracked bodies' orientations against the reference turned to the robot's heading (mean over bodies)."""

    std: float = 0.4

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        _, orientations = self.motion.aligned(reference, robot)
        return kernel(jnp.mean(jnp.square(quat_angle(orientations, robot.body_quat))), self.std)


@dataclass(frozen=True)
class BodyLinearVelocityTracking(_Tracking, Reward):
    """The tracked bodies' world linear velocities against the reference's (mean over bodies)."""

    std: float = 1.0

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        return kernel(jnp.mean(jnp.sum(jnp.square(reference.body_lin_vel - robot.body_lin_vel), axis=-1)), self.std)


@dataclass(frozen=True)
class BodyAngularVelocityTracking(_Tracking, Reward):
    """The tracked bodies' world angular velocities against the reference's (mean over bodies)."""

    std: float = 3.14

    def value(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        return kernel(jnp.mean(jnp.sum(jnp.square(reference.body_ang_vel - robot.body_ang_vel), axis=-1)), self.std)


# ----- terminations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnchorHeightDeviation(_Tracking, Termination):
    """The anchor's height is more than `threshold` (m) from the reference's."""

    threshold: float = 0.25

    def terminated(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        return jnp.abs(reference.body_pos[a, 2] - robot.body_pos[a, 2]) > self.threshold


@dataclass(frozen=True)
class AnchorTiltDeviation(_Tracking, Termination):
    """The anchor's tilt leaves the reference's: the gravity direction's z in the anchor's frame differs by more
    than `threshold` (0 upright, 1 lying down)."""

    threshold: float = 0.8

    def terminated(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        a = self.motion.anchor
        down = jnp.asarray(GRAVITY, jnp.float32)
        tilt = rotate_inverse(reference.body_quat[a], down)[2] - rotate_inverse(robot.body_quat[a], down)[2]
        return jnp.abs(tilt) > self.threshold


@dataclass(frozen=True)
class BodyHeightDeviation(_Tracking, Termination):
    """One of `bodies` (tracked ones: the end effectors) is more than `threshold` (m) from the height of the
    reference moved under the robot's anchor."""

    bodies: tuple[str, ...] = ()
    threshold: float = 0.25

    def bind(self, layout: ModelLayout) -> Self:
        unknown = [name for name in self.bodies if name not in self.motion.body_names]
        if not self.bodies or unknown:
            raise ConfigError(
                f"BodyHeightDeviation.bodies must name tracked bodies ({', '.join(self.motion.body_names)})"
            )
        return self

    def terminated(self, ctx: StepContext) -> Array:
        reference, robot = self.poses(ctx)
        positions, _ = self.motion.aligned(reference, robot)
        index = np.asarray([self.motion.body_names.index(name) for name in self.bodies])
        return jnp.any(jnp.abs(positions[index, 2] - robot.body_pos[index, 2]) > self.threshold)
