"""Quadruped trotting forward: ksim's 12-joint, 13 kg quadruped (Go1/A1-sized; only its feet touch the floor).

The policy sets PD targets around the standing pose. Rewards: world-x speed near `target_velocity`, feet
following a trot clock (`GaitPhase` tells the policy the clock), staying upright, and small penalties on
foot slip, distance from the standing pose, torques and action changes. An episode ends when the trunk
drops below 0.15 m or tilts over 0.8 rad, or after 10 s. On a 2-core CPU

    python -m examples.quadruped                        # train: ~2 min, 1.2M env steps

passes an evaluation speed of 0.5 m/s after 0.3-0.6M env steps and ends near 1 m/s with no falls (3 seeds;
the same on 2 forced CPU devices). A video of the trained policy (with MUJOCO_GL=egl or osmesa):

    python -m examples.quadruped mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=quad.gif

`terrain=rough` trains on ksim's terrain grid (ksim.terrain, docs/terrain.md) with the terrain curriculum: 6
levels of flat, rough, sloped and stepped 4 m tiles, a height scan in the observation, a privileged critic
(the observations without noise, plus the base's height), foot heights and the base-height termination
measured against the terrain, and a constant forward velocity command (the curriculum compares the distance
walked with the commanded one). `terrain=rough` trains 1500 steps unless told otherwise (4.6M env steps, ~7 min
alone on a 2-core CPU) and ends falling in under 10% of the episodes at the middle level (3 seeds).
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import mujoco
import xax

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionActuators
from ksim.commands import Command, VelocityCommand
from ksim.config import ConfigError
from ksim.engine import load_mujoco_model
from ksim.resets import RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask
from ksim.terrain import TerrainCurriculum, TerrainGrid, load_mujoco_spec

FEET = ("FR_foot", "FL_foot", "RR_foot", "RL_foot")
TROT = (0.0, 0.5, 0.5, 0.0)  # diagonal pairs (FR, RL) and (FL, RR) swing half a cycle apart
KP, KD = 35.0, 0.8  # PD gains, N m / rad and N m s / rad
ACTION_SCALE = 0.3  # rad of PD target per unit of action


@dataclass
class QuadrupedConfig(DistributedPPOConfig):
    target_velocity: float = xax.field(1.0, help="Forward (world x) speed to reach, m/s.")
    gait_period_s: float = xax.field(0.5, help="Period of the trot clock, s.")
    terrain: str = xax.field("flat", help="'flat' (the model's floor) or 'rough' (terrain grid and curriculum).")


# The terrain for a 13 kg quadruped with 0.4 m legs: smaller tiles, steps and slopes than the 8 m defaults.
ROUGH = TerrainGrid(
    tile_size=4.0,
    num_levels=6,
    border=10.0,  # more than a 10 s episode walks at 1 m/s: no env walks off the ground
    platform_size=1.0,
    max_roughness=0.05,
    max_slope=0.35,
    max_step_height=0.1,
    step_width=0.3,
)


class QuadrupedTask(DistributedPPOTask[QuadrupedConfig]):
    def validate_config(self) -> None:
        super().validate_config()
        if self.config.terrain not in ("flat", "rough"):
            raise ConfigError(f"terrain={self.config.terrain!r} must be 'flat' or 'rough'")

    @property
    def rough(self) -> bool:
        return self.config.terrain == "rough"

    def get_mujoco_model(self) -> mujoco.MjModel | mujoco.MjSpec:
        return load_mujoco_spec("quadruped.xml") if self.rough else load_mujoco_model("quadruped.xml")

    def get_terrain(self) -> TerrainGrid | None:
        return ROUGH if self.rough else None

    def get_terrain_curriculum(self) -> TerrainCurriculum | None:
        return TerrainCurriculum() if self.rough else None

    def get_command(self) -> Command | None:
        if not self.rough:
            return None
        forward = (self.config.target_velocity, self.config.target_velocity)
        return VelocityCommand(forward=forward, lateral=(0.0, 0.0), yaw_rate=(0.0, 0.0), zero_probability=0.0)

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.JointPosition(offset="default"),
            obs.JointVelocity(scale=0.05),
            obs.ProjectedGravity(),
            obs.BaseLinearVelocity(),
            obs.BaseAngularVelocity(),
            obs.LastAction(),
            obs.GaitPhase(period_s=self.config.gait_period_s),
            *([self.height_scan()] if self.terrain is not None else []),
        ]

    def height_scan(self) -> obs.HeightScan:
        # 11 x 7 points over 1.0 x 0.6 m: legged_gym's 17 x 11 over 1.6 x 1.0 m (sized for ANYmal), with 0.02 m
        # of noise, swamped this small robot's 128-env training (still falling at level 0 after 4.6M env steps).
        assert self.terrain is not None
        return obs.HeightScan(self.terrain, size=(1.0, 0.6), noise=0.01)

    def get_critic_observations(self) -> Sequence[obs.Observation] | None:
        if not self.rough:
            return None
        return [*self.get_observations(), obs.BaseHeight()]  # privileged: never noised, plus the base's height

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [
            rew.ForwardVelocity(scale=2.0, target=self.config.target_velocity, sigma=0.5),
            rew.FootSwingTracking(
                scale=0.5, feet=FEET, offsets=TROT, period_s=self.config.gait_period_s, terrain=self.terrain
            ),
            rew.Upright(scale=0.5),
            rew.FeetSlip(scale=-0.1, feet=FEET, contact_height=0.03, terrain=self.terrain),
            rew.JointPoseDeviation(scale=-0.1, pose="default"),
            rew.ControlCost(scale=-2e-4),
            rew.ActionRatePenalty(scale=-0.01),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.BaseTooLow(min_height=0.15, terrain=self.terrain), term.BaseTilted(max_angle=0.8)]

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

# The rough task needs more steps than the flat one: its curriculum climbs 3 levels in about 1M env steps.
ROUGH_CONFIG = replace(DEFAULT_CONFIG, terrain="rough", num_steps=1500)


def terrain_config(argv: Sequence[str]) -> QuadrupedConfig:
    """The rough config where the command line says terrain=rough (its other settings override it as usual)."""
    names = [arg.split("=", 1)[1] for arg in argv if arg.startswith("terrain=")]
    return ROUGH_CONFIG if names and names[-1] == "rough" else DEFAULT_CONFIG


if __name__ == "__main__":
    QuadrupedTask.launch(terrain_config(sys.argv[1:]))
