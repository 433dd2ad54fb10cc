"""Domain randomization: small classes that draw one env's physical parameters at each episode start.

Each randomization draws new values for a few MJX model fields (or PD gains: those of `PositionActuators`,
or of the model's position servos) from the episode's key. Only the fields some randomization touches are
stored per env (in the `Episode`); the rest of the model stays shared. Ranges are `[low, high]`; a range
that multiplies a field must be positive. Several randomizations of one field compose in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Self

import jax
import numpy as np
from flax import struct

from ksim.actuators import Actuators, PositionActuators, PositionServoActuators
from ksim.binding import resolved, with_resolved
from ksim.config import ConfigError
from ksim.engine import ModelLayout, body_index

if TYPE_CHECKING:  # MJX's types only: the native engine runs without importing MJX
    import mujoco
    from mujoco import mjx

Array = jax.Array


class Randomized(struct.PyTreeNode):
    """One env's randomized values: replaced MJX model fields and PD-gain multipliers ("kp", "kd")."""

    model_fields: dict[str, Array]
    gain_scales: dict[str, Array]


def require_range(component: str, field: str, low: float, high: float, multiplies: bool) -> None:
    """ConfigError unless low <= high (and low > 0 for a range that multiplies `field`)."""
    if low > high:
        raise ConfigError(f"{component}: low={low} must be <= high={high} (the range of {field})")
    if multiplies and low <= 0:
        raise ConfigError(f"{component}: low={low} must be positive (it scales {field})")


@dataclass(frozen=True)
class Randomization(ABC):
    """Draws one or more fields uniformly from [low, high] (a scale, or an offset where it says so)."""

    low: float
    high: float

    field: ClassVar[str] = ""  # the MJX model field (or PD gain) it draws
    multiplies: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, layout: ModelLayout) -> Self:
        """This randomization with its names resolved; ConfigError on a bad range or names the model lacks."""
        require_range(self.name, self.field, self.low, self.high, self.multiplies)
        return self

    def draw(self, rng: Array, shape: tuple[int, ...]) -> Array:
        return jax.random.uniform(rng, shape, minval=self.low, maxval=self.high)

    @abstractmethod
    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        """`randomized` with this component's fields drawn (starting from earlier draws of the same field)."""


def _current(randomized: Randomized, model: mjx.Model, field: str) -> Array:
    return randomized.model_fields.get(field, getattr(model, field))


def _with_fields(randomized: Randomized, **fields: Array) -> Randomized:
    return randomized.replace(model_fields={**randomized.model_fields, **fields})


def _geom_ids(layout: ModelLayout, geoms: tuple[str, ...] | None, setting: str) -> np.ndarray:
    if geoms is None:
        return np.arange(len(layout.geom_names), dtype=np.int32)
    for geom in geoms:
        if geom not in layout.geom_names:
            named = ", ".join(repr(g) for g in layout.geom_names if g) or "(none named)"
            raise ConfigError(f"{setting}: no geom named {geom!r}; the model's geoms are {named}")
    return np.asarray([layout.geom_names.index(g) for g in geoms], dtype=np.int32)


@dataclass(frozen=True)
class GeomFriction(Randomization):
    """Scales the sliding friction of the named geoms (all geoms for None) by one draw per env."""

    geoms: tuple[str, ...] | None = None
    field: ClassVar[str] = "geom_friction"
    geom_ids: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        bound = super().bind(layout)
        return with_resolved(bound, geom_ids=_geom_ids(layout, self.geoms, f"{self.name}.geoms"))

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        friction = _current(randomized, model, self.field)
        return _with_fields(randomized, geom_friction=friction.at[self.geom_ids, 0].multiply(self.draw(rng, ())))


@dataclass(frozen=True)
class FloorFriction(GeomFriction):
    """Scales the floor's sliding friction (MuJoCo takes the larger friction of two touching geoms)."""

    geoms: tuple[str, ...] | None = ("floor",)


@dataclass(frozen=True)
class BodyMass(Randomization):
    """Scales the mass and rotational inertia of each named body (every body for None) independently."""

    bodies: tuple[str, ...] | None = None
    field: ClassVar[str] = "body_mass"
    body_ids: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        bound = super().bind(layout)
        if self.bodies is None:
            index = np.arange(1, len(layout.body_names), dtype=np.int32)
        else:
            setting = f"{self.name}.bodies"
            index = np.asarray([body_index(layout.body_names, b, setting) for b in self.bodies], dtype=np.int32)
        return with_resolved(bound, body_ids=index)

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        index = self.body_ids
        scale = self.draw(rng, (len(index),))
        mass = _current(randomized, model, "body_mass").at[index].multiply(scale)
        inertia = _current(randomized, model, "body_inertia").at[index].multiply(scale[:, None])
        return _with_fields(randomized, body_mass=mass, body_inertia=inertia)


@dataclass(frozen=True)
class AddedBaseMass(Randomization):
    """Adds [low, high] kg to the base body's mass (a payload at its centre of mass; inertia unchanged)."""

    field: ClassVar[str] = "body_mass"
    multiplies: ClassVar[bool] = False

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        mass = _current(randomized, model, self.field)
        return _with_fields(randomized, body_mass=mass.at[layout.base_body].add(self.draw(rng, ())))


@dataclass(frozen=True)
class CenterOfMassOffset(Randomization):
    """Moves a body's centre of mass (the base for None) by [low, high] metres along each of its axes."""

    body: str | None = None
    field: ClassVar[str] = "body_ipos"
    multiplies: ClassVar[bool] = False
    body_id: int = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        bound = super().bind(layout)
        body = layout.base_body if self.body is None else body_index(layout.body_names, self.body, f"{self.name}.body")
        return with_resolved(bound, body_id=body)

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        ipos = _current(randomized, model, self.field)
        return _with_fields(randomized, body_ipos=ipos.at[self.body_id].add(self.draw(rng, (3,))))


@dataclass(frozen=True)
class _DofScale(Randomization):
    """Scales a per-dof field of the named joints (the robot joints for None), each dof independently."""

    joints: tuple[str, ...] | None = None
    dof_ids: np.ndarray = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        bound = super().bind(layout)
        return with_resolved(bound, dof_ids=layout.qvel_indices(layout.joints(self.joints, f"{self.name}.joints")))

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        index = self.dof_ids
        values = _current(randomized, model, self.field)
        return _with_fields(randomized, **{self.field: values.at[index].multiply(self.draw(rng, (len(index),)))})


@dataclass(frozen=True)
class JointDamping(_DofScale):
    field: ClassVar[str] = "dof_damping"


@dataclass(frozen=True)
class JointArmature(_DofScale):
    field: ClassVar[str] = "dof_armature"


@dataclass(frozen=True)
class JointFrictionLoss(_DofScale):
    """Scales dry joint friction; MJX only applies it to dofs whose model frictionloss is non-zero."""

    field: ClassVar[str] = "dof_frictionloss"


@dataclass(frozen=True)
class ActuatorStrength(Randomization):
    """Scales each MuJoCo actuator's force (gain and bias terms together), each actuator independently."""

    field: ClassVar[str] = "actuator_gainprm"

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        gain, bias = _current(randomized, model, "actuator_gainprm"), _current(randomized, model, "actuator_biasprm")
        scale = self.draw(rng, (gain.shape[0], 1))
        return _with_fields(
            randomized,
            actuator_gainprm=gain.at[:, :3].multiply(scale),
            actuator_biasprm=bias.at[:, :3].multiply(scale),
        )


@dataclass(frozen=True)
class _GainScale(Randomization):
    """Scales a PD gain of `PositionActuators`, each actuator independently."""

    def apply(self, randomized: Randomized, model: mjx.Model, layout: ModelLayout, rng: Array) -> Randomized:
        scale = self.draw(rng, (model.nu,)) * randomized.gain_scales.get(self.field, 1.0)
        return randomized.replace(gain_scales={**randomized.gain_scales, self.field: scale})


@dataclass(frozen=True)
class PositionGain(_GainScale):
    """Scales the position gain: `PositionActuators.kp`, or the kp of the model's position servos."""

    field: ClassVar[str] = "kp"


@dataclass(frozen=True)
class VelocityGain(_GainScale):
    """Scales the velocity gain: `PositionActuators.kd`, or the kv of the model's position servos."""

    field: ClassVar[str] = "kd"


def check_randomizations(randomizations: Sequence[Randomization], actuators: Actuators) -> None:
    """Gain randomizations need PD actuators: ksim's own PD loop, or the model's position servos."""
    for randomization in randomizations:
        if isinstance(randomization, _GainScale) and not isinstance(
            actuators, PositionActuators | PositionServoActuators
        ):
            raise ConfigError(
                f"{randomization.name} scales PD gains, which needs PositionActuators or PositionServoActuators "
                f"(the task's actuators are {type(actuators).__name__}); use ActuatorStrength instead"
            )


def check_scaled_fields(randomizations: Sequence[Randomization], mj_model: mujoco.MjModel) -> None:
    """A per-dof scale of a field that is 0 on every dof it names would change nothing: refused in one line."""
    for randomization in randomizations:
        if isinstance(randomization, _DofScale) and not np.any(
            getattr(mj_model, randomization.field)[randomization.dof_ids]
        ):
            raise ConfigError(
                f"{randomization.name} scales {randomization.field}, which the model sets to 0 on every dof it "
                "names: there is nothing to randomize"
            )


def sample_randomizations(
    randomizations: Sequence[Randomization], model: mjx.Model, layout: ModelLayout, rng: Array
) -> Randomized:
    """One env's draws, every component from its own key."""
    randomized = Randomized(model_fields={}, gain_scales={})
    for index, randomization in enumerate(randomizations):
        randomized = randomization.apply(randomized, model, layout, jax.random.fold_in(rng, index))
    return randomized
