"""Planar hopper: a one-legged robot whose root is two slides and a hinge learns to hop forward.

Rewards: +1 per control step alive, the torso's forward speed (m/s) and a small control cost. An episode ends
when the torso drops below 0.8 m or pitches over 0.2 rad, or after 10 s (500 steps): standing still returns at
most 500, and a return over 1000 means more than 10 m forward. On a 2-core CPU

    python -m examples.hopper                                       # train: ~50 s, 2M env steps

passes an evaluation return of 1000 after 1.1-1.5M env steps (about 30 s) and ends near 1550 (~2 m/s).
The same envs on 2 forced CPU devices, and a video of the trained policy (with MUJOCO_GL=egl or osmesa):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m examples.hopper
    python -m examples.hopper mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=hopper.gif
"""

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, TorqueActuators
from ksim.engine import load_mujoco_model
from ksim.resets import RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask


@dataclass
class HopperConfig(DistributedPPOConfig):
    pass


class HopperTask(DistributedPPOTask[HopperConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return load_mujoco_model("hopper.xml")  # torso is the base body; rootx, rootz, rooty its root joints

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.BaseHeight(),
            obs.ProjectedGravity(),
            obs.JointPosition(),  # hip, knee, ankle: the joints that are not the base's
            obs.BaseLinearVelocity(world=True, clip=10.0),
            obs.BaseAngularVelocity(scale=0.1, clip=10.0),
            obs.JointVelocity(scale=0.1, clip=10.0),
        ]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [rew.StayAlive(scale=1.0), rew.ForwardProgress(scale=1.0), rew.ControlCost(scale=-1e-3)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.HealthyRange(min_height=0.8, max_pitch=0.2)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.005), RandomJointVelocities(scale=0.005)]

    def get_actuators(self) -> Actuators:
        return TorqueActuators.from_model(self.engine.mj_model)


# 4 minibatches of 32 envs, 4 passes, at a higher learning rate: as sample-efficient over 5 seeds as the 16 x 8
# envs and 10 passes chosen when MJX's physics was what cost, with a third of the update's time (docs/training.md).
DEFAULT_CONFIG = HopperConfig(
    num_envs=128,
    batch_size=32,
    num_passes=4,
    rollout_length_frames=32,
    ctrl_dt=0.02,
    dt=0.005,
    episode_length_s=10.0,
    num_steps=500,
    learning_rate=1e-3,
    gamma=0.99,
    init_log_std=-0.5,
    entropy_coef=1e-3,
    actor_hidden=[64, 64],
    critic_hidden=[64, 64],
    log_every_n_steps=10,
    eval_every_n_steps=25,
    save_every_n_steps=100,
)

if __name__ == "__main__":
    HopperTask.launch(DEFAULT_CONFIG)
