"""Humanoid walking on ksim's MJX humanoid (21 PD-controlled joints; only the feet touch the floor).

    python -m examples.walking                                          # GPU-sized defaults
    python -m examples.walking num_envs=16 batch_size=8 rollout_length_frames=16 \
        'actor_hidden=[128,128]' 'critic_hidden=[128,128]'              # CPU-sized
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
from ksim.task.ppo import PPOConfig, PPOTask


@dataclass
class WalkingConfig(PPOConfig):
    target_velocity: float = xax.field(1.0, help="Forward (world x) velocity to track, m/s.")


class WalkingTask(PPOTask[WalkingConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return load_mujoco_model("humanoid.xml")

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.JointPosition(),
            obs.JointVelocity(),
            obs.ProjectedGravity(),
            obs.BaseHeight(),
            obs.BaseLinearVelocity(),
            obs.BaseAngularVelocity(),
            obs.LastAction(),
        ]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [
            rew.StayAlive(scale=0.5),
            rew.Upright(scale=0.2),
            rew.ForwardVelocity(scale=1.0, target=self.config.target_velocity),
            rew.ActionRatePenalty(scale=-0.01),
            rew.ControlCost(scale=-0.002),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.BaseTooLow(min_height=0.8), term.BaseTilted(max_angle=1.0)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.05), RandomJointVelocities(scale=0.1)]

    def get_actuators(self) -> Actuators:
        gear = self.engine.mj_model.actuator_gear[:, 0]
        return PositionActuators.from_model(
            self.engine.mj_model, kp=3.0 * gear, kd=0.02 * gear, default_qpos=self.engine.default_qpos
        )


# Sized for one GPU; see the module docstring (and README) for CPU-sized settings.
DEFAULT_CONFIG = WalkingConfig(
    num_envs=2048,
    batch_size=256,
    num_passes=4,
    rollout_length_frames=32,
    ctrl_dt=0.02,
    dt=0.005,
    episode_length_s=20.0,
    num_steps=2000,
    learning_rate=3e-4,
    save_every_n_steps=100,
    log_every_n_steps=5,
)

if __name__ == "__main__":
    WalkingTask.launch(DEFAULT_CONFIG)
