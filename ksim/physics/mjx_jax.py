"""physics_impl='jax': MJX's JAX implementation, its stages called in ksim's own order (`physics_step`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.engine import Contacts, PhysicsEngine
from ksim.physics import mjx_contract
from ksim.physics.mjx_import import mjx

Array = jax.Array


@dataclass(frozen=True)
class MjxJaxEngine(PhysicsEngine):
    """The model on MJX's JAX implementation; randomized fields replace those of `mjx_model` per env."""

    mjx_model: mjx.Model
    physics_impl = "jax"

    @property
    def field_defaults(self) -> mjx.Model:
        return self.mjx_model

    def model(self, fields: dict[str, Array] | None = None) -> mjx.Model:
        """The MJX model with some fields replaced (one env's randomized values)."""
        return self.mjx_model.replace(**fields) if fields else self.mjx_model

    def make_data(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None = None) -> mjx.Data:
        """Accelerations and forces stay zero until the first physics step computes them, unless the model has
        acceleration-stage sensors (then this is the whole `mjx.forward`)."""
        model = self.model(fields)
        data = mjx_contract.make_data(model, "jax").replace(qpos=qpos, qvel=qvel)
        return (traced_forward if self.has_acceleration_sensors else traced_position_and_velocity)(model, data)

    def step(
        self, data: mjx.Data, control: Callable[[mjx.Data], Array], fields: dict[str, Array] | None = None
    ) -> tuple[mjx.Data, Array]:
        """`data` must have its position- and velocity-dependent quantities up to date for the model that
        `fields` give (as `make_data` with the same fields, and this method, leave them). Each substep is
        `mjx.step` with its position and velocity stages moved from the substep's start to its end: the same
        physics, but the state a control step returns has its bodies, contacts and sensors computed for its
        final positions and velocities, without a second kinematics pass."""
        model = self.model(fields)

        def substep(data: mjx.Data, _: None) -> tuple[mjx.Data, Array]:
            ctrl = control(data)
            return traced_physics_step(model, data.replace(ctrl=ctrl)), ctrl

        data, ctrls = jax.lax.scan(substep, data, None, length=self.num_substeps)
        return data, ctrls[-1]

    def velocities_changed(self, data: mjx.Data, fields: dict[str, Array] | None = None) -> mjx.Data:
        """Both stages run again: MJX builds the constraints' reference accelerations, which depend on `qvel`,
        in its position stage."""
        return traced_position_and_velocity(self.model(fields), data)

    def contacts(self, data: mjx.Data) -> Contacts:
        return Contacts(*mjx_contract.contact_table(self.mj_model, data))


def position_and_velocity(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """The first half of `mjx.forward`: everything that depends on positions and velocities only."""
    return velocity_stage(model, mjx.sensor_pos(model, mjx.fwd_position(model, data)))


def velocity_stage(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """What depends on velocities (given the position stage): com velocities, passive and bias forces, sensors."""
    return mjx.sensor_vel(model, mjx.fwd_velocity(model, data))


def accelerations(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """The second half of `mjx.forward` (actuation, smooth and constrained accelerations), as MJX computes it
    but for the bodies' external forces (`smooth_accelerations`)."""
    data = smooth_accelerations(model, mjx.fwd_actuation(model, data))
    if mjx_contract.constraint_rows(data) == 0:
        return data.replace(qacc=data.qacc_smooth)
    return mjx.sensor_acc(model, mjx.solve(model, data))


def smooth_accelerations(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """`mjx.fwd_acceleration` (all forces but the constraints' and the accelerations they give), with the
    bodies' external forces mapped to joint forces by `body_forces` rather than by MJX's per-body Jacobians."""
    qfrc_smooth = data.qfrc_passive - data.qfrc_bias + data.qfrc_actuator + data.qfrc_applied + body_forces(model, data)
    return data.replace(qfrc_smooth=qfrc_smooth, qacc_smooth=mjx_contract.solve_m(model, data, qfrc_smooth))


def body_forces(model: mjx.Model, data: mjx.Data) -> Array:
    """Joint forces of the bodies' Cartesian forces and torques (`xfrc_applied`, at each body's centre of mass).

    What `mjx.xfrc_accumulate` computes; it builds each body's Jacobian with a scan over the body tree, which
    took 3-10% of a whole physics step (hopper, humanoid, on a CPU) for forces that are mostly zero. Here which
    dofs move which body is a constant table, and a dof's share of a force f and torque t at a point `lever`
    from its subtree's centre of mass is cdof_lin . f + cdof_ang . (lever x f + t).
    """
    moved = jnp.asarray(dofs_moving_bodies(model), data.cdof.dtype)
    force, torque = data.xfrc_applied[:, :3], data.xfrc_applied[:, 3:]
    lever = data.xipos - data.subtree_com[np.asarray(model.body_rootid)]
    moment = torque + jnp.cross(lever, force)
    highest = jax.lax.Precision.HIGHEST  # a 0/1 table: no reduced-precision matmul (TF32) on GPUs
    dof_force = jnp.einsum("bv,bk->vk", moved, force, precision=highest)
    dof_moment = jnp.einsum("bv,bk->vk", moved, moment, precision=highest)
    return jnp.sum(data.cdof[:, 3:] * dof_force, axis=-1) + jnp.sum(data.cdof[:, :3] * dof_moment, axis=-1)


def dofs_moving_bodies(model: mjx.Model) -> np.ndarray:
    """(nbody, nv) booleans: whether dof v moves body b, i.e. v belongs to b or to one of b's ancestors."""
    parent = np.asarray(model.body_parentid)
    ancestors = np.eye(model.nbody, dtype=bool)  # row b: b and its ancestors
    for body in range(1, model.nbody):  # MuJoCo numbers every body after its parent
        ancestors[body] |= ancestors[parent[body]]
    return ancestors[:, np.asarray(model.dof_bodyid)]


def integrate(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """The integrator step of `mjx.step`, on data whose accelerations are computed."""
    return mjx_contract.INTEGRATORS[mujoco.mjtIntegrator(int(model.opt.integrator))](model, data)


# MJX's Python takes seconds to trace. Under `jax.jit` each is traced once per process for given shapes and
# reused by every program that starts or steps an env (train step, evaluation, the episode's shape) and by
# the physics step itself; XLA inlines the calls, so the compiled programs are the same.
traced_position_and_velocity = jax.jit(position_and_velocity)
traced_forward = jax.jit(lambda model, data: accelerations(model, position_and_velocity(model, data)))  # mjx.forward


def physics_step(model: mjx.Model, data: mjx.Data) -> mjx.Data:
    """One `mjx.step` with its position and velocity stages moved to the end (see `MjxJaxEngine.step`)."""
    return traced_position_and_velocity(model, integrate(model, accelerations(model, data)))


traced_physics_step = jax.jit(physics_step)
traced_mjx_step = jax.jit(mjx.step)
traced_mjx_forward = jax.jit(mjx.forward)
