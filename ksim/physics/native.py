"""physics_impl='mujoco': C MuJoCo on the CPU, stepped from JAX through host callbacks into `mujoco.batch.Batch`.

The env state stays in the JAX pytree (`NativeData`, float32 like every JAX state); each call writes it into a
batch of simulations (float64, MuJoCo's precision), steps them on the batch's C threads and reads the state
and the contract's derived fields back. A batch holds no state between calls, so resets, pooled starts,
checkpoints and pmap sharding work on the pytree as with MJX, and a call's result depends on its inputs only.

Where the XLA FFI extension is built (ksim/physics/ffi/native_ffi.cc, `make install`; ksim.physics.native_ffi
loads it), the same host work runs as FFI custom calls in C++ (`FfiCalls`): the programs then hold no Python
callback, so they reach JAX's persistent compilation cache, and no step crosses into Python. Both paths give the
same bits; where the extension is missing or stale, the engine says why in one line and uses the callbacks
(`Callbacks`). The engine reaches its host work only through its `transport`, one of the two.

Under `jax.vmap` a callback receives every env of the call at once (`vmap_method="broadcast_all"`); under
pmap each device's shard calls from its own thread, and takes a batch of its own from a lock-protected pool
(a batch must not be called from two threads at once).

`control` runs in JAX at every substep, as with MJX: each substep but the last is one callback, and the last
one also computes the positions', velocities' (and, with acceleration sensors, accelerations') stages at the
final state, so the data a control step returns is current for it. Contacts are computed by their own
callback (`mj_forward` of the state, then the contact list and the constraint forces): only a program that
reads `ctx.contacts` runs it, because XLA drops a pure callback whose results nothing uses.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jax
import jax.extend.core
import jax.numpy as jnp
import mujoco
import mujoco.batch
import numpy as np
from flax import struct

import ksim.physics.native_ffi as native_ffi
from ksim.config import ConfigError
from ksim.engine import Contacts, PhysicsEngine

Array = jax.Array

# One env's packed state row, its fields in order: the one definition (the FFI calls are told it as `state`).
STATE = ("qpos", "qvel", "act", "qacc_warmstart", "time", "ctrl", "xfrc_applied")
DERIVED = (
    "xpos",
    "xquat",
    "xipos",
    "cvel",
    "subtree_com",
    "site_xpos",
    "site_xmat",
    "geom_xpos",
    "geom_xmat",
    "sensordata",
)
# The state as `mj_setState` takes it in one call: these elements, in this (their bits') order.
STATE_SPEC_ORDER = ("time", "qpos", "qvel", "act", "qacc_warmstart", "ctrl", "xfrc_applied")
STATE_SPEC = int(
    mujoco.mjtState.mjSTATE_TIME
    | mujoco.mjtState.mjSTATE_QPOS
    | mujoco.mjtState.mjSTATE_QVEL
    | mujoco.mjtState.mjSTATE_ACT
    | mujoco.mjtState.mjSTATE_WARMSTART
    | mujoco.mjtState.mjSTATE_CTRL
    | mujoco.mjtState.mjSTATE_XFRC_APPLIED
)
CONTACT_FIELDS = ("geom1", "geom2", "dist", "pos", "normal_force")
DEFAULT_CONTACT_ROWS = 32


class NativeData(struct.PyTreeNode):
    """One env's physics data: MuJoCo's state, the contract's derived fields for it, and the env's randomized
    model fields (which the contacts' callback needs)."""

    qpos: Array
    qvel: Array
    act: Array
    qacc_warmstart: Array
    time: Array
    ctrl: Array
    xfrc_applied: Array  # forces and torques on the bodies (pushes), as in mjx.Data
    xpos: Array
    xquat: Array
    xipos: Array
    cvel: Array
    subtree_com: Array
    site_xpos: Array
    site_xmat: Array
    geom_xpos: Array
    geom_xmat: Array
    sensordata: Array
    fields: dict[str, Array]


def field_shapes(mj_model: mujoco.MjModel) -> dict[str, tuple[int, ...]]:
    """Per-env shapes of the state and derived fields (matrices as 3x3, as in mjx.Data)."""
    m = mj_model
    return {
        "qpos": (m.nq,),
        "qvel": (m.nv,),
        "act": (m.na,),
        "qacc_warmstart": (m.nv,),
        "time": (),
        "ctrl": (m.nu,),
        "xfrc_applied": (m.nbody, 6),
        "xpos": (m.nbody, 3),
        "xquat": (m.nbody, 4),
        "xipos": (m.nbody, 3),
        "cvel": (m.nbody, 6),
        "subtree_com": (m.nbody, 3),
        "site_xpos": (m.nsite, 3),
        "site_xmat": (m.nsite, 3, 3),
        "geom_xpos": (m.ngeom, 3),
        "geom_xmat": (m.ngeom, 3, 3),
        "sensordata": (m.nsensordata,),
    }


class ModelDefaults:
    """A model's fields as JAX arrays (what randomizations start from); sizes (`nu`, ...) as Python ints."""

    def __init__(self, mj_model: mujoco.MjModel) -> None:
        self._mj_model = mj_model

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._mj_model, name)
        return jnp.asarray(value) if isinstance(value, np.ndarray) else value


class _Sims:
    """One batch of simulations and its bound arrays (live views of their rows)."""

    def __init__(self, mj_model: mujoco.MjModel, nsim: int, nthread: int) -> None:
        self.batch = mujoco.batch.Batch(mj_model, nsim, nthread)
        self.nsim = nsim
        self.arrays = {name: self.batch.bind(name) for name in (*STATE, *DERIVED)}
        self.expanded: dict[str, np.ndarray] = {}

    def write_fields(self, mj_model: mujoco.MjModel, n: int, fields: dict[str, np.ndarray]) -> None:
        """Each env's own values of the randomized fields; the model's own values where a field that an earlier
        call expanded is not randomized in this one."""
        for name, values in fields.items():
            if name not in self.expanded:
                self.expanded[name] = self.batch.expand(name)
            self.expanded[name][:n] = values
        for name, live in self.expanded.items():
            if name not in fields:
                live[:n] = getattr(mj_model, name)


class _Scratch:
    """A model and data of the engine's own for the contacts' callback, and the fields it randomized last."""

    def __init__(self, mj_model: mujoco.MjModel) -> None:
        self.model = copy.copy(mj_model)
        self.data = mujoco.MjData(self.model)
        self.written: set[str] = set()

    def restore_except(self, mj_model: mujoco.MjModel, names: tuple[str, ...]) -> None:
        """The engine's model's values in the fields an earlier call randomized and this one does not."""
        for name in self.written - set(names):
            getattr(self.model, name)[...] = getattr(mj_model, name)
        self.written = set(names)


class FfiClock:
    """Seconds spent in the FFI handlers of one model (every engine of that model in the process, summed over
    concurrent callers): `HostClock`'s figure for the FFI path."""

    def __init__(self, library: native_ffi.FfiLibrary, key: str) -> None:
        self._library, self._key = library, key

    @property
    def seconds(self) -> float:
        return self._library.host_seconds(self._key)


class HostClock:
    """Seconds spent in the engine's host callbacks, summed over callers (pmap's shards overlap in time)."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def timing(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._seconds += time.perf_counter() - start

    @property
    def seconds(self) -> float:
        with self._lock:
            return self._seconds


T = TypeVar("T")


class _Pool(Generic[T]):
    """Objects for concurrent callers (pmap's device shards call at once), made on first need and kept between
    calls. Not `threading.local`: XLA runs a callback on a pool thread under a Python thread state that lives for
    that call only, and clearing it would free (and crash in) a thread-local MuJoCo object after every call."""

    def __init__(self) -> None:
        self._free: list[T] = []
        self._lock = threading.Lock()

    @contextmanager
    def take(
        self, make: Callable[[], T], fits: Callable[[T], bool] = lambda _: True, cost: Callable[[T], int] = lambda _: 0
    ) -> Iterator[T]:
        """The cheapest free object that fits, or a new one from `make`; back in the pool afterwards."""
        with self._lock:
            fitting = [item for item in self._free if fits(item)]
            item = min(fitting, key=cost) if fitting else None
            if item is not None:
                self._free.remove(item)
        if item is None:
            item = make()
        try:
            yield item
        finally:
            with self._lock:
                self._free.append(item)


def _flat(array: np.ndarray, lead: tuple[int, ...], n: int) -> np.ndarray:
    return np.asarray(array).reshape((n, *array.shape[len(lead) :]))


class Transport(ABC):
    """How a JAX program reaches the engine's host work: the C MuJoCo steps and contact tables of a call's envs,
    each env's state packed in one float32 row (`NativeEngine._packed_state`) beside its randomized fields."""

    @abstractmethod
    def step(
        self,
        engine: NativeEngine,
        nstep: int,
        final: bool,
        names: tuple[str, ...],
        offsets: tuple[tuple[str, int, int], ...],
        inputs: tuple[Array, ...],
    ) -> Array:
        """`nstep` substeps (0: the forward stages only), then the final stages if `final`: one env's packed
        `offsets` fields."""

    @abstractmethod
    def contacts(
        self, engine: NativeEngine, names: tuple[str, ...], shapes: tuple[Any, ...], inputs: tuple[Array, ...]
    ) -> tuple[Array, ...]:
        """One env's contact table, `engine.contact_rows` rows of `CONTACT_FIELDS`."""

    @abstractmethod
    def clock(self, engine: NativeEngine) -> HostClock | FfiClock:
        """The time spent in the host work."""


@dataclass(frozen=True)
class Callbacks(Transport):
    """Python host callbacks (`jax.pure_callback`) into `mujoco.batch`: works wherever MuJoCo does."""

    def step(
        self,
        engine: NativeEngine,
        nstep: int,
        final: bool,
        names: tuple[str, ...],
        offsets: tuple[tuple[str, int, int], ...],
        inputs: tuple[Array, ...],
    ) -> Array:
        host = functools.partial(engine._host, nstep, final, names, offsets)
        result = jax.ShapeDtypeStruct((offsets[-1][2],), jnp.float32)
        return jax.pure_callback(host, result, *inputs, vmap_method="broadcast_all")

    def contacts(
        self, engine: NativeEngine, names: tuple[str, ...], shapes: tuple[Any, ...], inputs: tuple[Array, ...]
    ) -> tuple[Array, ...]:
        host = functools.partial(engine._contacts_host, names)
        return tuple(jax.pure_callback(host, shapes, *inputs, vmap_method="broadcast_all"))

    def clock(self, engine: NativeEngine) -> HostClock:
        return engine._callback_clock


@dataclass(frozen=True)
class FfiCalls(Transport):
    """XLA FFI custom calls into the C++ extension (KsimNativeStep, KsimNativeContacts in native_ffi.cc): no
    Python in a step, and programs the persistent compilation cache keeps."""

    def step(
        self,
        engine: NativeEngine,
        nstep: int,
        final: bool,
        names: tuple[str, ...],
        offsets: tuple[tuple[str, int, int], ...],
        inputs: tuple[Array, ...],
    ) -> Array:
        if any("." in name for name in names):  # MjOption's fields: not in native_ffi.cc's table of arrays
            raise ConfigError("physics_impl='mujoco' through FFI randomizes MjModel array fields only")
        stage = engine._final_stage if final or nstep == 0 else int(mujoco.mjtStage.mjSTAGE_NONE)
        call = jax.ffi.ffi_call(
            native_ffi.STEP_TARGET,
            jax.ShapeDtypeStruct((offsets[-1][2],), jnp.float32),
            vmap_method="broadcast_all",
        )
        return call(
            *inputs,
            **self.attributes(engine, names),
            outputs=",".join(name for name, _, _ in offsets),
            nstep=np.int64(nstep),
            stage=np.int64(stage),
        )

    def contacts(
        self, engine: NativeEngine, names: tuple[str, ...], shapes: tuple[Any, ...], inputs: tuple[Array, ...]
    ) -> tuple[Array, ...]:
        call = jax.ffi.ffi_call(native_ffi.CONTACTS_TARGET, shapes, vmap_method="broadcast_all")
        return tuple(call(*inputs, **self.attributes(engine, names)))

    def clock(self, engine: NativeEngine) -> FfiClock:
        return FfiClock(*engine._ffi)

    @staticmethod
    def attributes(engine: NativeEngine, names: tuple[str, ...]) -> dict[str, Any]:
        """What both handlers are told: the model's key, the state row's fields, the randomized fields, threads."""
        return {
            "model": engine._ffi[1],
            "state": ",".join(STATE),
            "fields": ",".join(names),
            "nthread": np.int64(engine.nthread),
        }


@dataclass(frozen=True)
class NativeEngine(PhysicsEngine):
    """The model in C MuJoCo; `contact_rows` rows of each env's contact table (the deepest contacts first)."""

    contact_rows: int = DEFAULT_CONTACT_ROWS
    nthread: int = 1
    transport: Transport = Callbacks()  # FfiCalls() where the C++ extension loads (create_native)
    physics_impl = "mujoco"
    # A refill's cost is mostly its fixed part (the JAX program around the callback, the crossing), not the C
    # forward calls, so one refill of every env is cheaper than several chunks.
    refill_fraction = 1.0

    @property
    def field_defaults(self) -> ModelDefaults:
        return ModelDefaults(self.mj_model)

    @functools.cached_property
    def _batches(self) -> _Pool[_Sims]:
        return _Pool()

    @functools.cached_property
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return field_shapes(self.mj_model)

    @functools.cached_property
    def host_clock(self) -> HostClock | FfiClock:
        """Time in the physics' host callbacks (or FFI handlers), the C MuJoCo steps and their copies in and out
        (benchmarks read it to split a train step)."""
        return self.transport.clock(self)

    @functools.cached_property
    def _callback_clock(self) -> HostClock:
        return HostClock()

    @functools.cached_property
    def _ffi(self) -> tuple[native_ffi.FfiLibrary, str]:
        """The extension and this model's key in it (registered on first use, as a batch copies the model then)."""
        library = native_ffi.load()
        if isinstance(library, str):
            raise RuntimeError(f"the native FFI engine cannot run: {library}")
        return library, library.register_model(self.mj_model)

    @property
    def _final_stage(self) -> int:
        stage = mujoco.mjtStage.mjSTAGE_ACC if self.has_acceleration_sensors else mujoco.mjtStage.mjSTAGE_VEL
        return int(stage)

    # ----- the host side -------------------------------------------------------------------------------------

    def _offsets(self, names: tuple[str, ...]) -> tuple[tuple[str, int, int], ...]:
        """(name, start, end) of each field in a packed row of `names`, each field flattened."""
        sizes = [math.prod(self._shapes[name]) for name in names]
        ends = np.cumsum(sizes)
        return tuple((name, int(end - size), int(end)) for name, end, size in zip(names, ends, sizes, strict=True))

    @functools.cached_property
    def _state_offsets(self) -> tuple[tuple[str, int, int], ...]:
        return self._offsets(STATE)

    def _host_inputs(
        self, names: tuple[str, ...], arrays: tuple[np.ndarray, ...]
    ) -> tuple[tuple[int, ...], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """A callback's inputs, the packed state rows and then the randomized fields `names`: the callers' leading
        shape, each state field's (n, ...) view, and each field's (n, ...) values (with `body_subtreemass`)."""
        lead = arrays[0].shape[:-1]
        n = math.prod(lead)
        rows = _flat(arrays[0], lead, n)
        state = {name: rows[:, a:b].reshape((n, *self._shapes[name])) for name, a, b in self._state_offsets}
        fields = {name: _flat(a, lead, n) for name, a in zip(names, arrays[1:], strict=True)}
        return lead, state, with_subtree_mass(self.mj_model, fields)

    def _host(
        self,
        nstep: int,
        final: bool,
        names: tuple[str, ...],
        outputs: tuple[tuple[str, int, int], ...],
        *arrays: np.ndarray,
    ) -> np.ndarray:
        """Writes the envs' packed state and their fields into a batch, runs `nstep` substeps (0: the forward
        stages only), computes the stages at the final state if `final`, and reads the `outputs` fields back into
        their places (`_offsets`) in one float32 row per env (in the callers' leading shape)."""
        with self._callback_clock.timing():
            lead, state, fields = self._host_inputs(names, arrays)
            n = math.prod(lead)
            packed = np.empty((n, outputs[-1][2]), np.float32)
            failed: Sequence[int] = ()
            make = functools.partial(_Sims, self.mj_model, n, self.nthread)
            with self._batches.take(make, fits=lambda s: s.nsim >= n, cost=lambda s: s.nsim) as sims:
                for name, values in state.items():
                    sims.arrays[name][:n] = values
                sims.write_fields(self.mj_model, n, fields)
                ids = None if n == sims.nsim else np.arange(n)
                try:
                    if nstep == 0:
                        sims.batch.forward(ids, self._final_stage)
                    else:
                        stage = self._final_stage if final else int(mujoco.mjtStage.mjSTAGE_NONE)
                        sims.batch.step(ids, nstep, stage)
                except mujoco.batch.SimulationError as error:
                    failed = list(error.ids)
                for name, a, b in outputs:
                    packed[:, a:b] = sims.arrays[name][:n].reshape(n, b - a)
            if failed:  # MuJoCo refused to step them: a NaN state ends their episodes (`physics_diverged`)
                packed[np.asarray(failed)] = np.nan
            return packed.reshape((*lead, packed.shape[1]))

    def _packed_state(self, data: NativeData) -> Array:
        """One env's state in one float32 row: a callback's inputs and outputs cost per array crossed."""
        return jnp.concatenate([jnp.ravel(jnp.asarray(getattr(data, name), jnp.float32)) for name in STATE])

    def _call(self, nstep: int, final: bool, data: NativeData, outputs: tuple[str, ...]) -> dict[str, Array]:
        names = tuple(sorted(data.fields))
        unknown = [name for name in names if name not in mujoco.batch.MODEL_FIELDS]
        if unknown:
            raise ConfigError(f"physics_impl='mujoco' cannot randomize the model fields {', '.join(unknown)}")
        offsets = self._offsets(outputs)
        inputs = (self._packed_state(data), *(jnp.asarray(data.fields[name], jnp.float32) for name in names))
        packed = self.transport.step(self, nstep, final, names, offsets, inputs)
        return {name: packed[a:b].reshape(self._shapes[name]) for name, a, b in offsets}

    # ----- the engine interface ------------------------------------------------------------------------------

    def _blank(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None) -> NativeData:
        zeros = {name: jnp.zeros(shape, jnp.float32) for name, shape in self._shapes.items()}
        zeros.update(qpos=jnp.asarray(qpos, jnp.float32), qvel=jnp.asarray(qvel, jnp.float32))
        return NativeData(**zeros, fields=dict(fields or {}))

    def make_data(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None = None) -> NativeData:
        """`mj_forward`'s position and velocity stages at the pose (the whole `mj_forward` with acceleration
        sensors), from zero activations, controls, warm start and time."""
        data = self._blank(qpos, qvel, fields)
        return data.replace(**self._call(0, True, data, DERIVED))

    def step(
        self, data: NativeData, control: Callable[[NativeData], Array], fields: dict[str, Array] | None = None
    ) -> tuple[NativeData, Array]:
        """`num_substeps` calls of `mj_step`, the control evaluated before each from the state it starts from;
        the derived fields are then computed at the final state. A control that does not read the state (torques,
        the model's own servos) is evaluated once, and all substeps are one call."""
        data = data.replace(fields=dict(fields or {}))
        everything = (*STATE, *DERIVED)
        if not reads_state(control, data):
            data = data.replace(ctrl=jnp.asarray(control(data), jnp.float32))
            return data.replace(**self._call(self.num_substeps, True, data, everything)), data.ctrl

        def substep(data: NativeData, _: None) -> tuple[NativeData, None]:
            data = data.replace(ctrl=jnp.asarray(control(data), jnp.float32))
            return data.replace(**self._call(1, False, data, STATE)), None

        data, _ = jax.lax.scan(substep, data, None, length=self.num_substeps - 1)
        data = data.replace(ctrl=jnp.asarray(control(data), jnp.float32))
        return data.replace(**self._call(1, True, data, everything)), data.ctrl

    def velocities_changed(self, data: NativeData, fields: dict[str, Array] | None = None) -> NativeData:
        """The derived fields recomputed for the new velocities (a step reads only the state, so a program
        that steps right after drops this callback)."""
        data = data.replace(fields=dict(fields or {}))
        return data.replace(**self._call(0, True, data, DERIVED))

    def contacts(self, data: NativeData) -> Contacts:
        names = tuple(sorted(data.fields))
        rows = self.contact_rows
        shapes = (
            jax.ShapeDtypeStruct((rows,), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
            jax.ShapeDtypeStruct((rows, 3), jnp.float32),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
        )
        inputs = (self._packed_state(data), *(jnp.asarray(data.fields[name], jnp.float32) for name in names))
        return Contacts(*self.transport.contacts(self, names, shapes, inputs))

    @functools.cached_property
    def _scratches(self) -> _Pool[_Scratch]:
        return _Pool()

    def _contacts_host(self, names: tuple[str, ...], *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each env's contacts: `mj_forward` of its state in a model and data of the engine's own."""
        with self._callback_clock.timing():
            lead, state, fields = self._host_inputs(names, arrays)
            with self._scratches.take(functools.partial(_Scratch, self.mj_model)) as scratch:
                scratch.restore_except(self.mj_model, tuple(fields))
                return self._contact_table(scratch.model, scratch.data, state, list(fields.items()), lead)

    def _contact_table(
        self,
        model: mujoco.MjModel,
        mj_data: mujoco.MjData,
        state: dict[str, np.ndarray],
        fields: list[tuple[str, np.ndarray]],
        lead: tuple[int, ...],
    ) -> tuple[np.ndarray, ...]:
        n = math.prod(lead)
        # Every env's state as one float64 row in the order of `mj_setState`'s spec (its elements by bit).
        rows = np.concatenate([state[name].reshape(n, -1) for name in STATE_SPEC_ORDER], axis=1, dtype=np.float64)
        found = _ContactLists()
        for env in range(n):
            for name, values in fields:
                getattr(model, name)[...] = values[env]
            mujoco.mj_setState(model, mj_data, rows[env], STATE_SPEC)
            mujoco.mj_forward(model, mj_data)
            found.add(env, mj_data)
        table = found.table(n, self.contact_rows, int(model.opt.cone) == mujoco.mjtCone.mjCONE_PYRAMIDAL)
        return tuple(t.reshape((*lead, *t.shape[1:])) for t in table)


def with_subtree_mass(mj_model: mujoco.MjModel, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`fields` and, where they randomize `body_mass`, each env's `body_subtreemass`: C MuJoCo divides by that
    constant (`mj_setConst` derives it) where MJX sums the masses it is given, for the subtrees' centres of mass."""
    if "body_mass" not in fields:
        return fields
    subtree = np.array(fields["body_mass"], np.float64)
    for body in range(mj_model.nbody - 1, 0, -1):  # MuJoCo numbers every body after its parent
        subtree[:, mj_model.body_parentid[body]] += subtree[:, body]
    return {**fields, "body_subtreemass": subtree}


def reads_state(control: Callable[[NativeData], Array], data: NativeData) -> bool:
    """Whether `control`'s result depends on the data it is given (traced once: the dependencies of its
    outputs, walked back through its equations to its inputs)."""
    leaves, treedef = jax.tree.flatten(data)
    jaxpr = jax.make_jaxpr(lambda *leaves: control(jax.tree.unflatten(treedef, leaves)))(*leaves).jaxpr
    needed = {v for v in jaxpr.outvars if isinstance(v, jax.extend.core.Var)}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed |= {v for v in eqn.invars if isinstance(v, jax.extend.core.Var)}
    return any(v in needed for v in jaxpr.invars)


class _ContactLists:
    """Every env's contact list, gathered env by env with as few Python steps as possible, then sorted and cut
    into the fixed-size table for all envs at once."""

    def __init__(self) -> None:
        self.envs: list[np.ndarray] = []
        self.geoms: list[np.ndarray] = []
        self.dists: list[np.ndarray] = []
        self.pos: list[np.ndarray] = []
        self.addresses: list[np.ndarray] = []
        self.dims: list[np.ndarray] = []
        self.efc: list[np.ndarray] = []
        self.efc_count = 0

    def add(self, env: int, data: mujoco.MjData) -> None:
        ncon = int(data.ncon)
        if ncon == 0:
            return
        contact = data.contact
        self.envs.append(np.full(ncon, env, np.intp))
        self.geoms.append(contact.geom.copy())
        self.dists.append(contact.dist.copy())
        self.pos.append(contact.pos.copy())
        address = contact.efc_address.astype(np.intp)
        self.addresses.append(np.where(address >= 0, address + self.efc_count, -1))
        self.dims.append(contact.dim.copy())
        efc = data.efc_force.copy()
        self.efc.append(efc)
        self.efc_count += len(efc)

    def table(self, n: int, rows: int, pyramidal: bool) -> tuple[np.ndarray, ...]:
        """The deepest `rows` contacts of each env (ties in their list's order); the normal force as
        `mj_contactForce` gives it (a pyramidal cone's facets each push along the normal by their whole force)."""
        geom1, geom2 = np.full((n, rows), -1, np.int32), np.full((n, rows), -1, np.int32)
        dist, pos, normal_force = (
            np.ones((n, rows), np.float32),
            np.zeros((n, rows, 3), np.float32),
            np.zeros((n, rows), np.float32),
        )
        if not self.envs:
            return geom1, geom2, dist, pos, normal_force
        envs, dists = np.concatenate(self.envs), np.concatenate(self.dists)
        order = np.lexsort((dists, envs))  # by env, then by depth; stable
        envs, dists = envs[order], dists[order]
        starts = np.searchsorted(envs, envs, side="left")
        rank = np.arange(len(envs)) - starts
        keep = rank < rows
        order, envs, rank, dists = order[keep], envs[keep], rank[keep], dists[keep]
        geoms = np.concatenate(self.geoms)[order]
        address, dims = np.concatenate(self.addresses)[order], np.concatenate(self.dims)[order]
        facets = np.where(dims == 1, 1, 2 * (dims - 1)) if pyramidal else np.ones_like(dims)
        efc = np.concatenate(self.efc) if self.efc_count else np.zeros(1)
        width = int(facets.max())
        index = address[:, None] + np.arange(width)[None, :]
        used = (np.arange(width)[None, :] < facets[:, None]) & (address[:, None] >= 0)
        forces = np.where(used, efc[np.clip(index, 0, len(efc) - 1)], 0.0).sum(axis=1)
        geom1[envs, rank], geom2[envs, rank] = geoms[:, 0], geoms[:, 1]
        dist[envs, rank] = dists
        pos[envs, rank] = np.concatenate(self.pos)[order]
        normal_force[envs, rank] = forces
        return geom1, geom2, dist, pos, normal_force


def default_threads() -> int:
    """C threads per batch: the machine's cores shared by the process's devices (pmap steps them at once)."""
    return max(1, (os.cpu_count() or 1) // max(1, jax.local_device_count()))


def create_native(
    mj_model: mujoco.MjModel,
    ctrl_dt: float,
    dt: float,
    layout: Any,
    default_qpos: np.ndarray,
    contact_rows: int = DEFAULT_CONTACT_ROWS,
) -> NativeEngine:
    """The native engine of the model: FFI calls where the extension loads, else Python callbacks (said once)."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        raise ConfigError(
            f"physics_impl='mujoco' runs on CPU devices only, not on {device}; choose physics_impl='jax' or 'warp'"
        )
    try:
        probe = mujoco.batch.Batch(mj_model, 1, 1)
        probe.forward()
    except (ValueError, mujoco.FatalError, mujoco.batch.SimulationError) as error:
        raise ConfigError(f"MuJoCo cannot run this model: {str(error).splitlines()[0]}") from None
    library = native_ffi.load()
    if isinstance(library, str):
        note = native_ffi.fallback_note(library)
        if note:
            print(note, flush=True)
    transport = Callbacks() if isinstance(library, str) else FfiCalls()
    return NativeEngine(mj_model, ctrl_dt, dt, default_qpos, layout, contact_rows, default_threads(), transport)
