"""Quadruped trotting forward: ksim's 12-joint, 13 kg quadruped (Go1/A1-sized; only its feet touch the floor).

The policy sets PD targets around the standing pose. Rewards: world-x speed near `target_velocity`, feet
following a trot clock (`GaitPhase` tells the policy the clock), staying upright, and small penalties on
foot slip, distance from the standing pose, torques and action changes. An episode ends when the trunk
drops below 0.15 m or tilts over 0.8 rad, or after 10 s. On a 2-core CPU

    python -m examples.quadruped                        # train: ~4 min, 1.2M env steps

passes an evaluation speed of 0.5 m/s after 0.3-0.6M env steps and ends near 1 m/s with no falls (3 seeds;
the same on 2 forced CPU devices). A video of the trained policy (with MUJOCO_GL=egl or osmesa):

    python -m examples.quadruped mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=quad.gif
"""

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import xax

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionActuators
from ksim.engine import load_mujoco_model
from ksim.resets import RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask

FEET = ("FR_foot", "FL_foot", "RR_foot", "RL_foot")
TROT = (0.0, 0.5, 0.5, 0.0)  # diagonal pairs (FR, RL) and (FL, RR) swing half a cycle apart
KP, KD = 35.0, 0.8  # PD gains, N m / rad and N m s / rad
ACTION_SCALE = 0.3  # rad of PD target per unit of action


@dataclass
class QuadrupedConfig(DistributedPPOConfig):
    target_velocity: float = xax.field(1.0, help="Forward (world x) speed to reach, m/s.")
    gait_period_s: float = xax.field(0.5, help="Period of the trot clock, s.")


class QuadrupedTask(DistributedPPOTask[QuadrupedConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return load_mujoco_model("quadruped.xml")

    @property
    def home_pose(self) -> tuple[float, ...]:
        return tuple(float(q) for q in self.engine.default_qpos[7:])  # after the free joint's 7 values

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.JointPosition(offset=self.home_pose),
            obs.JointVelocity(scale=0.05),
            obs.ProjectedGravity(),
            obs.BaseLinearVelocity(),
            obs.BaseAngularVelocity(),
            obs.LastAction(),
            obs.GaitPhase(period_s=self.config.gait_period_s),
        ]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [
            rew.ForwardVelocity(scale=2.0, target=self.config.target_velocity, sigma=0.5),
            rew.FootSwingTracking(scale=0.5, feet=FEET, offsets=TROT, period_s=self.config.gait_period_s),
            rew.Upright(scale=0.5),
            rew.FeetSlip(scale=-0.1, feet=FEET, contact_height=0.03),
            rew.JointPoseDeviation(scale=-0.1, pose=self.home_pose),
            rew.ControlCost(scale=-2e-4),
            rew.ActionRatePenalty(scale=-0.01),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.BaseTooLow(min_height=0.15), term.BaseTilted(max_angle=0.8)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.1), RandomJointVelocities(scale=0.2)]

    def get_actuators(self) -> Actuators:
        return PositionActuators.from_model(
            self.engine.mj_model, kp=KP, kd=KD, default_qpos=self.engine.default_qpos, action_scale=ACTION_SCALE
        )


DEFAULT_CONFIG = QuadrupedConfig(
    num_envs=128,
    batch_size=16,
    num_passes=5,
    rollout_length_frames=24,
    ctrl_dt=0.02,
    dt=0.005,
    episode_length_s=10.0,
    num_steps=400,
    learning_rate=3e-4,
    gamma=0.97,
    init_log_std=-0.5,
    entropy_coef=1e-3,
    actor_hidden=[128, 128],
    critic_hidden=[128, 128],
    log_every_n_steps=10,
    eval_every_n_steps=50,
    save_every_n_steps=100,
)

if __name__ == "__main__":
    QuadrupedTask.launch(DEFAULT_CONFIG)
