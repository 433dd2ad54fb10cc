"""What a robot needs to run an exported policy, gathered from a task's bound components (ksim.policy_spec):
each observation as a transform of one raw reading (the observation's own `robot_input`), the actuators' targets
and gains, and the command. An observation class that does not say what a robot reads for it is refused in one
line, never guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from ksim import observations as obs
from ksim.actuators import Actuators
from ksim.binding import require_own
from ksim.commands import Command, VelocityCommand
from ksim.config import ConfigError
from ksim.engine import ModelLayout
from ksim.policy_spec import (
    INPUT_PREFIX,
    MOTION,
    ActuationSpec,
    PolicyInput,
)
from ksim.tracking import MotionCommand


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
    motion: dict[str, np.ndarray] | None = None  # a motion command's frames, written beside the policy


def encoder_joints(observations: Sequence[obs.Observation], layout: ModelLayout) -> tuple[int, ...]:
    """The joints whose encoders the policy reads (hinges and slides observed by joint observations), in model
    order: the order of the joint_positions and joint_velocities readings."""
    observed = {j for o in observations if isinstance(o, obs.JointPosition | obs.JointVelocity) for j in o.joint_ids}
    return tuple(sorted(j for j in observed if len(layout.joint_qpos[j]) == 1))


def robot_input(observation: obs.Observation, size: int, robot: obs.RobotContext) -> PolicyInput:
    """The observation's robot-side form; ConfigError where its class redefines observe() below the class whose
    robot_input() it inherits (that form may not compute this observation)."""
    simulator_only = "robot_input(size, robot), or set robot_input = ksim.observations.simulator_only"
    require_own(observation, "robot_input", "observe", "mode='export'", simulator_only)
    return observation.robot_input(size, robot)


def describe_inputs(
    observations: Sequence[obs.Observation], names_and_sizes: Sequence[tuple[str, int]], layout: ModelLayout
) -> tuple[tuple[PolicyInput, ...], tuple[str, ...], obs.FeetContact | None]:
    """(each observation as a robot computes it, under its name in the observation layout; the encoder joints'
    names; the FeetContact observation that the foot_contacts reading feeds, if any)."""
    joints = encoder_joints(observations, layout)
    robot = obs.RobotContext(layout, joints)
    contacts = [o for o in observations if isinstance(o, obs.FeetContact)]
    if any(o.feet != contacts[0].feet for o in contacts):
        raise ConfigError("mode='export': the FeetContact observations name different feet; one foot_contacts reading")
    described = []
    for o, (name, size) in zip(observations, names_and_sizes, strict=True):
        item = robot_input(o, size, robot)
        reading = INPUT_PREFIX + name if item.reading.startswith(INPUT_PREFIX) else item.reading
        described.append(dataclasses.replace(item, name=name, reading=reading))
    return tuple(described), layout.names(joints), contacts[0] if contacts else None


def describe_actuation(mj_model: mujoco.MjModel, actuators: Actuators) -> ActuationSpec:
    """How the task's actuators turn an action into MuJoCo's ctrl (and a robot's targets or torques); ConfigError
    where their class redefines ctrl() below the class whose robot_actuation() it inherits."""
    require_own(actuators, "robot_actuation", "ctrl", "mode='export'", "robot_actuation(mj_model)")
    return actuators.robot_actuation(mj_model)


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
        command.robot_arrays() if isinstance(command, MotionCommand) else None,
    )


def describe_command(command: Command | None) -> dict[str, object] | None:
    """The command the policy reads, with the sampler's ranges where sim-to-sim can draw it (VelocityCommand)."""
    if command is None:
        return None
    if isinstance(command, VelocityCommand):
        fields = {f.name: getattr(command, f.name) for f in dataclasses.fields(command)}
        return {"kind": "velocity", "size": command.size, **{k: _jsonable(v) for k, v in fields.items()}}
    if isinstance(command, MotionCommand):  # the file's name is the export's (ksim.deploy.onnx)
        return {"kind": MOTION, "size": command.size, "file": "", "clips": list(command.clip_names)}
    return {"kind": type(command).__name__, "size": command.size}


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
