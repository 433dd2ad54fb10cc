"""Runs an exported policy the way a robot runs it: raw readings in, actuator targets out; numpy and onnxruntime only.

    runtime = PolicyRuntime.load("policy.onnx")      # reads policy.json beside it
    runtime.reset()                                  # at every episode's start (a motion: runtime.reset(clip="walk"))
    command = runtime.step({"joint_positions": q, "joint_velocities": qd, "base_orientation": quat, ...})
    command.targets, command.kp, command.kd          # or command.torque(q, qd)

Each control step builds the observation vector exactly as training did (ksim.policy_spec says, per input, which
reading feeds it and the offset, scale, clip or transform), feeds the policy its memory (past frames, recurrent
state) and keeps it, and turns the action into what the actuators take. `tests/test_runtime.py` drives the
training environment and this runtime through the same states and checks both agree to float32 precision.

A policy that tracks a motion plays it from `policy.motion.npz` beside it, one frame per control step from the frame
`reset` names, its clock its own; the reference is turned about the vertical to the robot's heading at the first
step (the robot's IMU knows no world heading), unless `reset(heading=0.0)` says the two frames already agree.

A reading that is missing or has the wrong size raises RuntimeInputError naming it; a NaN in a reading (or in
the policy's output) never reaches the robot: the runtime holds the previous targets (the default pose before
any; zero torque for torque control) and `ActuatorCommand.held` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ksim.errors import ConfigError
from ksim.motion import quat_conjugate, quat_multiply
from ksim.policy_spec import (
    AFFINE,
    GAIT_PHASE,
    LAST_ACTION,
    MOTION,
    PAST_OBSERVATIONS,
    PROJECTED_GRAVITY,
    RECURRENT_STATE,
    REFERENCE_ANCHOR_ORIENTATION,
    REFERENCE_JOINTS,
    ActuationSpec,
    PolicyInput,
    PolicySpec,
    load_policy_spec,
)

F32 = np.float32
DOWN = np.array([0.0, 0.0, -1.0], F32)


class RuntimeInputError(ConfigError):
    """A reading the policy needs is missing or has the wrong size; the message names it."""


def rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotates a world-frame vector into the frame of a (w, x, y, z) unit quaternion (as ksim.engine does)."""
    w, xyz = quat[0], quat[1:]
    t = F32(2.0) * np.cross(xyz, vec)
    return (vec - w * t + np.cross(xyz, t)).astype(F32)


def rotate(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotates a vector from the frame of a (w, x, y, z) unit quaternion into the world frame."""
    w, xyz = quat[0], quat[1:]
    t = F32(2.0) * np.cross(xyz, vec)
    return (vec + w * t + np.cross(xyz, t)).astype(F32)


def rotation_6d(quat: np.ndarray) -> np.ndarray:
    """The first two columns of a unit quaternion's rotation matrix (as ksim.engine.rotation_6d)."""
    return np.concatenate([rotate(quat, np.eye(3, dtype=F32)[0]), rotate(quat, np.eye(3, dtype=F32)[1])])


def heading_quat(quat: np.ndarray) -> np.ndarray:
    """The rotation about the vertical of a unit quaternion's heading (as ksim.engine.yaw_quat)."""
    w, x, y, z = quat
    yaw = np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)], F32)


@dataclass(frozen=True)
class MotionFile:
    """A motion exported beside its policy (ksim.tracking.MotionCommand.robot_arrays)."""

    joint_pos: np.ndarray  # (frames, joints)
    joint_vel: np.ndarray
    anchor_quat: np.ndarray  # (frames, 4): the anchor's world orientation (w, x, y, z)
    clip_first: np.ndarray  # each clip's first frame
    clip_names: tuple[str, ...]
    last: np.ndarray  # each frame's clip's last frame

    @classmethod
    def load(cls, path: Path | BinaryIO) -> MotionFile:
        with np.load(path) as data:
            arrays = {key: np.asarray(data[key]) for key in data.files}
        return cls(
            arrays["joint_pos"].astype(F32),
            arrays["joint_vel"].astype(F32),
            arrays["anchor_quat"].astype(F32),
            arrays["clip_first"].astype(np.int64),
            tuple(str(name) for name in arrays["clip_names"]),
            arrays["last"].astype(np.int64),
        )

    def start_frame(self, clip: int | str | None, frame: int | None) -> int:
        """The frame an episode starts at: `frame` itself, or `clip`'s first (by name or index; default the first
        clip's); ConfigError (one line) for one that is not there."""
        if frame is not None:
            if not 0 <= frame < len(self.last) or frame >= self.last[frame]:
                raise ConfigError(f"frame={frame} must be a frame of the motion before its clip's last")
            return int(frame)
        index = 0 if clip is None else clip
        if isinstance(index, str):
            if index not in self.clip_names:
                raise ConfigError(f"clip={index!r} must be one of the motion's clips: {', '.join(self.clip_names)}")
            index = self.clip_names.index(index)
        if not 0 <= index < len(self.clip_first):
            raise ConfigError(f"clip={index} must be in [0, {len(self.clip_first)})")
        return int(self.clip_first[index])


@dataclass(frozen=True)
class ActuatorArrays:
    """An `ActuationSpec`'s numbers as float32 arrays, built once per runtime."""

    kind: str
    action_scale: np.float32
    gear: np.ndarray
    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    default_position: np.ndarray | None
    kp: np.ndarray | None
    kd: np.ndarray | None
    torque_low: np.ndarray  # the PD torque's bounds ("pd", "servo"): see ActuatorCommand
    torque_high: np.ndarray

    @classmethod
    def of(cls, spec: ActuationSpec) -> ActuatorArrays:
        def floats(values: list[float] | None) -> np.ndarray | None:
            return None if values is None else np.asarray(values, F32)

        gear = np.asarray(spec.gear, F32)
        ctrl_low, ctrl_high = np.asarray(spec.ctrl_low, F32), np.asarray(spec.ctrl_high, F32)
        bounds = torque_bounds(spec, gear, ctrl_low, ctrl_high)
        return cls(
            spec.kind,
            F32(spec.action_scale),
            gear,
            ctrl_low,
            ctrl_high,
            floats(spec.default_position),
            floats(spec.kp),
            floats(spec.kd),
            np.minimum(*bounds),
            np.maximum(*bounds),
        )


def torque_bounds(
    spec: ActuationSpec, gear: np.ndarray, ctrl_low: np.ndarray, ctrl_high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """gear x the range that bounds the PD torque: the control range for "pd", the force range for "servo"
    (unbounded without one)."""
    if spec.kind != "servo":
        return gear * ctrl_low, gear * ctrl_high
    if spec.force_low is None or spec.force_high is None:
        return np.full_like(gear, -np.inf), np.full_like(gear, np.inf)
    return gear * np.asarray(spec.force_low, F32), gear * np.asarray(spec.force_high, F32)


@dataclass(frozen=True)
class ActuatorCommand:
    """What the actuators take for one control step.

    kind "pd" and "servo": `targets` (joint positions) with gains `kp`, `kd`; `torque(q, qd)` runs the PD law
    as training did, clipped to [torque_low, torque_high]: gear x the motors' control range for "pd", gear x the
    servos' force range for "servo" (unbounded where the model does not limit it). kind "torque": `torque()`,
    gear x the clipped, scaled action. `ctrl(q, qd)` is MuJoCo's control vector for the same, as the training
    environment computed it.
    """

    kind: str
    action: np.ndarray  # the policy's output (what LastAction shows it next step)
    targets: np.ndarray | None
    arrays: ActuatorArrays
    held: str = ""  # why these are the previous targets, not the policy's ("" when they are the policy's)

    @property
    def kp(self) -> np.ndarray | None:
        return self.arrays.kp

    @property
    def kd(self) -> np.ndarray | None:
        return self.arrays.kd

    @property
    def torque_low(self) -> np.ndarray:
        return self.arrays.torque_low

    @property
    def torque_high(self) -> np.ndarray:
        return self.arrays.torque_high

    def torque(self, q: np.ndarray | None = None, qd: np.ndarray | None = None) -> np.ndarray:
        """Joint torques (N m or N): the PD law at joint positions `q` and velocities `qd` ("pd", "servo"), or the
        policy's torques ("torque")."""
        if self.kind == "torque":
            return (self.arrays.gear * self.ctrl()).astype(F32)
        return np.clip(self._pd_law(q, qd), self.torque_low, self.torque_high).astype(F32)

    def ctrl(self, q: np.ndarray | None = None, qd: np.ndarray | None = None) -> np.ndarray:
        """MuJoCo's `ctrl` for this command (actuator order), clipped to the actuators' control ranges."""
        arrays = self.arrays
        if self.kind == "torque":
            unclipped = self.action * arrays.action_scale
        elif self.kind == "servo":
            assert self.targets is not None
            unclipped = arrays.gear * self.targets
        else:
            unclipped = self._pd_law(q, qd) / arrays.gear
        return np.clip(unclipped, arrays.ctrl_low, arrays.ctrl_high).astype(F32)

    def _pd_law(self, q: np.ndarray | None, qd: np.ndarray | None) -> np.ndarray:
        kp, kd = self.arrays.kp, self.arrays.kd
        if self.targets is None or kp is None or kd is None or q is None or qd is None:
            raise RuntimeInputError(f"{self.kind!r} actuation needs the joint positions and velocities")
        # a servo tracks its ctrl, the target clipped to the control range (a "pd" target is not clipped)
        targets = self.ctrl() / self.arrays.gear if self.kind == "servo" else self.targets
        return (kp * (targets - np.asarray(q, F32)) - kd * np.asarray(qd, F32)).astype(F32)


class PolicyRuntime:
    """An exported policy with its memory, stepped from raw readings (module docstring)."""

    def __init__(self, spec: PolicySpec, session: Any, motion: MotionFile | None = None) -> None:
        self.spec = spec
        self.session = session
        self.motion = motion
        self.readings = spec.readings()
        self.inputs = [(item, self._compute(item)) for item in spec.inputs]
        self.actuation = require_actuation(spec)
        self.arrays = ActuatorArrays.of(self.actuation)
        self.output_names = [spec.output_name, *(item.output_name for item in spec.memory)]
        self.reset()

    @classmethod
    def load(cls, path: str | Path, threads: int = 1) -> PolicyRuntime:
        """The policy at `path` (its .onnx or its .json) with the other file beside it; `threads`: onnxruntime's."""
        import onnxruntime as ort

        json_path = Path(path).with_suffix(".json")
        spec = load_policy_spec(json_path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        session = ort.InferenceSession(
            str(json_path.parent / spec.onnx_file), options, providers=["CPUExecutionProvider"]
        )
        command = spec.command or {}
        motion = MotionFile.load(json_path.parent / command["file"]) if command.get("kind") == MOTION else None
        return cls(spec, session, motion)

    def reset(self, clip: int | str | None = None, frame: int | None = None, heading: float | None = None) -> None:
        """The next step is an episode's first: memory, last action and clock start again. A motion plays from
        `clip`'s first frame (or from `frame`), turned to the robot's heading at the first step, or by `heading`
        (rad) about the vertical."""
        self.steps = 0
        self.last_action = np.zeros(self.spec.action_size, F32)
        self.memory: dict[str, np.ndarray] = {}
        self.last_command: ActuatorCommand | None = None
        self.motion_start = 0 if self.motion is None else self.motion.start_frame(clip, frame)
        self.turn = None if heading is None else np.array([np.cos(heading / 2), 0, 0, np.sin(heading / 2)], F32)

    @property
    def motion_frame(self) -> int:
        """The motion's frame the robot should reach by the end of this control step."""
        assert self.motion is not None
        return int(min(self.motion_start + self.steps + 1, self.motion.last[self.motion_start]))

    def observation(self, readings: Mapping[str, Any]) -> np.ndarray:
        """The policy's input vector for these readings at the current step (float32; nothing advances)."""
        return self._observe(self._values(readings))

    def step(self, readings: Mapping[str, Any]) -> ActuatorCommand:
        """One control step: the observation, the policy and its memory, and the actuator command."""
        values = self._values(readings)
        for name, value in values.items():
            bad = np.flatnonzero(~np.isfinite(value))
            if bad.size:
                return self._hold(f"reading {name!r} holds {value[bad[0]]} at index {bad[0]}")
        obs = self._observe(values)
        feeds = {self.spec.input_name: obs[None]}
        for item in self.spec.memory:
            feeds[item.input_name] = self._memory_at_step(item.input_name, item.shape, obs)
        action, *next_memory = self.session.run(self.output_names, feeds)
        action = np.asarray(action[0], F32)
        if not np.all(np.isfinite(action)):
            return self._hold("the policy's action is not finite")
        self.memory = {item.input_name: value for item, value in zip(self.spec.memory, next_memory, strict=True)}
        self.last_action, self.steps = action, self.steps + 1
        self.last_command = self._command(action)
        return self.last_command

    # ----- inside -----------------------------------------------------------------------------------------

    def _values(self, readings: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {name: self._reading(readings, name, size) for name, size in self.readings.items()}

    def _observe(self, values: dict[str, np.ndarray]) -> np.ndarray:
        parts = [compute(values.get(item.reading)) for item, compute in self.inputs]
        return np.concatenate(parts).astype(F32) if parts else np.zeros(0, F32)

    def _reading(self, readings: Mapping[str, Any], name: str, size: int) -> np.ndarray:
        if name not in readings:
            users = ", ".join(item.name for item in self.spec.inputs if item.reading == name)
            raise RuntimeInputError(f"reading {name!r} is missing: {users} needs it ({size} values)")
        value = np.asarray(readings[name], F32).reshape(-1)
        if value.size != size:
            users = ", ".join(item.name for item in self.spec.inputs if item.reading == name)
            raise RuntimeInputError(f"reading {name!r} has {value.size} values; {users} needs {size}")
        return value

    def _compute(self, item: PolicyInput) -> Callable[[np.ndarray | None], np.ndarray]:
        """The function from the input's reading (None where it has none) to its values."""
        if item.transform == AFFINE:
            indices = None if item.indices is None else np.asarray(item.indices, np.int64)
            offset = None if item.offset is None else np.asarray(item.offset, F32)
            scale, clip = F32(item.scale), item.clip

            def affine(value: np.ndarray | None) -> np.ndarray:
                assert value is not None
                v = value if indices is None else value[indices]
                if offset is not None:
                    v = v - offset
                if scale != 1:
                    v = v * scale
                return v if clip is None else np.clip(v, F32(-clip), F32(clip))

            return affine
        if item.transform == PROJECTED_GRAVITY:
            return lambda quat: rotate_inverse(quat, DOWN)  # type: ignore[arg-type]
        if item.transform == GAIT_PHASE:
            period = F32(item.period_s)

            def phase(_: np.ndarray | None) -> np.ndarray:
                angle = F32(2 * np.pi) * F32(self.steps * self.spec.ctrl_dt) / period
                return np.array([np.sin(angle), np.cos(angle)], F32)

            return phase
        if item.transform == LAST_ACTION:
            return lambda _: self.last_action
        if item.transform == REFERENCE_JOINTS:
            return lambda _: self._reference_joints()
        if item.transform == REFERENCE_ANCHOR_ORIENTATION:
            return self._reference_anchor_orientation
        raise ConfigError(f"policy.json: input {item.name!r} has transform {item.transform!r}, unknown to this ksim")

    def _require_motion(self, item: str) -> MotionFile:
        if self.motion is None:
            raise ConfigError(f"policy.json: {item} reads a motion, but the policy's command is not one")
        return self.motion

    def _reference_joints(self) -> np.ndarray:
        motion, frame = self._require_motion(REFERENCE_JOINTS), self.motion_frame
        return np.concatenate([motion.joint_pos[frame], motion.joint_vel[frame]]).astype(F32)

    def _reference_anchor_orientation(self, own: np.ndarray | None) -> np.ndarray:
        motion = self._require_motion(REFERENCE_ANCHOR_ORIENTATION)
        assert own is not None
        if self.turn is None:  # the first step: the motion's heading becomes the robot's
            self.turn = heading_quat(quat_multiply(own, quat_conjugate(motion.anchor_quat[self.motion_start])))
        reference = quat_multiply(self.turn, motion.anchor_quat[self.motion_frame])
        return rotation_6d(quat_multiply(quat_conjugate(own), reference).astype(F32))

    def _memory_at_step(self, name: str, shape: list[int], obs: np.ndarray) -> np.ndarray:
        if self.steps > 0:
            return self.memory[name]
        if name == RECURRENT_STATE:
            return np.zeros((1, *shape), F32)
        assert name == PAST_OBSERVATIONS
        return np.broadcast_to(obs, (1, *shape)).astype(F32)

    def _command(self, action: np.ndarray) -> ActuatorCommand:
        arrays = self.arrays
        if arrays.default_position is None:
            return ActuatorCommand(arrays.kind, action, None, arrays)
        targets = (arrays.default_position + arrays.action_scale * action).astype(F32)
        return ActuatorCommand(arrays.kind, action, targets, arrays)

    def _hold(self, why: str) -> ActuatorCommand:
        """The previous command (the default pose before any; zero torque for torque control), saying why."""
        if self.arrays.kind == "torque":
            held, what = self._command(np.zeros(self.spec.action_size, F32)), "zero torque"
        elif self.last_command is not None:
            held, what = self.last_command, "the previous targets"
        else:
            held, what = self._command(np.zeros(self.spec.action_size, F32)), "the default pose"
        return replace(held, held=f"{why}: holding {what}")


def require_actuation(spec: PolicySpec) -> ActuationSpec:
    if spec.actuation is None:
        raise ConfigError("policy.json has no actuation: export the checkpoint again with mode=export")
    return spec.actuation
