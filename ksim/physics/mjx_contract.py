"""The MJX contract: everything ksim takes from MuJoCo MJX beyond its public API, in one place.

ksim's control step calls MJX's public stage functions (`mjx.fwd_position`, `mjx.fwd_velocity`,
`mjx.fwd_actuation`, `mjx.solve`, the integrators, the sensor stages) in its own order and maps body forces
to joint forces itself (ksim.physics.mjx_jax). Beyond that public API it needs:

- `solve_m`: x = M^-1 y with the factorised mass matrix, which `mujoco.mjx` does not export;
- `constraint_rows`: the number of constraint rows of a data (the shape of `efc_J`, kept in the
  implementation's part of the data);
- which model features MJX's JAX implementation cannot run (`refusals`), which its private collision
  table and its public enums tell;
- for the Warp implementation, which fields of the data all envs of one vmapped call share (`warp_shared`):
  the contacts of every env are one pool there, sized for all of them.

With `physics_impl="warp"` ksim uses none of that: it steps through MJX's public `mjx.step` and
`mjx.forward` with MJX's Warp implementation (`put_model`/`make_data` with `impl="warp"`, warp-lang installed
by the `warp` extra), which runs on a CUDA GPU or the CPU.

`tests/test_mjx_contract.py` compares ksim's control step with `mjx.step` for every integrator MJX
implements, with contacts, equality constraints, tendons, acceleration sensors and actuator activation, and
the Warp implementation's control step with the JAX one; `TESTED_MJX_VERSIONS` are the mujoco-mjx releases
it passed on, and pyproject.toml allows just those.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.config import ConfigError
from ksim.physics.mjx_import import mjx
from ksim.xla_setup import installed_version

Array = jax.Array

# The MJX internals the contract relies on; loaded after ksim.physics.mjx_import has imported MJX quietly (an import
# statement would be sorted above it).
_mjx_warp = importlib.import_module("mujoco.mjx.warp")
_mjx_collision = importlib.import_module("mujoco.mjx._src.collision_driver")
_mjx_smooth = importlib.import_module("mujoco.mjx._src.smooth")
_mjx_warp_types = importlib.import_module("mujoco.mjx.warp.types")

TESTED_MJX_VERSIONS = ("3.17",)  # major.minor releases of mujoco-mjx the contract tests passed on
MJX_IMPLS = ("jax", "warp")

# The integrators MJX's step implements, each with the function that advances data whose accelerations
# are computed.
INTEGRATORS = {
    mujoco.mjtIntegrator.mjINT_EULER: mjx.euler,
    mujoco.mjtIntegrator.mjINT_RK4: mjx.rungekutta4,
    mujoco.mjtIntegrator.mjINT_IMPLICITFAST: mjx.implicit,
}


def mjx_version() -> str:
    return installed_version("mujoco-mjx") or "unknown"


def solve_m(model: mjx.Model, data: mjx.Data, vector: Array) -> Array:
    """M^-1 `vector`, with the mass matrix factorised by the position stage."""
    return _mjx_smooth.solve_m(model, data, vector)


def constraint_rows(data: mjx.Data) -> int:
    """Static number of constraint rows (0: `mjx.forward` skips the solver)."""
    return int(getattr(data, "_impl", data).efc_J.shape[0])


def contact_table(mj_model: mujoco.MjModel, data: mjx.Data) -> tuple[Array, Array, Array, Array, Array]:
    """MJX's (JAX implementation's) contacts as (geom1, geom2, dist, pos, normal_force), one row per candidate.

    The normal force is what `mj_contactForce` gives: the first constraint row of an elliptic cone, or the sum of
    a pyramidal cone's facet forces (each facet pushes along the normal by its whole force).
    """
    contact, efc_force = data._impl.contact, data._impl.efc_force
    if contact.dist.shape[0] == 0:
        empty = jnp.zeros(0)
        return empty.astype(jnp.int32), empty.astype(jnp.int32), empty, jnp.zeros((0, 3)), empty
    dim = np.asarray(contact.dim)
    rows = np.where(dim == 1, 1, 2 * (dim - 1)) if int(mj_model.opt.cone) == mujoco.mjtCone.mjCONE_PYRAMIDAL else 1
    offsets = np.arange(int(np.max(rows)))
    in_contact = offsets[None, :] < np.broadcast_to(rows, dim.shape)[:, None]
    facet_forces = efc_force[contact.efc_address[:, None] + offsets[None, :]]
    normal_force = jnp.sum(jnp.where(in_contact, facet_forces, 0.0), axis=1)
    return contact.geom1, contact.geom2, contact.dist, contact.pos, normal_force


def warp_installed() -> bool:
    """Whether MJX found warp-lang (it imports it, and its own copy of MuJoCo Warp, when `mujoco.mjx` loads)."""
    return bool(_mjx_warp.WARP_INSTALLED)


def require_impl(impl: str, device: jax.Device) -> None:
    """ConfigError naming `physics_impl` where the implementation cannot run here (before anything compiles)."""
    if impl not in MJX_IMPLS:
        raise ConfigError(f"physics_impl={impl!r} must be one of {', '.join(repr(i) for i in MJX_IMPLS)}")
    if impl != "warp":
        return
    if not warp_installed():
        raise ConfigError(
            "physics_impl='warp' needs warp-lang, which is not installed: pip install 'ksim[warp]', "
            "or set physics_impl='jax'"
        )
    if not (device.platform == "cpu" or _is_cuda_device(device)):
        raise ConfigError(
            f"physics_impl='warp': MJX's Warp implementation runs on a CUDA GPU or the CPU, not on {device}; "
            "set physics_impl='jax'"
        )


def _is_cuda_device(device: jax.Device) -> bool:
    try:
        return device in jax.devices("cuda")
    except RuntimeError:  # no CUDA backend
        return False


def put_model(mj_model: mujoco.MjModel, impl: str, device: jax.Device | None = None) -> mjx.Model:
    """`mjx.put_model` with an explicit implementation; what MJX still refuses becomes one ConfigError line."""
    try:
        model = mjx.put_model(mj_model, device=device, impl=impl)
    except NotImplementedError as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"MJX ({impl}) cannot run this model: {reason}") from None
    return without_solver_budget_warnings(model) if impl == "warp" else model


def without_solver_budget_warnings(model: mjx.Model) -> mjx.Model:
    """The Warp model, silent when the solver uses all the iterations the model allows.

    ksim's models allow 1-4 on purpose, a budget that C MuJoCo and MJX's JAX implementation spend without a
    word; MuJoCo Warp printed two lines per env step for it, 14 MB in two minutes of the walking example on an
    H100. Overflows that drop contacts or constraints still warn."""
    overflow = importlib.import_module("mujoco.mjx.third_party.mujoco_warp._src.types").OverflowType
    options = model.opt._impl
    warnings = int(options.warn_overflow) & ~int(overflow.ITERATIONS | overflow.LS_ITERATIONS)
    return model.replace(opt=model.opt.replace(_impl=options.replace(warn_overflow=warnings)))


def make_data(
    model: mjx.Model | mujoco.MjModel, impl: str, device: jax.Device | None = None, envs: int = 1
) -> mjx.Data:
    """`mjx.make_data` with an explicit implementation (Warp's takes the `mujoco.MjModel` only); with Warp,
    its contact pool holds the default number of contacts per env for `envs` envs."""
    if impl != "warp":
        return mjx.make_data(model, impl=impl, device=device)
    one = mjx.make_data(model, impl=impl, device=device)
    return one if envs == 1 else mjx.make_data(model, impl=impl, device=device, naconmax=one._impl.naconmax * envs)


# Fields of Warp's part of the data that `jax.vmap` passes through untouched (MJX registers them so): one
# contact pool, its counts and index tables for all envs of a call.
WARP_SHARED_FIELDS = tuple(name for name, batched in _mjx_warp_types._BATCH_DIM["Data"].items() if not batched)


def warp_shared(data: mjx.Data) -> dict[str, Any]:
    """The Warp fields all envs of a vmapped call share, as JAX arrays (MJX's dataclasses would make NumPy
    ones static) and the sizes (`naconmax`, ...) as Python ints."""
    fields = {name: getattr(data._impl, name) for name in WARP_SHARED_FIELDS}
    return {name: jnp.asarray(value) if isinstance(value, np.ndarray) else value for name, value in fields.items()}


def with_warp_shared(data: mjx.Data, shared: dict[str, Any]) -> mjx.Data:
    return data.replace(_impl=data._impl.replace(**shared))


@dataclass(frozen=True)
class Refusal:
    """A model feature MJX cannot run, and the change to the MJCF that avoids it."""

    feature: str
    fix: str

    def __str__(self) -> str:
        return f"{self.feature}: {self.fix}"


def _enum_name(value: int, enum: type, prefix: str) -> str:
    try:
        return str(enum(int(value)).name).removeprefix(prefix)
    except ValueError:
        return str(int(value))


def _option_refusals(mj_model: mujoco.MjModel) -> list[Refusal]:
    option = mj_model.opt
    refusals = []
    if option.solver not in set(mjx.SolverType):
        solver = _enum_name(option.solver, mujoco.mjtSolver, "mjSOL_")
        refusals.append(Refusal(f"solver {solver}", 'MJX implements Newton and CG: set <option solver="Newton"/>'))
    if mujoco.mjtIntegrator(int(option.integrator)) not in INTEGRATORS:
        integrator = _enum_name(option.integrator, mujoco.mjtIntegrator, "mjINT_")
        refusals.append(
            Refusal(
                f"integrator {integrator}",
                'MJX implements Euler, RK4 and implicitfast: set <option integrator="implicitfast"/>',
            )
        )
    for bit in range(mujoco.mjtEnableBit.mjNENABLE):
        flag = 1 << bit
        if option.enableflags & flag and flag not in set(mjx.EnableBit):
            name = _enum_name(flag, mujoco.mjtEnableBit, "mjENBL_").lower()
            refusals.append(
                Refusal(f"enable flag {name}", f'MJX does not implement it: remove <flag {name}="enable"/>')
            )
    fluid = option.density > 0 or option.viscosity > 0 or bool(np.any(option.wind))
    if fluid and option.integrator == mujoco.mjtIntegrator.mjINT_IMPLICITFAST:
        refusals.append(
            Refusal(
                "fluid forces (density, viscosity or wind) with the implicitfast integrator",
                'set <option integrator="Euler"/> or remove density, viscosity and wind',
            )
        )
    if option.noslip_iterations > 0:
        refusals.append(Refusal("the noslip solver", 'MJX does not implement it: set <option noslip_iterations="0"/>'))
    return refusals


def _type_refusals(mj_model: mujoco.MjModel) -> list[Refusal]:
    checks = (
        ("actuator dynamics", mj_model.actuator_dyntype, mjx.DynType, mujoco.mjtDyn, "mjDYN_"),
        ("actuator gain", mj_model.actuator_gaintype, mjx.GainType, mujoco.mjtGain, "mjGAIN_"),
        ("actuator bias", mj_model.actuator_biastype, mjx.BiasType, mujoco.mjtBias, "mjBIAS_"),
        ("actuator transmission", mj_model.actuator_trntype, mjx.TrnType, mujoco.mjtTrn, "mjTRN_"),
        ("equality constraint", mj_model.eq_type, mjx.EqType, mujoco.mjtEq, "mjEQ_"),
        ("sensor", mj_model.sensor_type, mjx.SensorType, mujoco.mjtSensor, "mjSENS_"),
        ("tendon wrap", mj_model.wrap_type, mjx.WrapType, mujoco.mjtWrap, "mjWRAP_"),
    )
    refusals = []
    for what, values, supported, mj_enum, prefix in checks:
        for value in sorted(set(int(v) for v in values) - {int(s) for s in supported}):
            name = _enum_name(value, mj_enum, prefix).lower()
            refusals.append(
                Refusal(f"{what} type {name}", f"MJX does not implement it: remove or replace the {what}s of that type")
            )
    if mj_model.nflex:
        refusals.append(
            Refusal(f"{mj_model.nflex} flex(es)", "MJX's JAX implementation has no deformable objects: remove them")
        )
    contact = mj_model.sensor_type == mujoco.mjtSensor.mjSENS_CONTACT
    if contact.any():
        matched = {int(t) for t in np.concatenate([mj_model.sensor_objtype[contact], mj_model.sensor_reftype[contact]])}
        unsupported = matched & {
            int(mujoco.mjtObj.mjOBJ_SITE),
            int(mujoco.mjtObj.mjOBJ_BODY),
            int(mujoco.mjtObj.mjOBJ_XBODY),
        }
        if unsupported or (mj_model.sensor_intprm[contact, 1] == 3).any():
            refusals.append(
                Refusal("a contact sensor matching sites, bodies or subtrees, or with net force", "match geoms instead")
            )
    return refusals


def _geom_label(mj_model: mujoco.MjModel, geom: int) -> str:
    name = mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_GEOM, geom) or f"#{geom}"
    return f"{name!r} ({_enum_name(mj_model.geom_type[geom], mujoco.mjtGeom, 'mjGEOM_').lower()})"


def collision_pairs(mj_model: mujoco.MjModel) -> list[tuple[int, int, int]]:
    """The (geom, geom, explicit pair id or -1) that MJX checks for contact at every step."""
    return [(int(g1), int(g2), int(pair)) for g1, g2, pair in _mjx_collision.geom_pairs(mj_model)]


def _collision_refusals(mj_model: mujoco.MjModel) -> list[Refusal]:
    refusals = []
    no_margin = {int(mujoco.mjtGeom.mjGEOM_MESH), int(mujoco.mjtGeom.mjGEOM_HFIELD)}
    for g1, g2, pair in collision_pairs(mj_model):
        t1, t2 = int(mj_model.geom_type[g1]), int(mj_model.geom_type[g2])
        pair_text = f"geoms {_geom_label(mj_model, g1)} and {_geom_label(mj_model, g2)}"
        if not _mjx_collision.has_collision_fn(mjx.GeomType(t1), mjx.GeomType(t2)):
            refusals.append(
                Refusal(
                    f"{pair_text} can collide, and MJX has no collision function for that pair",
                    "give one a type MJX collides (e.g. capsule, box, sphere), or exclude the pair (contype/"
                    "conaffinity or <exclude>)",
                )
            )
        elif no_margin & {t1, t2}:
            margin = mj_model.pair_margin[pair] if pair != -1 else mj_model.geom_margin[g1] + mj_model.geom_margin[g2]
            if np.any(margin):
                refusals.append(
                    Refusal(
                        f"{pair_text} have a margin", "MJX has no margin for meshes and height fields: set margin=0"
                    )
                )
    return refusals


def _touch_refusals(mj_model: mujoco.MjModel) -> list[Refusal]:
    """MJX computes touch sensors from the contacts' forces and fails where no contact can exist."""
    touch = np.flatnonzero(mj_model.sensor_type == mujoco.mjtSensor.mjSENS_TOUCH)
    no_contacts = bool(mj_model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT) or not collision_pairs(mj_model)
    if not (len(touch) and no_contacts):
        return []
    names = ", ".join(repr(mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_SENSOR, int(i)) or f"#{i}") for i in touch)
    return [Refusal(f"touch sensor {names} in a model where nothing can collide", "remove it, or let geoms collide")]


def refusals(mj_model: mujoco.MjModel) -> list[Refusal]:
    """Every feature of the model that MJX's JAX implementation (as ksim steps it) cannot run."""
    return [
        *_option_refusals(mj_model),
        *_type_refusals(mj_model),
        *_collision_refusals(mj_model),
        *_touch_refusals(mj_model),
    ]


def require_supported(mj_model: mujoco.MjModel) -> None:
    """ConfigError (one line) naming the first feature MJX cannot run and the change to make."""
    found = refusals(mj_model)
    if found:
        more = f" (and {len(found) - 1} more: python -m ksim.inspect lists them)" if len(found) > 1 else ""
        raise ConfigError(f"MJX cannot run this model: {found[0]}{more}")
