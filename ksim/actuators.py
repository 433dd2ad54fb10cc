"""Actuators: turn a policy action into the MuJoCo control vector, every physics substep.

Which class fits a model depends on its MJCF actuators (`actuator_kind` names them; `ksim.inspect` says which):
- `<motor>` actuators, torque out: `TorqueActuators` (the action is the torque), or `PositionActuators`
  (ksim's PD loop around a default pose computes the torque, with gains from the task);
- `<position>` servos, the model holds the gains and `ctrl` is the target: `PositionServoActuators`
  (the target is the default pose plus the scaled action).

`gain_scales` holds one env's randomized PD-gain multipliers ("kp", "kd"; see ksim.randomization).

Each class is its one definition: `ctrl` is what it does in training, `robot_actuation` how a robot does the
same from the exported action (ksim.policy_spec's ActuationSpec, which ksim.runtime runs without JAX).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.binding import undefined
from ksim.config import ConfigError
from ksim.engine import actuator_force_ranges
from ksim.policy_spec import ActuationSpec

if TYPE_CHECKING:  # MJX's types only: the native engine runs without importing MJX
    from mujoco import mjx

Array = jax.Array


def _ctrl_range(mj_model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    limited = mj_model.actuator_ctrllimited.astype(bool)
    low = np.where(limited, mj_model.actuator_ctrlrange[:, 0], -np.inf)
    high = np.where(limited, mj_model.actuator_ctrlrange[:, 1], np.inf)
    return low.astype(np.float32), high.astype(np.float32)


MOTOR, POSITION_SERVO, VELOCITY_SERVO, OTHER = "motor", "position servo", "velocity servo", "other"


def actuator_kind(mj_model: mujoco.MjModel, actuator: int) -> str:
    """What an MJCF actuator is: a motor (force = gear * ctrl), a position or velocity servo, or another kind."""
    gain, bias = mj_model.actuator_gainprm[actuator], mj_model.actuator_biasprm[actuator]
    plain_gain = mj_model.actuator_gaintype[actuator] == mujoco.mjtGain.mjGAIN_FIXED
    no_state = int(mj_model.actuator_dyntype[actuator]) in (
        int(mujoco.mjtDyn.mjDYN_NONE),
        int(mujoco.mjtDyn.mjDYN_FILTEREXACT),
    )
    if not (plain_gain and no_state):
        return OTHER
    if mj_model.actuator_biastype[actuator] == mujoco.mjtBias.mjBIAS_NONE:
        return MOTOR
    affine = mj_model.actuator_biastype[actuator] == mujoco.mjtBias.mjBIAS_AFFINE
    if affine and bias[0] == 0 and gain[0] > 0 and np.isclose(bias[1], -gain[0]):
        return POSITION_SERVO
    if affine and bias[0] == 0 and bias[1] == 0 and gain[0] > 0 and np.isclose(bias[2], -gain[0]):
        return VELOCITY_SERVO
    return OTHER


def actuator_labels(mj_model: mujoco.MjModel) -> list[str]:
    """Every actuator's name in action order (`actuator_<i>` for an unnamed one)."""
    return [mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_ACTUATOR, i) or f"actuator_{i}" for i in range(mj_model.nu)]


def actuated_joints(mj_model: mujoco.MjModel) -> list[str]:
    """The name of the joint each actuator drives, in actuator order."""
    return [mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, int(j)) for j in mj_model.actuator_trnid[:, 0]]


def actuator_names(mj_model: mujoco.MjModel, actuators: Sequence[int]) -> str:
    return ", ".join(repr(mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_ACTUATOR, i) or f"#{i}") for i in actuators)


def _not_on_a_joint_as(mj_model: mujoco.MjModel, kind: str) -> list[int]:
    """The actuators that are not a `kind` (an `actuator_kind`) driving one hinge or slide joint."""
    hinge_or_slide = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    joint_ids = mj_model.actuator_trnid[:, 0]
    return [
        i
        for i in range(mj_model.nu)
        if actuator_kind(mj_model, i) != kind
        or mj_model.actuator_trntype[i] != mujoco.mjtTrn.mjTRN_JOINT
        or int(mj_model.jnt_type[joint_ids[i]]) not in hinge_or_slide
    ]


class Actuators(ABC):
    """Maps an action in [-1, 1]-ish units to `data.ctrl`."""

    @abstractmethod
    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array: ...

    def apply_gain_scales(
        self, gain_scales: Mapping[str, Array], model_fields: Mapping[str, Array], model: mjx.Model
    ) -> tuple[dict[str, Array], dict[str, Array]]:
        """One env's (gain scales for `ctrl`, model fields): actuators whose gains live in the model move the
        scales into its fields; the others keep them for `ctrl`."""
        return dict(gain_scales), dict(model_fields)

    @undefined
    def robot_actuation(self, mj_model: mujoco.MjModel) -> ActuationSpec:
        """How a robot turns the exported action into its targets or torques, as `ctrl` does in training."""
        cls = type(self).__name__
        raise ConfigError(f"mode='export' cannot describe {cls} for a robot: define {cls}.robot_actuation(mj_model)")


def motor_actuation(
    mj_model: mujoco.MjModel, action_scale: float, ctrl_low: np.ndarray, ctrl_high: np.ndarray
) -> ActuationSpec:
    """The torque actuation of `mj_model`'s actuators (ctrl = action_scale * action within the bounds, times the
    gear), which the PD and servo kinds add their gains to."""
    joints = [
        (mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, int(j)) or "")
        if mj_model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT
        else ""
        for i, j in enumerate(mj_model.actuator_trnid[:, 0])
    ]
    gear = mj_model.actuator_gear[:, 0].astype(np.float32)
    labels = actuator_labels(mj_model)
    return ActuationSpec(
        "torque", labels, joints, float(action_scale), _floats(gear), _limits(ctrl_low), _limits(ctrl_high)
    )


def _with_gains(spec: ActuationSpec, kind: str, default: np.ndarray, kp: np.ndarray, kd: np.ndarray) -> ActuationSpec:
    return dataclasses.replace(spec, kind=kind, default_position=_floats(default), kp=_floats(kp), kd=_floats(kd))


def servo_force_limits(mj_model: mujoco.MjModel) -> tuple[list[float] | None, list[float] | None]:
    """The actuators' force ranges as (low, high): float32 extremes where one is not limited; None where none is."""
    if not mj_model.actuator_forcelimited.any():
        return None, None
    ranges = actuator_force_ranges(mj_model)
    return _limits(ranges[:, 0]), _limits(ranges[:, 1])


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values, np.float64)]


def _limits(values: np.ndarray) -> list[float]:
    """Bounds for JSON, which has no infinity: an unbounded side becomes float32's extreme (the same clip)."""
    unlimited = float(np.finfo(np.float32).max)
    return _floats(np.clip(np.asarray(values, np.float64), -unlimited, unlimited))


@dataclass(frozen=True)
class TorqueActuators(Actuators):
    """The action, scaled, is the motor control directly (clipped to each actuator's ctrlrange)."""

    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    action_scale: float = 1.0

    @classmethod
    def from_model(cls, mj_model: mujoco.MjModel, action_scale: float = 1.0) -> TorqueActuators:
        low, high = _ctrl_range(mj_model)
        return cls(low, high, action_scale)

    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array:
        return jnp.clip(action * self.action_scale, self.ctrl_low, self.ctrl_high)

    def robot_actuation(self, mj_model: mujoco.MjModel) -> ActuationSpec:
        return motor_actuation(mj_model, self.action_scale, self.ctrl_low, self.ctrl_high)


@dataclass(frozen=True)
class PositionActuators(Actuators):
    """PD control around a default pose: target = default + action_scale * action.

    Each actuator must be a motor on a hinge or slide joint; the PD torque is divided by the motor's
    gear so `kp`/`kd` are in joint units (N m / rad, N m s / rad).
    """

    qpos_index: np.ndarray
    qvel_index: np.ndarray
    default_qpos: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    gear: np.ndarray
    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    action_scale: float

    @classmethod
    def from_model(
        cls,
        mj_model: mujoco.MjModel,
        kp: float | np.ndarray,
        kd: float | np.ndarray,
        default_qpos: np.ndarray,
        action_scale: float = 0.5,
        torque_limit: np.ndarray | None = None,
    ) -> PositionActuators:
        """`torque_limit` (N m per actuator, e.g. a firmware's soft limits) narrows the motors' ctrlrange."""
        joint_ids = mj_model.actuator_trnid[:, 0]
        if np.any(mj_model.actuator_trntype != mujoco.mjtTrn.mjTRN_JOINT):
            raise ValueError("PositionActuators needs every actuator to drive a joint (trntype 'joint')")
        qpos_index = mj_model.jnt_qposadr[joint_ids]
        low, high = _ctrl_range(mj_model)
        if torque_limit is not None:
            limit = np.abs(np.asarray(torque_limit, np.float32) / mj_model.actuator_gear[:, 0].astype(np.float32))
            low, high = np.maximum(low, -limit), np.minimum(high, limit)
        num_actuators = mj_model.nu
        return cls(
            qpos_index=qpos_index,
            qvel_index=mj_model.jnt_dofadr[joint_ids],
            default_qpos=np.asarray(default_qpos, np.float32)[qpos_index],
            kp=np.broadcast_to(np.asarray(kp, np.float32), (num_actuators,)).copy(),
            kd=np.broadcast_to(np.asarray(kd, np.float32), (num_actuators,)).copy(),
            gear=mj_model.actuator_gear[:, 0].astype(np.float32),
            ctrl_low=low,
            ctrl_high=high,
            action_scale=action_scale,
        )

    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array:
        scales = gain_scales or {}
        kp, kd = self.kp * scales.get("kp", 1.0), self.kd * scales.get("kd", 1.0)
        target = self.default_qpos + self.action_scale * action
        torque = kp * (target - data.qpos[self.qpos_index]) - kd * data.qvel[self.qvel_index]
        return jnp.clip(torque / self.gear, self.ctrl_low, self.ctrl_high)

    def robot_actuation(self, mj_model: mujoco.MjModel) -> ActuationSpec:
        spec = motor_actuation(mj_model, self.action_scale, self.ctrl_low, self.ctrl_high)
        return _with_gains(spec, "pd", self.default_qpos, self.kp, self.kd)


@dataclass(frozen=True)
class PositionServoActuators(Actuators):
    """For MJCF position servos (`<position kp=...>`): the model holds the gains and `ctrl` is the joint target.

    ctrl = default pose + action_scale * action (times each actuator's gear), clipped to its ctrlrange, so
    action 0 holds the default pose: the model's first keyframe, or the one named in `from_model`.
    Randomized gains ("kp", "kd") scale the servos' gain and bias terms in each env's model.
    """

    default_ctrl: np.ndarray
    gear: np.ndarray
    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    action_scale: float

    @classmethod
    def from_model(
        cls, mj_model: mujoco.MjModel, action_scale: float = 0.5, keyframe: str | None = None
    ) -> PositionServoActuators:
        """ConfigError (one line) unless every actuator is a position servo on a hinge or slide joint."""
        joint_ids = mj_model.actuator_trnid[:, 0]
        not_servos = _not_on_a_joint_as(mj_model, POSITION_SERVO)
        if not_servos or mj_model.nu == 0:
            kinds = "; ".join(f"{actuator_names(mj_model, [i])} is a {actuator_kind(mj_model, i)}" for i in not_servos)
            raise ConfigError(
                "PositionServoActuators needs every actuator to be a <position> servo on a hinge or slide joint"
                + (f": {kinds}" if kinds else ": the model has no actuators")
                + " (for <motor> actuators use TorqueActuators or PositionActuators)"
            )
        gear = mj_model.actuator_gear[:, 0].astype(np.float32)
        pose = default_pose(mj_model, keyframe)
        low, high = _ctrl_range(mj_model)
        return cls(
            default_ctrl=(gear * pose[mj_model.jnt_qposadr[joint_ids]]).astype(np.float32),
            gear=gear,
            ctrl_low=low,
            ctrl_high=high,
            action_scale=action_scale,
        )

    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array:
        return jnp.clip(self.default_ctrl + self.gear * self.action_scale * action, self.ctrl_low, self.ctrl_high)

    def robot_actuation(self, mj_model: mujoco.MjModel) -> ActuationSpec:
        """The servos' gains and force limits live in the model."""
        spec = motor_actuation(mj_model, self.action_scale, self.ctrl_low, self.ctrl_high)
        kp, kd = mj_model.actuator_gainprm[:, 0], -mj_model.actuator_biasprm[:, 2]
        servo = _with_gains(spec, "servo", self.default_ctrl / self.gear, kp, kd)
        low, high = servo_force_limits(mj_model)
        return dataclasses.replace(servo, force_low=low, force_high=high)

    def apply_gain_scales(
        self, gain_scales: Mapping[str, Array], model_fields: Mapping[str, Array], model: mjx.Model
    ) -> tuple[dict[str, Array], dict[str, Array]]:
        if not gain_scales:
            return {}, dict(model_fields)
        gain = model_fields.get("actuator_gainprm", model.actuator_gainprm)
        bias = model_fields.get("actuator_biasprm", model.actuator_biasprm)
        kp, kd = gain_scales.get("kp", 1.0), gain_scales.get("kd", 1.0)
        fields = {
            **model_fields,
            "actuator_gainprm": gain.at[:, 0].multiply(kp),
            "actuator_biasprm": bias.at[:, 1].multiply(kp).at[:, 2].multiply(kd),
        }
        return {}, fields


def default_pose(mj_model: mujoco.MjModel, keyframe: str | None = None) -> np.ndarray:
    """qpos of the named keyframe, else of the model's first keyframe, else the model's reference pose."""
    if keyframe is None:
        return (mj_model.key_qpos[0] if mj_model.nkey > 0 else mj_model.qpos0).astype(np.float32)
    names = [mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_KEY, i) for i in range(mj_model.nkey)]
    if keyframe not in names:
        listed = ", ".join(repr(n) for n in names if n) or "(none named)"
        raise ConfigError(f"keyframe={keyframe!r}: the model has no such keyframe; its keyframes are {listed}")
    return mj_model.key_qpos[names.index(keyframe)].astype(np.float32)


def delay_action(queue: Array, action: Array) -> tuple[Array, Array]:
    """(the action to apply, the queue after it): the queue holds the last k chosen actions, oldest first."""
    if queue.shape[0] == 0:
        return action, queue
    return queue[0], jnp.concatenate([queue[1:], action[None]])


@dataclass(frozen=True)
class JointGains:
    """Per actuator (model order): the PD gains and torque limit a robot's firmware uses."""

    kp: np.ndarray
    kd: np.ndarray
    torque_limit: np.ndarray


GAIN_FIELDS = ("kp", "kd", "soft_torque_limit")


def gains_from_metadata(mj_model: mujoco.MjModel, path: str | Path) -> JointGains:
    """Reads K-Scale's `metadata.json` (per joint: kp, kd, soft_torque_limit, as text) for the joints the model's
    actuators drive; ConfigError in one line naming the joint and the field for a joint it lacks, a joint the
    model lacks, or a value that is not a positive number."""
    table = json.loads(Path(path).read_text()).get("joint_name_to_metadata", {})
    joints = actuated_joints(mj_model)
    unknown = sorted(set(table) - set(joints))
    if unknown:
        raise ConfigError(f"{path}: joint {unknown[0]!r} is not driven by any actuator of the model")
    values = {field: np.zeros(len(joints), np.float32) for field in GAIN_FIELDS}
    for i, joint in enumerate(joints):
        if joint not in table:
            raise ConfigError(f"{path}: joint {joint!r} is missing (the model's actuator drives it)")
        for field in GAIN_FIELDS:
            text = table[joint].get(field)
            try:
                value = float(text)
            except (TypeError, ValueError):
                value = float("nan")
            if not value > 0 or not np.isfinite(value):
                raise ConfigError(f"{path}: joint {joint!r} field {field!r} is {text!r}, not a positive number")
            values[field][i] = value
    return JointGains(values["kp"], values["kd"], values["soft_torque_limit"])


def as_position_servos(mj_model: mujoco.MjModel, gains: JointGains) -> mujoco.MjModel:
    """A copy of `mj_model` whose `<motor>` actuators are position servos with `gains` (joint units, as
    `PositionActuators` takes them) and force ranges narrowed to the torque limits; ConfigError in one line
    naming an actuator that is not a motor on a hinge or slide joint.

    MuJoCo then runs the PD law inside its step, so the native engine steps a control step's substeps in one
    call; under the Euler integrator the torque at every substep is `PositionActuators`' (drive it with
    `PositionServoActuators`, whose targets are likewise unclipped)."""
    refused = _not_on_a_joint_as(mj_model, MOTOR)
    if refused:
        raise ConfigError(
            f"as_position_servos: actuator {actuator_names(mj_model, refused[:1])} is a"
            f" {actuator_kind(mj_model, refused[0])} (each actuator must be a <motor> on a hinge or slide joint)"
        )
    servos = copy.copy(mj_model)
    gear = mj_model.actuator_gear[:, 0]
    # force = gain * ctrl + bias1 * length + bias2 * velocity, with ctrl = gear * target, length = gear * q and the
    # joint torque gear * force: joint-unit gains divide by gear squared.
    kp, kd = gains.kp / np.square(gear), gains.kd / np.square(gear)
    low, high = _ctrl_range(mj_model)
    limit = np.abs(gains.torque_limit / gear)
    force_low, force_high = actuator_force_ranges(mj_model).T
    servos.actuator_gaintype[:] = mujoco.mjtGain.mjGAIN_FIXED
    servos.actuator_biastype[:] = mujoco.mjtBias.mjBIAS_AFFINE
    servos.actuator_gainprm[:] = 0.0
    servos.actuator_biasprm[:] = 0.0
    servos.actuator_gainprm[:, 0] = kp
    servos.actuator_biasprm[:, 1] = -kp
    servos.actuator_biasprm[:, 2] = -kd
    servos.actuator_forcerange[:, 0] = np.maximum.reduce([low, force_low, -limit])
    servos.actuator_forcerange[:, 1] = np.minimum.reduce([high, force_high, limit])
    servos.actuator_forcelimited[:] = 1
    servos.actuator_ctrllimited[:] = 0
    return servos


@dataclass(frozen=True)
class ElectricMotor:
    """A joint's drive as its data sheet gives it: the inertia of the rotor and of each gear stage after it, each
    stage's ratio (the rotor's own first: 1), and the torque and speed limits at the joint. `count` motors drive
    the joint together (a linkage: their inertias and torques add)."""

    rotor_inertias: tuple[float, ...]  # kg m^2
    gears: tuple[float, ...]
    effort_limit: float  # N m, one motor
    velocity_limit: float  # rad/s
    count: int = 1

    @property
    def armature(self) -> float:
        """The inertia the joint feels from the drive (MuJoCo's joint armature): each stage's inertia times the
        square of the speed-up from the joint to it."""
        return self.count * reflected_inertia(self.rotor_inertias, self.gears)

    @property
    def torque_limit(self) -> float:
        return self.count * self.effort_limit

    def gains(self, natural_frequency_hz: float, damping_ratio: float) -> tuple[float, float]:
        """(kp, kd) that make the joint alone, with only the drive's inertia, a second-order system of that
        natural frequency and damping ratio: kp = armature w^2, kd = 2 zeta armature w."""
        omega = 2.0 * np.pi * natural_frequency_hz
        return self.armature * omega**2, 2.0 * damping_ratio * self.armature * omega


def reflected_inertia(rotor_inertias: Sequence[float], gears: Sequence[float]) -> float:
    """The inertia at the output of a gear train: stage i (0: the rotor) turns prod(gears[i + 1:]) times as fast
    as the output, so its inertia counts that factor squared."""
    if len(rotor_inertias) != len(gears) or not gears:
        raise ConfigError(f"a motor gives one gear per inertia: {len(rotor_inertias)} inertias, {len(gears)} gears")
    return float(sum(inertia * np.prod(gears[i + 1 :]) ** 2 for i, inertia in enumerate(rotor_inertias)))


def joint_motors(mj_model: mujoco.MjModel, motors: Mapping[str, ElectricMotor]) -> list[ElectricMotor]:
    """The motor of each actuator's joint (model order), found by `motors`' keys as regular expressions over the
    joint names; ConfigError in one line for a joint that no key or two keys match, or a key that matches none."""
    joints = actuated_joints(mj_model)
    found = []
    used = set()
    for joint in joints:
        keys = [key for key in motors if re.fullmatch(key, joint)]
        if len(keys) != 1:
            what = "no motor pattern" if not keys else f"the motor patterns {', '.join(map(repr, keys))}"
            raise ConfigError(f"joint {joint!r} matches {what}; each actuated joint matches exactly one")
        used.add(keys[0])
        found.append(motors[keys[0]])
    unused = [key for key in motors if key not in used]
    if unused:
        raise ConfigError(f"motor pattern {unused[0]!r} matches no actuated joint of the model")
    return found


def motor_gains(
    mj_model: mujoco.MjModel,
    motors: Mapping[str, ElectricMotor],
    natural_frequency_hz: float = 10.0,
    damping_ratio: float = 2.0,
) -> JointGains:
    """Per actuator: PD gains from the joint's drive inertia (`ElectricMotor.gains`) and its torque limit."""
    if natural_frequency_hz <= 0 or damping_ratio <= 0:
        raise ConfigError(
            f"natural_frequency_hz={natural_frequency_hz} and damping_ratio={damping_ratio} must be positive"
        )
    drives = joint_motors(mj_model, motors)
    kp, kd = np.array([drive.gains(natural_frequency_hz, damping_ratio) for drive in drives], np.float32).T
    return JointGains(kp, kd, np.array([drive.torque_limit for drive in drives], np.float32))


def with_motor_armature(mj_model: mujoco.MjModel, motors: Mapping[str, ElectricMotor]) -> mujoco.MjModel:
    """A copy of `mj_model` whose actuated joints have their drives' armature."""
    drives = joint_motors(mj_model, motors)
    model = copy.copy(mj_model)
    for joint, drive in zip(mj_model.actuator_trnid[:, 0], drives, strict=True):
        model.dof_armature[mj_model.jnt_dofadr[joint]] = drive.armature
    return model
