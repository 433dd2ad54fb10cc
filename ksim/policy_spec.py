"""What `policy.json` says about an exported policy; plain dataclasses that import nothing of JAX.

The ONNX file maps observation vectors to actions; this file says how a robot builds that vector from its
raw readings (which reading feeds each input, and the offset, scale, clip or transform training applied), what
the policy remembers between steps, and how an action becomes what the actuators need. `ksim.deploy.onnx` writes
it, `ksim.runtime` reads it on the robot.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ksim.errors import ConfigError

SPEC_FORMAT = "ksim-policy/2"
OLDER_FORMATS = ("ksim-policy/1",)
INPUT_NAME = "observation"
OUTPUT_NAME = "action"
RECURRENT_STATE = "recurrent_state"
PAST_OBSERVATIONS = "past_observations"

# Where an input's values come from.
ROBOT = "robot"  # a reading the robot measures (encoders, IMU, named sensors, foot switches, the command)
RUNTIME = "runtime"  # what the runtime keeps itself (the last action, the gait clock)
SIMULATOR = "simulator"  # only a simulator knows it; the caller supplies the reading

# How an input is computed from its reading.
AFFINE = "affine"  # clip((reading[indices] - offset) * scale, -clip, clip)
PROJECTED_GRAVITY = "projected_gravity"  # the world's (0, 0, -1) in the frame of the orientation reading
GAIT_PHASE = "gait_phase"  # (sin, cos) of 2 pi t / period_s, t the time since the episode started
LAST_ACTION = "last_action"  # the policy's previous action (zeros at an episode's first step)
# A motion's (the command file beside the policy, played from the runtime's own clock: ksim.runtime):
REFERENCE_JOINTS = "reference_joints"  # the next frame's joint angles, then velocities
REFERENCE_ANCHOR_ORIENTATION = "reference_anchor_orientation"  # the next frame's anchor orientation in the frame of
# the orientation reading (two columns of its rotation matrix), the motion turned to the robot's heading at the start

# The readings a robot provides, by name, with their sizes where they are fixed.
JOINT_POSITIONS = "joint_positions"  # rad or m, one per entry of `joints`, in that order
JOINT_VELOCITIES = "joint_velocities"
BASE_ORIENTATION = "base_orientation"  # quaternion (w, x, y, z) of the base (the IMU's estimate), world frame
BASE_ANGULAR_VELOCITY = "base_angular_velocity"  # rad/s in the base frame (the gyro)
FOOT_CONTACTS = "foot_contacts"  # 1 or 0 per foot of `feet`
COMMAND = "command"
MOTION = "motion"  # a command's kind: the policy plays a motion file (its "file" beside the policy)
SENSOR_PREFIX = "sensor:"  # "sensor:<MJCF sensor name>": that sensor's values
# Readings only a simulator has (the caller of the runtime supplies them; sim-to-sim does).
BASE_LINEAR_VELOCITY = "base_linear_velocity"  # m/s in the base frame
BASE_LINEAR_VELOCITY_WORLD = "base_linear_velocity_world"
BASE_HEIGHT = "base_height"  # m, the base frame's world z
INPUT_PREFIX = "input:"  # "input:<observation name>": an observation the runtime cannot compute, given as is
FIXED_SIZES = {BASE_ORIENTATION: 4, BASE_ANGULAR_VELOCITY: 3, BASE_LINEAR_VELOCITY: 3, BASE_LINEAR_VELOCITY_WORLD: 3}
FIXED_SIZES[BASE_HEIGHT] = 1


@dataclass(frozen=True)
class PolicyInput:
    """One observation component: its place in the policy's input and how it is computed from a reading."""

    name: str
    size: int
    reading: str = ""  # "" for what the runtime keeps itself
    reading_size: int = 0
    source: str = ROBOT
    transform: str = AFFINE
    indices: list[int] | None = None  # which values of the reading (None: all of them)
    offset: list[float] | None = None
    scale: float = 1.0
    clip: float | None = None
    period_s: float | None = None


@dataclass(frozen=True)
class MemoryInput:
    """One memory input of the ONNX policy: fed back from `output_name`, reset at every episode's start."""

    input_name: str
    output_name: str
    shape: list[int]  # one robot's (the batch axis comes first)
    reset: str


@dataclass(frozen=True)
class ActuationSpec:
    """How an action becomes what the actuators need.

    kind "pd": target = default_position + action_scale * action, tracked by a PD loop (kp, kd) whose torque
    is clipped to [torque_low, torque_high] (ksim runs it every physics substep; a robot's motor driver does).
    kind "servo": the same target, sent to position servos whose gains are kp, kd; where the model limits a
    servo's force, its torque is clipped to gear x [force_low, force_high] (None: no servo is limited; one that
    is not has the float32 extremes).
    kind "torque": torque = gear * clip(action_scale * action, ctrl_low, ctrl_high).
    MuJoCo's `ctrl` is torque / gear for "pd" and "torque", gear * target for "servo", clipped to ctrl_low/high.
    """

    kind: str
    actuators: list[str]
    joints: list[str]  # the joint each actuator drives, in action order
    action_scale: float
    gear: list[float]
    ctrl_low: list[float]
    ctrl_high: list[float]
    default_position: list[float] | None = None
    kp: list[float] | None = None
    kd: list[float] | None = None
    force_low: list[float] | None = None
    force_high: list[float] | None = None


@dataclass(frozen=True)
class PolicySpec:
    """What `policy.json` says: the ONNX file's inputs, how each is computed, and what its output drives."""

    task: str
    onnx_file: str
    inputs: list[PolicyInput]
    actuators: list[str]
    actuator_type: str
    action_meaning: str
    action_scale: float | None
    ctrl_dt: float
    versions: dict[str, str]
    input_name: str = INPUT_NAME
    output_name: str = OUTPUT_NAME
    format: str = SPEC_FORMAT
    checkpoint: str = ""
    recurrent_size: int = 0
    observation_history: int = 1
    memory: list[MemoryInput] = field(default_factory=list)  # fed back step by step, in this order
    joints: list[str] = field(default_factory=list)  # the order of joint_positions and joint_velocities
    feet: list[str] = field(default_factory=list)  # the order of foot_contacts
    actuation: ActuationSpec | None = None
    # {"kind": "velocity", "size": 3, "forward": [lo, hi], ...}, {"kind": "motion", "size": N, "file": F, "clips": ...}
    command: dict[str, Any] | None = None
    model_file: str = ""  # the MuJoCo model the policy was trained on (MJB), beside the policy
    episode_steps: int = 0
    task_class: str = ""  # "module:Class" of the task that trained it (sim-to-sim judges episodes with it)
    config_class: str = ""
    task_config: str = ""  # the task's config (YAML)
    base_body: str = ""
    start_qpos: list[float] = field(default_factory=list)  # the pose an episode starts from, before its resets
    foot_geoms: list[list[int]] = field(default_factory=list)  # per foot of `feet`, its geoms in the model file
    observation_size: int = field(init=False)
    action_size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "observation_size", sum(item.size for item in self.inputs))
        object.__setattr__(self, "action_size", len(self.actuators))

    @property
    def simulator_inputs(self) -> list[str]:
        """The inputs only a simulator knows: a robot's caller must supply their readings."""
        return [item.name for item in self.inputs if item.source == SIMULATOR]

    def readings(self) -> dict[str, int]:
        """Every reading the policy needs, by name, with its size."""
        return {item.reading: item.reading_size for item in self.inputs if item.reading}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, allow_nan=False)  # strict JSON, as a robot's parser reads it

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySpec:
        derived = {"observation_size", "action_size"}
        fields = {key: value for key, value in data.items() if key not in derived}
        fields["inputs"] = [PolicyInput(**item) for item in data["inputs"]]
        fields["memory"] = [MemoryInput(**item) for item in data.get("memory", [])]
        if data.get("actuation") is not None:
            fields["actuation"] = ActuationSpec(**data["actuation"])
        return cls(**fields)


def load_policy_spec(path: str | Path) -> PolicySpec:
    """Reads a `policy.json` written by `ksim.deploy.onnx`; ConfigError (one line) if it is not one, or an older one."""
    try:
        data = json.loads(Path(path).read_text())
        found = data.get("format")
    except (OSError, ValueError, AttributeError) as error:
        raise ConfigError(f"{path} is not a ksim policy JSON ({error})") from None
    if found in OLDER_FORMATS:
        raise ConfigError(
            f"{path} is an older export (format {found!r}, this ksim reads {SPEC_FORMAT!r}): export the checkpoint"
            " again with mode=export"
        )
    try:
        if found != SPEC_FORMAT:
            raise ValueError(f"format is {found!r}, not {SPEC_FORMAT!r}")
        return PolicySpec.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise ConfigError(f"{path} is not a ksim policy JSON ({error})") from None


def memory_inputs(memory: dict[str, int], observation_size: int) -> list[MemoryInput]:
    """The ONNX policy's memory inputs, in the order it takes them, for `memory` (observation_history,
    recurrent_size)."""
    inputs = []
    if memory["recurrent_size"] > 0:
        reset = "zeros at every episode's first step"
        inputs.append(MemoryInput(RECURRENT_STATE, f"next_{RECURRENT_STATE}", [memory["recurrent_size"]], reset))
    if memory["observation_history"] > 1:
        shape = [memory["observation_history"] - 1, observation_size]
        reset = "the episode's first observation in every row at its first step"
        inputs.append(MemoryInput(PAST_OBSERVATIONS, f"next_{PAST_OBSERVATIONS}", shape, reset))
    return inputs
