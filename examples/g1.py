"""Unitree's G1 (29 dof, 33 kg) walking where a joystick tells it: K-Bot's recipe (examples/kbot.py) on the G1.

What changes from K-Bot is the robot: the G1's model with its motors' armature, gains and torque limits derived from
the motors' data (examples/g1_robot.py), its pelvis IMU, its sole sites and heights; the critic reads the feet's
contact forces from the simulator (the G1 has no touch sensors); one reward more, the yaw-rate error as a penalty,
without which the G1 takes twice the train steps to learn to turn. Commands, randomization and learner are K-Bot's.

    python -m examples.g1                    # preset=cpu: 256 envs
    python -m examples.g1 preset=gpu         # 2048 envs, the learner scaled by its rule
    python -m examples.g1 mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=g1.gif
"""

import sys
from collections.abc import Sequence
from dataclasses import replace

import mujoco

from ksim import observations as obs
from ksim import randomization as rnd
from ksim import rewards as rew
from ksim.config import preset_from_command_line

from .g1_robot import FEET_SITES, g1_model
from .kbot import DEFAULT_CONFIG as KBOT_CONFIG
from .kbot import KBotConfig, KBotTask

FEET_BODIES = ("left_ankle_roll_link", "right_ankle_roll_link")


class G1Task(KBotTask):
    feet = FEET_SITES
    sole_height = 0.0  # the sole sites sit at the capsules' lowest point
    imu_orientation = "pelvis_orientation"
    imu_gyro = "pelvis_gyro"
    min_base_height = 0.5  # the pelvis stands at 0.78 m

    def get_mujoco_model(self) -> mujoco.MjModel:
        return g1_model()

    def get_critic_observations(self) -> Sequence[obs.Observation]:
        return [
            *(replace(o, noise=0.0) for o in self.get_observations()),
            obs.BaseLinearVelocity(),
            obs.BaseHeight(),
            obs.FeetContactForce(feet=FEET_BODIES, scale=0.005),
        ]

    def get_rewards(self) -> Sequence[rew.Reward]:
        # the yaw-rate error itself, beside K-Bot's exp terms: its pull does not fade when the G1 turns at a third
        # of the command, and it counts the pelvis's twist with each step (docs/kbot.md)
        return [*super().get_rewards(), rew.YawRateError(scale=-1.0)]

    def get_randomizations(self) -> Sequence[rnd.Randomization]:
        # the G1's joints have no friction loss to scale
        return [r for r in super().get_randomizations() if not isinstance(r, rnd.JointFrictionLoss)]


DEFAULT_CONFIG: KBotConfig = replace(KBOT_CONFIG)
GPU_CONFIG = replace(DEFAULT_CONFIG, preset="gpu", num_envs=2048, num_steps=1200)
PRESETS = {"cpu": DEFAULT_CONFIG, "gpu": GPU_CONFIG}

if __name__ == "__main__":
    G1Task.launch(preset_from_command_line(PRESETS, sys.argv[1:]))
