"""Small tasks and configs shared by the tests (tiny shapes keep CPU compiles short)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import mujoco

from examples.cartpole import DEFAULT_CONFIG, CartpoleConfig, CartpoleTask
from ksim import observations as obs
from ksim import randomization as rnd
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, PositionActuators, PositionServoActuators, TorqueActuators
from ksim.commands import Command, HeldCommand, VelocityCommand
from ksim.engine import StepContext
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


# The memory task: a target in [-1, 1] is shown for the first two control steps only (then the observation
# reads 0), and every step pays max(0, 1 - 2 |action - target|). Nothing else observed depends on the target,
# so a memoryless policy cannot beat a constant action after the second step (1/4 per step on average).
MEMORY_XML = """
<mujoco>
  <option timestep="0.05" iterations="1" ls_iterations="1" gravity="0 0 0"><flag contact="disable"/></option>
  <worldbody>
    <body name="cart"><joint name="x" type="slide" axis="1 0 0" damping="1"/><geom size="0.1" mass="1"/></body>
  </worldbody>
  <actuator><motor name="x" joint="x" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>"""


@dataclasses.dataclass(frozen=True)
class Target(HeldCommand):
    """A target in [-1, 1], drawn at the episode's start and kept (resample_s beyond any episode)."""

    resample_s: tuple[float, float] = (1e6, 1e6)
    size: ClassVar[int] = 1

    def sample(self, rng: jax.Array) -> jax.Array:
        return jax.random.uniform(rng, (1,), minval=-1.0, maxval=1.0)


@dataclasses.dataclass(frozen=True)
class TargetAtFirst(obs.Observation):
    """The target during the episode's first two control steps, 0 afterwards."""

    command_size: ClassVar[int] = 1

    def observe(self, ctx: StepContext) -> jax.Array:
        return jnp.where(ctx.data.time < 1.5 * ctx.ctrl_dt, ctx.command[:1], 0.0)

    robot_input = obs.simulator_only  # the caller supplies it (docs/policies.md's snippet reads it as a sensor)


@dataclasses.dataclass(frozen=True)
class MatchTarget(rew.Reward):
    command_size: ClassVar[int] = 1

    def value(self, ctx: StepContext) -> jax.Array:
        return jnp.maximum(0.0, 1.0 - 2.0 * jnp.abs(jnp.clip(ctx.action[0], -1.0, 1.0) - ctx.command[0]))


@dataclasses.dataclass
class MemoryConfig(PPOConfig):
    noise: float = 0.0  # on the policy's observation
    privileged_critic: bool = False  # the critic sees the target all episode long, unnoised


class MemoryTask(PPOTask[MemoryConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(MEMORY_XML)

    def get_observations(self) -> Sequence[obs.Observation]:
        return [TargetAtFirst(noise=self.config.noise)]

    def get_critic_observations(self) -> Sequence[obs.Observation] | None:
        return [TargetAtFirst(), obs.Command()] if self.config.privileged_critic else None

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [MatchTarget(scale=1.0)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return []

    def get_command(self) -> Command | None:
        return Target()

    def get_actuators(self) -> Actuators:
        return TorqueActuators.from_model(self.engine.mj_model)


@dataclasses.dataclass
class DistributedMemoryConfig(MemoryConfig, DistributedPPOConfig):
    pass


class DistributedMemoryTask(MemoryTask, DistributedPPOTask[DistributedMemoryConfig]):
    pass


MEMORY_EPISODE_STEPS = 12
MEMORY = {
    "num_envs": 64,
    "batch_size": 16,
    "num_passes": 4,
    "rollout_length_frames": MEMORY_EPISODE_STEPS,
    "ctrl_dt": 0.05,
    "dt": 0.05,
    "episode_length_s": None,
    "episode_length_steps": MEMORY_EPISODE_STEPS,
    "num_steps": 60,
    "learning_rate": 3e-3,
    "gamma": 0.9,
    "entropy_coef": 0.0,
    "init_log_std": -1.0,
    "actor_hidden": [32],
    "critic_hidden": [32],
    "save_every_n_steps": 0,
    "eval_every_n_steps": 0,
    "log_every_n_steps": 10,
    "eval_episodes": 64,
}


def memory_config(**overrides: Any) -> MemoryConfig:
    return MemoryConfig(**{**MEMORY, **overrides})


def distributed_memory_config(**overrides: Any) -> DistributedMemoryConfig:
    return DistributedMemoryConfig(**{**MEMORY, **overrides})


def onnxruntime_snippet(doc: str) -> str:
    """The python block of docs/`doc` that imports onnxruntime: an exported policy run without ksim or JAX."""
    text = (Path(__file__).resolve().parents[1] / "docs" / doc).read_text()
    (snippet,) = [
        block for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "onnxruntime as ort" in block
    ]
    return snippet


# Makes JAX, jaxlib, Flax and Optax absent in a fresh interpreter, as on a robot's computer.
BLOCK_JAX = """
import importlib.abc, sys
class NoJax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax"):
            raise ImportError(f"{name} is not installed on this robot")
sys.meta_path.insert(0, NoJax())
"""


def docs_observation() -> type:
    """docs/tasks.md's worked observation (the code block between its markers), run as written there."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    begin, end = "<!-- clipped_gyro.py begin -->\n```python\n", "```\n<!-- clipped_gyro.py end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "docs/tasks.md's markers must appear once each"
    module = sys.modules.setdefault("docs_tasks_example", types.ModuleType("docs_tasks_example"))
    if not hasattr(module, "ClippedGyro"):  # once per process: one class, as an imported module's would be
        code = compile(text.split(begin)[1].split(end)[0], "docs/tasks.md", "exec", dont_inherit=True)
        exec(code, module.__dict__)
    return module.ClippedGyro


ROOT = Path(__file__).resolve().parents[1]


def run_example(
    module: str, *args: str, devices: int, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    env |= {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_COMPILATION_CACHE_DIR": str(ROOT / ".jax_cache"),
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
