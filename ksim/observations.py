"""Observations: each a small class with one method from a `StepContext` to a vector.

Joints are the robot joints unless named (`joints=("knee", ...)`, root joints may be named too): every joint
but the root joints, which are free joints and the base body's unactuated joints (ksim.engine), so actuated
joints are always observed; bodies are named. `bind(layout)` refuses names the model lacks when the task is built
and resolves them once (ksim.binding).

Every observation takes `noise=` (keyword only): the scale of the noise added to it during training
rollouts, Gaussian (standard deviation) or uniform (half-width, `noise_type="uniform"`).

An observation class is its one definition: `observe(ctx)` is its value in training, `robot_input(size, robot)`
what a robot reads for it and how that reading becomes the value (ksim.policy_spec's vocabulary, which
ksim.runtime computes without JAX, and ksim.sim2sim's readings come from one table of MuJoCo sources), or
`simulator_only` where only a simulator knows it, and `mirror(context)` its left-right mirror image for the
symmetry loss (ksim.mirror). `tests/test_runtime.py` checks every class here: its robot-side form gives its
training value on the same states, or it is declared simulator-only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.binding import resolved, undefined, with_resolved
from ksim.commands import VelocityCommand
from ksim.config import ConfigError
from ksim.engine import ModelLayout, Point, StepContext, rotate, rotate_inverse
from ksim.mirror import AXIAL, POLAR, POSE_TOLERANCE, Mirror, MirrorContext
from ksim.policy_spec import (
    BASE_ANGULAR_VELOCITY,
    BASE_HEIGHT,
    BASE_LINEAR_VELOCITY,
    BASE_LINEAR_VELOCITY_WORLD,
    BASE_ORIENTATION,
    COMMAND,
    FOOT_CONTACTS,
    GAIT_PHASE,
    INPUT_PREFIX,
    JOINT_POSITIONS,
    JOINT_VELOCITIES,
    LAST_ACTION,
    PROJECTED_GRAVITY,
    ROBOT,
    RUNTIME,
    SENSOR_PREFIX,
    SIMULATOR,
    PolicyInput,
)
from ksim.terrain import Terrain

Array = jax.Array


NOISE_TYPES = ("gaussian", "uniform")
DEFAULT_POSE = "default"  # JointPosition(offset=...) and JointPoseDeviation(pose=...): the model's default pose


@dataclass(frozen=True)
class RobotContext:
    """What an observation's robot-side form may need: the model's layout and the joints whose encoders the
    joint_positions and joint_velocities readings list, in that order."""

    layout: ModelLayout
    encoder_joints: tuple[int, ...]


def simulator_only(observation: Observation, size: int, robot: RobotContext) -> PolicyInput:
    """`robot_input` of an observation only a simulator knows: the runtime's caller supplies its values as is."""
    return PolicyInput(observation.name, size, INPUT_PREFIX + observation.name, size, SIMULATOR)


@dataclass(frozen=True)
class Observation(ABC):
    """One named piece of the policy's input: its value in training (`observe`), on a robot (`robot_input`)
    and mirrored (`mirror`)."""

    noise: float = field(default=0.0, kw_only=True)
    noise_type: str = field(default="gaussian", kw_only=True)

    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, layout: ModelLayout) -> Self:
        """This observation with its names resolved; ConfigError if it cannot apply to the model."""
        return self

    @abstractmethod
    def observe(self, ctx: StepContext) -> Array: ...

    @undefined
    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        """This observation as a robot computes it: the reading that feeds it and the transform that makes it
        this value (ksim.policy_spec); `robot_input = simulator_only` where only a simulator knows it."""
        cls = type(self).__name__
        raise ConfigError(
            f"mode='export': {cls} does not say what a robot reads for it: define {cls}.robot_input(size, robot) "
            "(ksim.policy_spec's readings and transforms), or set robot_input = ksim.observations.simulator_only"
        )

    @undefined
    def mirror(self, context: MirrorContext) -> Mirror:
        """The mirror of this observation's values across the robot's x-z plane (symmetry_coef > 0)."""
        raise ConfigError(
            f"symmetry_coef > 0: observation {self.name} has no mirror image: define "
            f"{type(self).__name__}.mirror(context) (ksim.mirror has the pieces)"
        )


def _clip(values: Array, clip: float | None) -> Array:
    return values if clip is None else jnp.clip(values, -clip, clip)


@dataclass(frozen=True)
class JointPosition(Observation):
    """Joint positions (the robot joints, or the named ones), relative to `offset`: values, or "default" for
    the model's default pose (its first keyframe, or qpos0).

    The robot joints include the actuated joints of the base body: a fixed-base robot's first joint (a cart's
    slider, an arm's shoulder) is observed. A model without robot joints is refused when the task is built.
    """

    offset: tuple[float, ...] | str | None = None
    joints: tuple[str, ...] | None = None
    joint_ids: tuple[int, ...] = resolved()
    origin: np.ndarray = resolved()  # what is subtracted: the offset, the default pose, or zeros

    def bind(self, layout: ModelLayout) -> Self:
        joints = layout.joints(self.joints, f"{self.name}.joints")
        size = len(layout.qpos_indices(joints))
        if isinstance(self.offset, str) and self.offset != DEFAULT_POSE:
            raise ConfigError(f"{self.name}.offset={self.offset!r}: give values or {DEFAULT_POSE!r}")
        if isinstance(self.offset, tuple) and len(self.offset) != size:
            raise ConfigError(f"{self.name}.offset has {len(self.offset)} values; its joints have {size}")
        if self.offset == DEFAULT_POSE:
            origin = layout.default_pos_of(joints)
        else:
            origin = np.zeros(size, np.float32) if self.offset is None else np.asarray(self.offset, np.float32)
        return with_resolved(self, joint_ids=joints, origin=origin)

    def observe(self, ctx: StepContext) -> Array:
        return ctx.joint_pos_of(self.joint_ids) - jnp.asarray(self.origin)

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        offset = [float(v) for v in np.asarray(self.origin, np.float32)]
        return _encoder_input(self, size, robot, JOINT_POSITIONS, offset=offset)

    def mirror(self, context: MirrorContext) -> Mirror:
        mirror = context.geometry.joint_mirror(self.joint_ids, f"{self.name}.joints")
        if np.abs(mirror(self.origin) - self.origin).max(initial=0.0) > POSE_TOLERANCE:
            raise ConfigError(f"{self.name}.offset is not its own mirror image")
        return mirror


@dataclass(frozen=True)
class JointVelocity(Observation):
    """Joint velocities (the robot joints, or the named ones), times `scale`, optionally clipped to ±`clip`."""

    scale: float = 0.1
    joints: tuple[str, ...] | None = None
    clip: float | None = None
    joint_ids: tuple[int, ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, joint_ids=layout.joints(self.joints, f"{self.name}.joints"))

    def observe(self, ctx: StepContext) -> Array:
        return _clip(ctx.joint_vel_of(self.joint_ids) * self.scale, self.clip)

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return _encoder_input(self, size, robot, JOINT_VELOCITIES, scale=self.scale, clip=self.clip)

    def mirror(self, context: MirrorContext) -> Mirror:
        return context.geometry.joint_mirror(self.joint_ids, f"{self.name}.joints")


def _encoder_input(
    observation: JointPosition | JointVelocity, size: int, robot: RobotContext, reading: str, **transform: Any
) -> PolicyInput:
    """A joint observation from the encoders' reading; simulator-only where a joint has no encoder (a ball or
    free joint)."""
    joints = robot.encoder_joints
    if any(j not in joints for j in observation.joint_ids):
        return simulator_only(observation, size, robot)
    indices = [joints.index(j) for j in observation.joint_ids]
    return PolicyInput(observation.name, size, reading, len(joints), ROBOT, indices=indices, **transform)


@dataclass(frozen=True)
class GeneralizedPosition(Observation):
    """The model's whole `qpos` but its first `skip` values (Gymnasium's MuJoCo tasks leave out the root's x, or
    its x and y, so that the policy does not see where it is)."""

    skip: int = 0

    def bind(self, layout: ModelLayout) -> Self:
        size = sum(len(coordinates) for coordinates in layout.joint_qpos)
        if not 0 <= self.skip < size:
            raise ConfigError(f"{self.name}.skip={self.skip} must be >= 0 and below the model's {size} qpos values")
        return self

    def observe(self, ctx: StepContext) -> Array:
        return ctx.data.qpos[self.skip :]

    robot_input = simulator_only


@dataclass(frozen=True)
class _BaseObservation(Observation):
    def bind(self, layout: ModelLayout) -> Self:
        layout.require_moving_base(self.name)
        return self


@dataclass(frozen=True)
class ProjectedGravity(Observation):
    """Gravity direction in the base frame (base orientation without yaw), or with `sensor=` (a framequat
    sensor, e.g. an IMU site's) in that sensor's frame, as a robot's IMU gives it."""

    sensor: str | None = None
    span: tuple[int, int] = resolved()  # the framequat sensor's (first index in sensordata, dimension)

    def bind(self, layout: ModelLayout) -> Self:
        if self.sensor is None:
            layout.require_moving_base(self.name)
            return with_resolved(self, span=(0, 0))
        span = layout.sensor(self.sensor, f"{self.name}.sensor")
        if span[1] != 4:
            raise ConfigError(f"{self.name}.sensor={self.sensor!r} has {span[1]} values; a framequat has 4")
        return with_resolved(self, span=span)

    def observe(self, ctx: StepContext) -> Array:
        if self.sensor is None:
            return ctx.projected_gravity
        return rotate_inverse(ctx.sensor_at(self.span), jnp.array([0.0, 0.0, -1.0]))

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        reading = BASE_ORIENTATION if self.sensor is None else SENSOR_PREFIX + self.sensor
        return PolicyInput(self.name, size, reading, 4, ROBOT, transform=PROJECTED_GRAVITY)

    def mirror(self, context: MirrorContext) -> Mirror:
        if self.sensor is None:
            return Mirror.signs(*POLAR)
        model = context.geometry.mj_model
        sensor = context.geometry.layout.sensor_names.index(self.sensor)
        if model.sensor_objtype[sensor] != mujoco.mjtObj.mjOBJ_SITE:
            raise ConfigError(f"{self.name}.sensor={self.sensor!r}: symmetry needs a site's framequat")
        site = int(model.sensor_objid[sensor])
        return context.geometry.site_frame_mirror(site, False, f"{self.name}.sensor", on_plane=False)


@dataclass(frozen=True)
class BaseOrientation(_BaseObservation):
    """Base quaternion (w, x, y, z) in the world frame."""

    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_quat

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, BASE_ORIENTATION, 4, ROBOT)


@dataclass(frozen=True)
class BaseHeight(_BaseObservation):
    def observe(self, ctx: StepContext) -> Array:
        return ctx.base_pos[2:3]

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, BASE_HEIGHT, size, SIMULATOR)  # sim-to-sim reads it from the model

    def mirror(self, context: MirrorContext) -> Mirror:
        return Mirror.signs(1.0)


@dataclass(frozen=True)
class BaseLinearVelocity(_BaseObservation):
    """Base linear velocity in the base frame (world frame with `world=True`), optionally clipped."""

    scale: float = 1.0
    world: bool = False
    clip: float | None = None

    def observe(self, ctx: StepContext) -> Array:
        velocity = ctx.base_lin_vel_world if self.world else ctx.base_lin_vel
        return _clip(velocity * self.scale, self.clip)

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        reading = BASE_LINEAR_VELOCITY_WORLD if self.world else BASE_LINEAR_VELOCITY
        return PolicyInput(self.name, size, reading, 3, SIMULATOR, scale=self.scale, clip=self.clip)

    def mirror(self, context: MirrorContext) -> Mirror:
        if self.world:
            raise ConfigError(f"{self.name}(world=True): a world-frame velocity has no fixed mirror image")
        return Mirror.signs(*POLAR)


@dataclass(frozen=True)
class BaseAngularVelocity(_BaseObservation):
    """Base angular velocity in the base frame, times `scale`, optionally clipped."""

    scale: float = 0.25
    clip: float | None = None

    def observe(self, ctx: StepContext) -> Array:
        return _clip(ctx.base_ang_vel * self.scale, self.clip)

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, BASE_ANGULAR_VELOCITY, 3, ROBOT, scale=self.scale, clip=self.clip)

    def mirror(self, context: MirrorContext) -> Mirror:
        return Mirror.signs(*AXIAL)


@dataclass(frozen=True)
class BodyPosition(Observation):
    """World position of a named site, geom or body (looked up in that order) relative to the base's (3 values)."""

    body: str
    point: Point = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, point=layout.point(self.body, f"{self.name}.body"))

    def observe(self, ctx: StepContext) -> Array:
        return ctx.point_pos(self.point) - ctx.base_pos

    robot_input = simulator_only


@dataclass(frozen=True)
class BodyLinearVelocity(Observation):
    """World-frame linear velocity of a named site, geom or body frame, times `scale`, optionally clipped."""

    body: str
    scale: float = 1.0
    clip: float | None = None
    point: Point = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, point=layout.point(self.body, f"{self.name}.body"))

    def observe(self, ctx: StepContext) -> Array:
        return _clip(ctx.point_lin_vel_world(self.point) * self.scale, self.clip)

    robot_input = simulator_only


@dataclass(frozen=True)
class Sensor(Observation):
    """An MJCF sensor's values (its full dimension) as MuJoCo computes them, times `scale`."""

    sensor: str
    scale: float = 1.0
    span: tuple[int, int] = resolved()  # (first index in sensordata, dimension)

    @property
    def name(self) -> str:
        return f"Sensor[{self.sensor}]"  # policy.json tells the robot which reading feeds this input

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, span=layout.sensor(self.sensor, "Sensor.sensor"))

    def observe(self, ctx: StepContext) -> Array:
        return ctx.sensor_at(self.span) * self.scale

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, SENSOR_PREFIX + self.sensor, size, ROBOT, scale=self.scale)

    def mirror(self, context: MirrorContext) -> Mirror:
        model = context.geometry.mj_model
        sensor = context.geometry.layout.sensor_names.index(self.sensor)
        kind = mujoco.mjtSensor(int(model.sensor_type[sensor]))
        sensors = mujoco.mjtSensor
        vectors = (sensors.mjSENS_GYRO, sensors.mjSENS_ACCELEROMETER, sensors.mjSENS_VELOCIMETER)
        if kind not in vectors:
            raise ConfigError(
                f"{self.name}: a {kind.name} sensor has no mirror image here (gyro, accelerometer and velocimeter have)"
            )
        gyro = kind == sensors.mjSENS_GYRO  # angular velocity: an axial vector, the same anywhere on the body
        site = int(model.sensor_objid[sensor])
        return context.geometry.site_frame_mirror(site, gyro, self.name, on_plane=not gyro)


@dataclass(frozen=True)
class FeetContact(Observation):
    """Per foot, 1 when it touches anything outside the robot (from the simulator's contacts), else 0.

    A foot is a geom, or a body and its colliding geoms.
    """

    feet: tuple[str, ...] = ()

    foot_geoms: tuple[tuple[int, ...], ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, foot_geoms=feet_geoms(layout, self.feet, f"{self.name}.feet"))

    def observe(self, ctx: StepContext) -> Array:
        return jnp.stack([ctx.in_contact(geoms) for geoms in self.foot_geoms]).astype(jnp.float32)

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, FOOT_CONTACTS, size, ROBOT)  # the feet named in policy.json

    def mirror(self, context: MirrorContext) -> Mirror:
        return context.geometry.feet_mirror(self.feet, self.foot_geoms, f"{self.name}.feet")


@dataclass(frozen=True)
class FeetContactForce(Observation):
    """Per foot, the normal force (N) of its contacts with anything outside the robot, times `scale`."""

    feet: tuple[str, ...] = ()
    scale: float = 0.01
    foot_geoms: tuple[tuple[int, ...], ...] = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, foot_geoms=feet_geoms(layout, self.feet, f"{self.name}.feet"))

    def observe(self, ctx: StepContext) -> Array:
        return jnp.stack([ctx.contact_force(geoms) for geoms in self.foot_geoms]) * self.scale

    robot_input = simulator_only

    def mirror(self, context: MirrorContext) -> Mirror:
        return context.geometry.feet_mirror(self.feet, self.foot_geoms, f"{self.name}.feet")


def feet_geoms(layout: ModelLayout, feet: tuple[str, ...], setting: str) -> tuple[tuple[int, ...], ...]:
    """Per foot name, the geoms that touch for it; no feet, or a foot that cannot touch, raise naming `setting`."""
    if not feet:
        raise ConfigError(f"{setting} is empty: name the feet (geoms or bodies)")
    return tuple(layout.contact_geoms(foot, setting) for foot in feet)


@dataclass(frozen=True)
class LastAction(Observation):
    def observe(self, ctx: StepContext) -> Array:
        return ctx.action

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, source=RUNTIME, transform=LAST_ACTION)

    def mirror(self, context: MirrorContext) -> Mirror:
        return context.action


@dataclass(frozen=True)
class Command(Observation):
    """The task's command (e.g. a velocity command), times `scale`."""

    scale: float = 1.0
    command_size: ClassVar[int] = 1  # the task must have a command

    def observe(self, ctx: StepContext) -> Array:
        return ctx.command * self.scale

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, COMMAND, size, ROBOT, scale=self.scale)

    def mirror(self, context: MirrorContext) -> Mirror:
        if not isinstance(context.command, VelocityCommand):
            raise ConfigError(f"symmetry_coef > 0: the command {type(context.command).__name__} has no mirror image")
        return Mirror.signs(1.0, -1.0, -1.0)  # forward, lateral, yaw rate


@dataclass(frozen=True)
class HeightScan(_BaseObservation):
    """Terrain heights on a grid around the base minus the base's height, clipped to ±`clip` m: `size` (x, y)
    m with `spacing` m between points (17 x 11 points by default, as legged_gym and Isaac Lab), centred on the
    base and turning with its yaw. Looked up in the terrain's height array (`mjx.ray` misses heightfields)."""

    terrain: Terrain
    size: tuple[float, float] = (1.6, 1.0)
    spacing: float = 0.1
    clip: float = 1.0

    def bind(self, layout: ModelLayout) -> Self:
        if self.spacing <= 0 or min(self.size) < 0 or self.clip <= 0:
            raise ConfigError(
                f"{self.name}: spacing={self.spacing} and clip={self.clip} must be positive, size={self.size} >= 0"
            )
        return super().bind(layout)

    @property
    def points(self) -> np.ndarray:
        """(n, 2) grid points in the base's yaw frame."""
        axes = [np.linspace(-s / 2, s / 2, round(s / self.spacing) + 1) for s in self.size]
        return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 2)

    def observe(self, ctx: StepContext) -> Array:
        forward = rotate(ctx.base_quat, jnp.array([1.0, 0.0, 0.0]))
        yaw = jnp.arctan2(forward[1], forward[0])
        cos, sin = jnp.cos(yaw), jnp.sin(yaw)
        points = jnp.asarray(self.points, jnp.float32)
        world = ctx.base_pos[:2] + jnp.stack(
            [cos * points[:, 0] - sin * points[:, 1], sin * points[:, 0] + cos * points[:, 1]], -1
        )
        return jnp.clip(self.terrain.height_at(world) - ctx.base_pos[2], -self.clip, self.clip)

    robot_input = simulator_only


def check_noise(observations: tuple[Observation, ...]) -> None:
    """ConfigError for a negative noise scale or an unknown noise type."""
    for observation in observations:
        if observation.noise < 0:
            raise ConfigError(f"{observation.name}.noise={observation.noise} must be >= 0")
        if observation.noise_type not in NOISE_TYPES:
            choices = ", ".join(repr(c) for c in NOISE_TYPES)
            raise ConfigError(f"{observation.name}.noise_type={observation.noise_type!r} must be one of {choices}")


def noise_scales(observations: tuple[Observation, ...], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per observation value, the (Gaussian, uniform) noise scales."""
    gaussian = [o.noise if o.noise_type == "gaussian" else 0.0 for o in observations]
    uniform = [o.noise if o.noise_type == "uniform" else 0.0 for o in observations]
    return np.repeat(np.asarray(gaussian, np.float32), sizes), np.repeat(np.asarray(uniform, np.float32), sizes)


def add_noise(obs: Array, scales: tuple[np.ndarray, np.ndarray], rng: Array) -> Array:
    gaussian_key, uniform_key = jax.random.split(rng)
    gaussian, uniform = scales
    noise = gaussian * jax.random.normal(gaussian_key, obs.shape)
    return obs + noise + uniform * jax.random.uniform(uniform_key, obs.shape, minval=-1.0, maxval=1.0)


@dataclass(frozen=True)
class GaitPhase(Observation):
    """A gait clock: (sin, cos) of 2 pi t / `period_s`, t the time since the episode started.

    The phase is the env's simulated time, so it lives in the physics state and restarts with every episode.
    """

    period_s: float = 0.5

    def bind(self, layout: ModelLayout) -> Self:
        if self.period_s <= 0:
            raise ConfigError(f"{self.name}.period_s={self.period_s} must be positive")
        return self

    def observe(self, ctx: StepContext) -> Array:
        angle = 2 * jnp.pi * ctx.data.time / self.period_s
        return jnp.stack([jnp.sin(angle), jnp.cos(angle)])

    def robot_input(self, size: int, robot: RobotContext) -> PolicyInput:
        return PolicyInput(self.name, size, source=RUNTIME, transform=GAIT_PHASE, period_s=self.period_s)

    def mirror(self, context: MirrorContext) -> Mirror:
        return Mirror.signs(-1.0, -1.0)  # half a period on: the other foot's turn
