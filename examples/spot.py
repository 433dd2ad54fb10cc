"""Spot following a velocity command, written as a sim-to-real task: Boston Dynamics Spot as MuJoCo Playground
ships it (`ksim/assets/spot/spot.xml`, Apache-2.0; MJCF position servos, an IMU site, foot sites and geoms,
contact sensors), with its visual meshes replaced by primitives.

The policy reads only what the robot has: the IMU's gyro and velocimeter sensors (by name, with noise), the
gravity direction in the IMU frame, joint positions around the home keyframe and joint velocities (noisy),
foot contacts, its last action, the command and a gait clock. The critic reads the same without noise and
what only the simulator knows: the base's true velocities and height, each foot's position, velocity and
contact force. The policy sets the servos' targets around the home pose. Rewards: tracking the command's
planar velocity and yaw rate, the feet (their sites, at the sole) following a trot clock, air time at
touchdown, and penalties on slipping feet in contact, thighs touching the ground, vertical and roll/pitch base
motion, tilt, joint limits, mechanical power, action changes, deviation from the home pose, not standing still
under a zero command, and a termination. An episode ends when the trunk touches the ground or tilts over
0.8 rad, or after 10 s.

    python -m examples.spot
    python -m examples.spot mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=spot.gif

docs/sim2real.md has its curve, gif and measured figures.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import xax

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionServoActuators
from ksim.commands import Command, VelocityCommand
from ksim.engine import load_mujoco_model
from ksim.resets import RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask

FEET = ("FL", "FR", "HL", "HR")  # sites at the sole for heights and speeds, geoms (spheres) for contacts
THIGHS = ("fl_thigh", "fr_thigh", "hl_thigh", "hr_thigh")
TROT = (0.0, 0.5, 0.5, 0.0)  # diagonal pairs (FL, HR) and (FR, HL) swing half a cycle apart
FOOT_RADIUS = 0.036  # the foot site's height when the foot stands on the floor


@dataclass
class SpotConfig(DistributedPPOConfig):
    max_forward_velocity: float = xax.field(1.0, help="Largest commanded forward speed, m/s.")
    gait_period_s: float = xax.field(0.6, help="Period of the trot clock, s.")
    action_scale: float = xax.field(0.25, help="Servo target offset (rad) per unit of action.")


class SpotTask(DistributedPPOTask[SpotConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return load_mujoco_model("spot/spot.xml")

    def get_command(self) -> Command | None:
        return VelocityCommand(
            forward=(0.0, self.config.max_forward_velocity), lateral=(-0.1, 0.1), yaw_rate=(-0.2, 0.2)
        )

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.Sensor(sensor="gyro", scale=0.25, noise=0.05),
            obs.Sensor(sensor="local_linvel", noise=0.1),
            obs.ProjectedGravity(noise=0.03),
            obs.JointPosition(offset="default", noise=0.02),
            obs.JointVelocity(scale=0.05, noise=0.05),
            obs.FeetContact(feet=FEET),
            obs.LastAction(),
            obs.Command(),
            obs.GaitPhase(period_s=self.config.gait_period_s),
        ]

    def get_critic_observations(self) -> Sequence[obs.Observation]:
        privileged = [
            obs.BaseLinearVelocity(),
            obs.BaseAngularVelocity(),
            obs.BaseHeight(),
            obs.FeetContactForce(feet=FEET),
            *(obs.BodyPosition(body=foot) for foot in FEET),
            *(obs.BodyLinearVelocity(body=foot) for foot in FEET),
        ]
        return [*self.get_observations(), *privileged]  # the critic's inputs are never noised

    def get_rewards(self) -> Sequence[rew.Reward]:
        period = self.config.gait_period_s
        return [
            rew.LinearVelocityTracking(scale=2.0, sigma=0.25),
            rew.AngularVelocityTracking(scale=0.8, sigma=0.25),
            rew.FootSwingTracking(
                scale=0.5, feet=FEET, offsets=TROT, period_s=period, swing_height=0.08, ground_height=FOOT_RADIUS
            ),
            rew.FeetAirTime(scale=0.5, feet=FEET, threshold_s=0.1, min_command=0.1),
            rew.FeetSlip(scale=-0.1, feet=FEET),
            rew.UndesiredContacts(scale=-2.0, bodies=THIGHS),
            rew.BaseVerticalVelocityPenalty(scale=-1.0),
            rew.BaseRollPitchRatePenalty(scale=-0.02),
            rew.TiltPenalty(scale=-5.0),
            rew.JointLimitPenalty(scale=-1.0, margin=0.05),
            rew.MechanicalPower(scale=-2e-5),
            rew.ActionRatePenalty(scale=-0.01),
            rew.JointPoseDeviation(scale=-0.2, pose="default"),
            rew.StandStill(scale=-0.2),
            rew.TerminationPenalty(scale=-10.0),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.IllegalContact(bodies=("trunk",)), term.BaseTilted(max_angle=0.8)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.1), RandomJointVelocities(scale=0.2)]

    def get_actuators(self) -> Actuators:
        return PositionServoActuators.from_model(self.engine.mj_model, action_scale=self.config.action_scale)


DEFAULT_CONFIG = SpotConfig(
    num_envs=128,
    batch_size=16,
    num_passes=5,
    rollout_length_frames=24,
    ctrl_dt=0.02,
    dt=0.004,
    episode_length_s=10.0,
    num_steps=600,
    learning_rate=3e-4,
    gamma=0.97,
    init_log_std=-0.5,
    entropy_coef=1e-3,
    actor_hidden=[128, 128],
    critic_hidden=[128, 128],
    log_every_n_steps=10,
    eval_every_n_steps=50,
    save_every_n_steps=100,
    robot_inputs_only=True,  # the actor reads only Spot's sensors: an export that needs a simulator is refused
)

if __name__ == "__main__":
    SpotTask.launch(DEFAULT_CONFIG)
