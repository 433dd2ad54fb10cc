"""K-Scale's K-Bot (36 kg, 20 joints; `ksim/assets/kbot/`, MIT) walking where a joystick tells it.

The motors run the real firmware's PD loop (kp, kd and torque limits from the robot's `metadata.json`) as MuJoCo
position servos, so a control step is one physics call. The actor reads only what the robot measures, with noise:
the IMU's gyro and orientation (`imu_site` sensors), joint encoders, its last action, the command and a gait
clock; one control step of action delay. The critic also reads the true base velocity and height and the feet's
touch sensors. Commands: forward -0.5..1.2 m/s, lateral -0.5..0.5 m/s, yaw rate -1..1 rad/s, or stand still (one
in ten). Floor friction, masses, centre of mass, armature, joint friction and gains are randomized per episode,
and the robot is pushed.

    python -m examples.kbot                  # preset=cpu: 256 envs, sized for this project's 2-core CPU
    python -m examples.kbot preset=gpu       # 2048 envs on one GPU, the same learner scaled by its rule
    python -m examples.kbot mode=eval load_from_ckpt_path=RUN/checkpoints/ckpt_latest.bin video_path=kbot.gif

docs/kbot.md has its curve, gif and measured figures; docs/kbot_experiments.md the variants tried.
"""

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import mujoco
import xax

from ksim import observations as obs
from ksim import randomization as rnd
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionServoActuators, as_position_servos, gains_from_metadata
from ksim.commands import Command, VelocityCommand
from ksim.config import accelerator_preset_line, preset_from_command_line, require_choice
from ksim.engine import ASSETS_DIR, load_mujoco_model
from ksim.events import Event, Push
from ksim.resets import RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask


@dataclass
class KBotConfig(DistributedPPOConfig):
    preset: str = xax.field("cpu", help="'cpu' or 'gpu': which preset the other settings start from.")
    gait_period_s: float = xax.field(0.6, help="Period of the walking clock (one step of each foot), s.")
    action_scale: float = xax.field(0.5, help="Joint target offset (rad) per unit of action.")


class KBotTask(DistributedPPOTask[KBotConfig]):
    """The walking recipe; another robot's task (examples/g1.py) subclasses it and names its own parts."""

    feet: ClassVar[tuple[str, ...]] = ("left_foot", "right_foot")  # sites at the soles; their bodies touch the floor
    sole_height: ClassVar[float] = 0.02  # a foot site's height when the foot stands on the floor, m
    imu_orientation: ClassVar[str] = "imu_site_quat"
    imu_gyro: ClassVar[str] = "imu_gyro"
    min_base_height: ClassVar[float] = 0.45  # m: lower is a fall

    def __init__(self, config: KBotConfig) -> None:
        super().__init__(config)
        cpu_steps = config.reference_num_envs * config.rollout_length_frames  # preset=cpu runs the reference envs
        if config.mode == "train" and (
            line := accelerator_preset_line(config.preset, self.env_steps_per_train_step, cpu_steps)
        ):
            print(line, flush=True)

    def validate_config(self) -> None:
        super().validate_config()
        require_choice(self.config, "preset", ("cpu", "gpu"))

    def get_mujoco_model(self) -> mujoco.MjModel:
        model = load_mujoco_model("kbot/kbot.xml")
        return as_position_servos(model, gains_from_metadata(model, ASSETS_DIR / "kbot" / "metadata.json"))

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.ProjectedGravity(sensor=self.imu_orientation, noise=0.05),
            obs.Sensor(sensor=self.imu_gyro, scale=0.25, noise=0.05),
            obs.JointPosition(offset="default", noise=0.02),
            # 10 deg/s, as K-Scale's own K-Bot task: legged_gym's 1.5 rad/s buries the legs' odometry
            obs.JointVelocity(scale=0.05, noise=0.05 * math.radians(10)),
            obs.LastAction(),
            obs.Command(),
            obs.GaitPhase(period_s=self.config.gait_period_s),
        ]

    def get_critic_observations(self) -> Sequence[obs.Observation]:
        return [
            *(replace(o, noise=0.0) for o in self.get_observations()),
            obs.BaseLinearVelocity(),
            obs.BaseHeight(),
            obs.Sensor(sensor="left_foot_touch", scale=0.005),  # N; computed with the step, unlike FeetContact
            obs.Sensor(sensor="right_foot_touch", scale=0.005),
        ]

    def get_command(self) -> Command | None:
        return VelocityCommand(forward=(-0.5, 1.2), lateral=(-0.5, 0.5), yaw_rate=(-1.0, 1.0), zero_probability=0.1)

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [
            rew.LinearVelocityTracking(scale=2.0, sigma=0.25),
            rew.LinearVelocityTracking(scale=1.0, sigma=0.05),  # a pull that does not fade near the command
            rew.AngularVelocityTracking(scale=1.5, sigma=0.5),
            rew.AngularVelocityTracking(scale=0.75, sigma=0.1),
            rew.StayAlive(scale=0.5),
            rew.Upright(scale=0.5),
            rew.FootSwingTracking(
                scale=1.0,
                feet=self.feet,
                offsets=(0.0, 0.5),  # the feet take turns
                period_s=self.config.gait_period_s,
                ground_height=self.sole_height,
                min_command=0.1,  # told to stand, it stands (stepping in place drifts)
            ),
            rew.FeetSlip(scale=-0.1, feet=self.feet, contact_height=self.sole_height + 0.01),
            rew.JointPoseDeviation(scale=-0.05, pose="default"),
            rew.BaseRollPitchRatePenalty(scale=-0.05),
            rew.ActionRatePenalty(scale=-0.005),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.BaseTooLow(min_height=self.min_base_height), term.BaseTilted(max_angle=0.8)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(scale=0.05), RandomJointVelocities(scale=0.1)]

    def get_randomizations(self) -> Sequence[rnd.Randomization]:
        return [
            rnd.FloorFriction(0.5, 1.25),
            rnd.BodyMass(0.9, 1.1),
            rnd.AddedBaseMass(-1.0, 2.0),
            rnd.CenterOfMassOffset(-0.02, 0.02),
            rnd.JointFrictionLoss(0.8, 1.2),  # the model's joints have friction loss and no damping
            rnd.JointArmature(0.8, 1.2),
            rnd.PositionGain(0.9, 1.1),
            rnd.VelocityGain(0.9, 1.1),
        ]

    def get_events(self) -> Sequence[Event]:
        return [Push(max_velocity=(0.3, 0.3, 0.0), interval_s=(5.0, 10.0))]

    def get_actuators(self) -> Actuators:
        return PositionServoActuators.from_model(self.engine.mj_model, self.config.action_scale)


DEFAULT_CONFIG = KBotConfig(
    num_envs=256,
    reference_num_envs=256,  # where this learner was tuned: more envs scale it (docs/training.md, "Adding envs")
    batch_size=64,
    num_passes=4,
    rollout_length_frames=24,
    ctrl_dt=0.02,
    dt=0.005,
    episode_length_s=10.0,
    action_delay_steps=1,
    num_steps=4000,
    learning_rate=1e-3,
    learning_rate_schedule="adaptive",
    desired_kl=0.02,  # twice rsl_rl's step per update: K-Bot learns by updates, not samples (docs/benchmarks.md)
    normalize_returns=True,
    init_log_std=-0.5,
    entropy_coef=1e-3,
    actor_hidden=[128, 128],
    critic_hidden=[128, 128],
    log_every_n_steps=10,
    eval_every_n_steps=50,
    eval_episodes=64,
    save_every_n_steps=100,
    robot_inputs_only=True,
)

# 8x the envs on one GPU: the learner's rule makes it 32 minibatches of 64 envs, a KL target 8^(3/4) and a clip
# 8^(3/8) times as large (docs/multi-device.md measures what that buys); 1200 train steps are 59M env steps.
GPU_CONFIG = replace(DEFAULT_CONFIG, preset="gpu", num_envs=2048, num_steps=1200)
PRESETS = {"cpu": DEFAULT_CONFIG, "gpu": GPU_CONFIG}

if __name__ == "__main__":
    KBotTask.launch(preset_from_command_line(PRESETS, sys.argv[1:]))
