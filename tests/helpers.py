"""Small tasks and configs shared by the tests (tiny shapes keep CPU compiles short)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import mujoco

from examples.cartpole import DEFAULT_CONFIG, CartpoleConfig, CartpoleTask
from ksim import observations as obs
from ksim import randomization as rnd
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionActuators, PositionServoActuators
from ksim.commands import Command, VelocityCommand
from ksim.events import Event, Push
from ksim.resets import RandomJointPositions, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask
from ksim.task.ppo import PPOConfig, PPOTask


@dataclasses.dataclass
class DistributedCartpoleConfig(CartpoleConfig, DistributedPPOConfig):
    pass


class DistributedCartpoleTask(CartpoleTask, DistributedPPOTask[DistributedCartpoleConfig]):
    pass


TINY = {
    "num_envs": 8,
    "batch_size": 4,
    "rollout_length_frames": 8,
    "num_passes": 2,
    "actor_hidden": [16, 16],
    "critic_hidden": [16, 16],
    "num_steps": 2,
    "save_every_n_steps": 0,
    "eval_every_n_steps": 0,
}


def cartpole_config(**overrides: Any) -> CartpoleConfig:
    return dataclasses.replace(DEFAULT_CONFIG, **{**TINY, **overrides})


def distributed_cartpole_config(**overrides: Any) -> DistributedCartpoleConfig:
    return DistributedCartpoleConfig(**{**dataclasses.asdict(DEFAULT_CONFIG), **TINY, **overrides})


# A free ball with a one-hinge arm over a floor (contacts off, weak gravity: short compiles), for
# tests of randomization, commands, pushes and noise.
BALL_XML = """
<mujoco>
  <option timestep="0.01" iterations="1" ls_iterations="1" gravity="0 0 -1">
    <flag contact="disable"/>
  </option>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" friction="1 0.005 0.0001"/>
    <body name="ball" pos="0 0 0.2">
      {root}
      <geom name="ball" type="sphere" size="0.2" mass="2"/>
      <body name="arm" pos="0 0 0.2">
        <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1" armature="0.01"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="0.2" contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator>{actuator}</actuator>
</mujoco>"""
BALL_MOTOR = '<motor name="shoulder" joint="shoulder" gear="5" ctrlrange="-1 1" ctrllimited="true"/>'
BALL_SERVO = '<position name="shoulder" joint="shoulder" kp="20" kv="0.5" ctrlrange="-2 2" ctrllimited="true"/>'


@dataclasses.dataclass
class BallConfig(PPOConfig):
    sim2real: bool = True  # randomization, command, pushes and observation noise
    servo: bool = False  # the shoulder is an MJCF position servo (PositionServoActuators), not a motor


class BallTask(PPOTask[BallConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        actuator = BALL_SERVO if self.config.servo else BALL_MOTOR
        return mujoco.MjModel.from_xml_string(BALL_XML.format(root='<freejoint name="root"/>', actuator=actuator))

    def get_observations(self) -> Sequence[obs.Observation]:
        noise = 0.05 if self.config.sim2real else 0.0
        observations = [obs.JointPosition(noise=noise), obs.JointVelocity(noise=noise, noise_type="uniform")]
        return observations + ([obs.BaseLinearVelocity(), obs.Command()] if self.config.sim2real else [])

    def get_rewards(self) -> Sequence[rew.Reward]:
        if not self.config.sim2real:
            return [rew.StayAlive(scale=1.0)]
        # FeetAirTime keeps per-env state (the ball never touches: contacts are off, its air time only grows).
        return [
            rew.LinearVelocityTracking(scale=1.0),
            rew.AngularVelocityTracking(scale=0.5),
            rew.FeetAirTime(scale=0.1, feet=("ball",)),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return []

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.1)]

    def get_randomizations(self) -> Sequence[rnd.Randomization]:
        if not self.config.sim2real:
            return []
        return [
            rnd.FloorFriction(0.5, 1.5),
            rnd.BodyMass(0.8, 1.2),
            rnd.AddedBaseMass(-0.5, 1.0),
            rnd.CenterOfMassOffset(-0.02, 0.02),
            rnd.JointDamping(0.5, 2.0),
            rnd.JointArmature(0.8, 1.2),
            rnd.ActuatorStrength(0.9, 1.1),
            rnd.PositionGain(0.8, 1.2),
            rnd.VelocityGain(0.8, 1.2),
        ]

    def get_command(self) -> Command | None:
        return VelocityCommand(resample_s=(0.04, 0.1), zero_probability=0.3) if self.config.sim2real else None

    def get_events(self) -> Sequence[Event]:
        return [Push(max_velocity=(1.0, 1.0, 0.5), interval_s=(0.04, 0.1))] if self.config.sim2real else []

    def get_actuators(self) -> Actuators:
        if self.config.servo:
            return PositionServoActuators.from_model(self.engine.mj_model)
        return PositionActuators.from_model(
            self.engine.mj_model, kp=20.0, kd=0.5, default_qpos=self.engine.default_qpos
        )


@dataclasses.dataclass
class DistributedBallConfig(BallConfig, DistributedPPOConfig):
    pass


class DistributedBallTask(BallTask, DistributedPPOTask[DistributedBallConfig]):
    pass


BALL = {
    **TINY,
    "batch_size": 8,  # one minibatch: updates on different device counts agree to float precision
    "ctrl_dt": 0.02,
    "dt": 0.01,
    "episode_length_s": None,
    "episode_length_steps": 6,  # every env starts a second episode within one rollout
    "action_delay_steps": 1,
}


def ball_config(**overrides: Any) -> BallConfig:
    return BallConfig(**{**BALL, **overrides})


def distributed_ball_config(**overrides: Any) -> DistributedBallConfig:
    return DistributedBallConfig(**{**BALL, **overrides})
