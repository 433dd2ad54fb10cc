"""What a robot needs to run an exported policy: each observation as a transform of one raw reading, the
actuators' targets and gains, and the command, described from a task's bound components (ksim.policy_spec).

An observation this module does not know (a user's own class, or a subclass that may observe differently)
becomes a simulator input that the runtime's caller supplies as is, so nothing is guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from ksim import observations as obs
from ksim.actuators import Actuators, PositionActuators, PositionServoActuators, TorqueActuators, actuator_labels
from ksim.commands import Command, VelocityCommand
from ksim.config import ConfigError
from ksim.engine import ModelLayout, actuator_force_ranges
from ksim.policy_spec import (
    BASE_ANGULAR_VELOCITY,
    BASE_HEIGHT,
    BASE_LINEAR_VELOCITY,
    BASE_LINEAR_VELOCITY_WORLD,
    BASE_ORIENTATION,
    COMMAND,
    FIXED_SIZES,
    FOOT_CONTACTS,
    GAIT_PHASE,
    INPUT_PREFIX,
    JOINT_POSITIONS,
    JOINT_VELOCITIES,
    LAST_ACTION,
    PROJECTED_GRAVITY,
    ROBOT,
    RUNTIME,
    SENSOR_PREFIX,
    SIMULATOR,
    ActuationSpec,
    PolicyInput,
)


@dataclass(frozen=True)
class RobotSide:
    """A task's policy inputs as a robot computes them, its actuation and command, and the model it trains on."""

    inputs: tuple[PolicyInput, ...]
    joints: tuple[str, ...]
    feet: tuple[str, ...]
    actuation: ActuationSpec
    command: dict[str, object] | None
    episode_steps: int
    base_body: str
    start_qpos: tuple[float, ...]
    foot_geoms: tuple[tuple[int, ...], ...]
    mj_model: mujoco.MjModel


def encoder_joints(observations: Sequence[obs.Observation], layout: ModelLayout) -> tuple[int, ...]:
    """The joints whose encoders the policy reads (hinges and slides observed by joint observations), in model
    order: the order of the joint_positions and joint_velocities readings."""
    observed = {
        j
        for o in observations
        if type(o) in (obs.JointPosition, obs.JointVelocity)
        for j in o.joint_ids  # type: ignore[attr-defined]
    }
    return tuple(sorted(j for j in observed if len(layout.joint_qpos[j]) == 1))


def _joint_input(
    o: obs.JointPosition | obs.JointVelocity, size: int, layout: ModelLayout, joints: tuple[int, ...]
) -> PolicyInput:
    if any(j not in joints for j in o.joint_ids):  # a ball or free joint: no encoder reads it
        return simulator_input(o, size)
    indices = [joints.index(j) for j in o.joint_ids]
    if isinstance(o, obs.JointPosition):
        offset = [float(v) for v in np.asarray(o.origin, np.float32)]
        return PolicyInput(o.name, size, JOINT_POSITIONS, len(joints), ROBOT, indices=indices, offset=offset)
    return PolicyInput(o.name, size, JOINT_VELOCITIES, len(joints), ROBOT, indices=indices, scale=o.scale, clip=o.clip)


def simulator_input(o: obs.Observation, size: int) -> PolicyInput:
    """An input the runtime cannot compute from a robot's readings: the caller gives its values as is."""
    return PolicyInput(o.name, size, INPUT_PREFIX + o.name, size, SIMULATOR)


def _plain(reading: str, source: str = ROBOT) -> Callable[[obs.Observation, int], PolicyInput]:
    """An input that is its reading as is."""
    return lambda o, size: PolicyInput(o.name, size, reading, FIXED_SIZES.get(reading, size), source)


def _base_angular_velocity(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.BaseAngularVelocity)
    return PolicyInput(o.name, size, BASE_ANGULAR_VELOCITY, 3, ROBOT, scale=o.scale, clip=o.clip)


def _command(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.Command)
    return PolicyInput(o.name, size, COMMAND, size, ROBOT, scale=o.scale)


def _base_linear_velocity(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.BaseLinearVelocity)
    reading = BASE_LINEAR_VELOCITY_WORLD if o.world else BASE_LINEAR_VELOCITY
    return PolicyInput(o.name, size, reading, 3, SIMULATOR, scale=o.scale, clip=o.clip)


def _sensor(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.Sensor)
    return PolicyInput(o.name, size, SENSOR_PREFIX + o.sensor, size, ROBOT, scale=o.scale)


def _gait_phase(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.GaitPhase)
    return PolicyInput(o.name, size, source=RUNTIME, transform=GAIT_PHASE, period_s=o.period_s)


def _projected_gravity(o: obs.Observation, size: int) -> PolicyInput:
    assert isinstance(o, obs.ProjectedGravity)
    reading = BASE_ORIENTATION if o.sensor is None else SENSOR_PREFIX + o.sensor
    return PolicyInput(o.name, size, reading, 4, ROBOT, transform=PROJECTED_GRAVITY)


# Per observation class (exactly that class: a subclass may observe otherwise), its description from one reading.
DESCRIBE: dict[type, Callable[[obs.Observation, int], PolicyInput]] = {
    obs.ProjectedGravity: _projected_gravity,
    obs.BaseOrientation: _plain(BASE_ORIENTATION),
    obs.BaseAngularVelocity: _base_angular_velocity,
    obs.BaseLinearVelocity: _base_linear_velocity,
    obs.BaseHeight: _plain(BASE_HEIGHT, SIMULATOR),
    obs.Sensor: _sensor,
    obs.FeetContact: _plain(FOOT_CONTACTS),
    obs.Command: _command,
    obs.LastAction: lambda o, size: PolicyInput(o.name, size, source=RUNTIME, transform=LAST_ACTION),
    obs.GaitPhase: _gait_phase,
}


def describe_inputs(
    observations: Sequence[obs.Observation], names_and_sizes: Sequence[tuple[str, int]], layout: ModelLayout
) -> tuple[tuple[PolicyInput, ...], tuple[str, ...], obs.FeetContact | None]:
    """(each observation as a robot computes it, under its name in the observation layout; the encoder joints'
    names; the FeetContact observation that the foot_contacts reading feeds, if any)."""
    joints = encoder_joints(observations, layout)
    contacts = [o for o in observations if type(o) is obs.FeetContact]
    if any(o.feet != contacts[0].feet for o in contacts):
        raise ConfigError("mode='export': the FeetContact observations name different feet; one foot_contacts reading")
    described = []
    for o, (name, size) in zip(observations, names_and_sizes, strict=True):
        if type(o) in (obs.JointPosition, obs.JointVelocity):
            item = _joint_input(o, size, layout, joints)  # type: ignore[arg-type]
        else:
            item = DESCRIBE.get(type(o), simulator_input)(o, size)
        reading = INPUT_PREFIX + name if item.reading.startswith(INPUT_PREFIX) else item.reading
        described.append(dataclasses.replace(item, name=name, reading=reading))
    return tuple(described), layout.names(joints), contacts[0] if contacts else None


def describe_actuation(mj_model: mujoco.MjModel, actuators: Actuators) -> ActuationSpec:
    """How the task's actuators turn an action into MuJoCo's ctrl (and a robot's targets or torques)."""
    joints = [
        (mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, int(j)) or "")
        if mj_model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT
        else ""
        for i, j in enumerate(mj_model.actuator_trnid[:, 0])
    ]
    if not isinstance(actuators, PositionActuators | PositionServoActuators | TorqueActuators):
        raise ConfigError(f"mode='export' cannot describe {type(actuators).__name__} for a robot (ksim.robot_side)")
    gear = mj_model.actuator_gear[:, 0].astype(np.float32)
    spec = ActuationSpec(
        "torque",
        actuator_labels(mj_model),
        joints,
        float(actuators.action_scale),
        _floats(gear),
        _limits(actuators.ctrl_low),
        _limits(actuators.ctrl_high),
    )
    if isinstance(actuators, PositionActuators):
        return _with_gains(spec, "pd", actuators.default_qpos, actuators.kp, actuators.kd)
    if isinstance(actuators, PositionServoActuators):  # the servos' gains and force limits live in the model
        default = actuators.default_ctrl / actuators.gear
        servo = _with_gains(spec, "servo", default, mj_model.actuator_gainprm[:, 0], -mj_model.actuator_biasprm[:, 2])
        low, high = servo_force_limits(mj_model)
        return dataclasses.replace(servo, force_low=low, force_high=high)
    return spec


def servo_force_limits(mj_model: mujoco.MjModel) -> tuple[list[float] | None, list[float] | None]:
    """The actuators' force ranges as (low, high): float32 extremes where one is not limited; None where none is."""
    if not mj_model.actuator_forcelimited.any():
        return None, None
    ranges = actuator_force_ranges(mj_model)
    return _limits(ranges[:, 0]), _limits(ranges[:, 1])


def _with_gains(spec: ActuationSpec, kind: str, default: np.ndarray, kp: np.ndarray, kd: np.ndarray) -> ActuationSpec:
    return dataclasses.replace(spec, kind=kind, default_position=_floats(default), kp=_floats(kp), kd=_floats(kd))


def describe_robot(
    observations: Sequence[obs.Observation],
    names_and_sizes: Sequence[tuple[str, int]],
    layout: ModelLayout,
    mj_model: mujoco.MjModel,
    actuators: Actuators,
    command: Command | None,
    episode_steps: int,
    start_qpos: np.ndarray,
) -> RobotSide:
    """The robot-side description of a task's bound components (what `mode=export` writes into policy.json)."""
    inputs, joints, contact = describe_inputs(observations, names_and_sizes, layout)
    feet, foot_geoms = (contact.feet, contact.foot_geoms) if contact is not None else ((), ())
    return RobotSide(
        inputs,
        joints,
        tuple(feet),
        describe_actuation(mj_model, actuators),
        describe_command(command),
        episode_steps,
        layout.body_names[layout.base_body],
        tuple(float(q) for q in start_qpos),
        tuple(tuple(int(g) for g in geoms) for geoms in foot_geoms),
        mj_model,
    )


def describe_command(command: Command | None) -> dict[str, object] | None:
    """The command the policy reads, with the sampler's ranges where sim-to-sim can draw it (VelocityCommand)."""
    if command is None:
        return None
    if isinstance(command, VelocityCommand):
        fields = {f.name: getattr(command, f.name) for f in dataclasses.fields(command)}
        return {"kind": "velocity", "size": command.size, **{k: _jsonable(v) for k, v in fields.items()}}
    return {"kind": type(command).__name__, "size": type(command).size}


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values, np.float64)]


def _limits(values: np.ndarray) -> list[float]:
    """Bounds for JSON, which has no infinity: an unbounded side becomes float32's extreme (the same clip)."""
    unlimited = float(np.finfo(np.float32).max)
    return _floats(np.clip(np.asarray(values, np.float64), -unlimited, unlimited))


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
