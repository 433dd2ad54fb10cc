"""physics_impl='warp': MJX's public `mjx.step` and `mjx.forward` on its Warp implementation (a CUDA GPU or
the CPU)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from ksim.engine import Contacts, PhysicsEngine
from ksim.physics import mjx_contract
from ksim.physics.mjx_import import mjx

Array = jax.Array

traced_mjx_step = jax.jit(mjx.step)
traced_mjx_forward = jax.jit(mjx.forward)


@dataclass(frozen=True)
class MjxWarpEngine(PhysicsEngine):
    """The model on MJX's Warp implementation. The contacts of all envs of one vmapped call are one pool there,
    sized for `max_envs` envs at MuJoCo Warp's default number of contacts per env."""

    mjx_model: mjx.Model
    max_envs: int = 1
    physics_impl = "warp"
    no_contacts = "physics_impl='warp' does not give per env (MuJoCo Warp pools every env's contacts)"

    @property
    def field_defaults(self) -> mjx.Model:
        return self.mjx_model

    def model(self, fields: dict[str, Array] | None = None) -> mjx.Model:
        return self.mjx_model.replace(**fields) if fields else self.mjx_model

    @functools.cached_property
    def _blank(self) -> mjx.Data:
        """A fresh Warp data for one env (made once, outside any trace), its shared fields as JAX arrays like
        those of every env's data (MJX makes them NumPy arrays, which its dataclasses treat as static)."""
        with jax.ensure_compile_time_eval():
            data = mjx_contract.make_data(self.mj_model, "warp", device=jax.local_devices()[0])
            return mjx_contract.with_warp_shared(data, mjx_contract.warp_shared(data))

    @functools.cached_property
    def _pool(self) -> dict[str, Any]:
        """Warp's shared fields for one call: a contact pool for `max_envs` envs."""
        with jax.ensure_compile_time_eval():
            device = jax.local_devices()[0]
            return mjx_contract.warp_shared(mjx_contract.make_data(self.mj_model, "warp", device, self.max_envs))

    def _forward(self, model: mjx.Model, data: mjx.Data) -> mjx.Data:
        """`mjx.forward` with the call's contact pool, as in `step`."""
        kept = mjx_contract.warp_shared(data)
        data = traced_mjx_forward(model, mjx_contract.with_warp_shared(data, self._pool))
        return mjx_contract.with_warp_shared(data, kept)

    def make_data(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None = None) -> mjx.Data:
        """The whole `mjx.forward` at the pose."""
        return self._forward(self.model(fields), self._blank.replace(qpos=qpos, qvel=qvel))

    def step(
        self, data: mjx.Data, control: Callable[[mjx.Data], Array], fields: dict[str, Array] | None = None
    ) -> tuple[mjx.Data, Array]:
        """Each substep is `mjx.step`, and one `mjx.forward` after the last brings the returned state to the
        contract's meaning (its accelerations then are those of the final state)."""
        model = self.model(fields)
        # Warp's contacts are one pool for every env of the vmapped call; each env's data keeps the copy of those
        # fields ksim gave it (`jax.vmap` passes them through unbatched, so they keep their shape).
        kept = mjx_contract.warp_shared(data)

        def substep(data: mjx.Data, _: None) -> tuple[mjx.Data, Array]:
            ctrl = control(data)
            return traced_mjx_step(model, data.replace(ctrl=ctrl)), ctrl

        data, ctrls = jax.lax.scan(
            substep, mjx_contract.with_warp_shared(data, self._pool), None, length=self.num_substeps
        )
        return mjx_contract.with_warp_shared(traced_mjx_forward(model, data), kept), ctrls[-1]

    def velocities_changed(self, data: mjx.Data, fields: dict[str, Array] | None = None) -> mjx.Data:
        """A whole `mjx.forward`: Warp's stages are no public functions."""
        return self._forward(self.model(fields), data)

    def contacts(self, data: mjx.Data) -> Contacts | None:
        # The pool holds every env's contacts with its world's index, which a vmapped env cannot know; a component
        # that reads them is refused (StepContext.contacts).
        return None
