"""The native engine's XLA FFI path (ksim/physics/ffi/native_ffi.cc) against its Python-callback path: the same
bits for make_data, velocities_changed, PD and torque control steps, randomized fields (and fields dropped between
calls), pushes, failed simulations and the contact table (pyramidal cones of 1, 3 and 6 dimensions, elliptic
cones); its programs reach the persistent compilation cache; the loader's refusals and the build's failures
each say why in one line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from ksim.physics import build_ffi, create_engine, native, native_ffi
from ksim.physics.native import Callbacks, FfiCalls, NativeEngine, create_native

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    isinstance(native_ffi.load(), str), reason=f"the FFI extension is not available: {native_ffi.load()}"
)

BOXES = """
<mujoco>
  <size memory="{memory}"/>
  <option cone="{cone}"/>
  <worldbody>
    <geom type="plane" size="5 5 .1" condim="3"/>
    <body name="slider" pos="0 0 .2">
      <joint name="lift" type="slide" axis="0 0 1"/>
      <joint name="swing" type="hinge" axis="0 1 0"/>
      <geom type="capsule" size=".05 .2" condim="6"/>
    </body>
    <body name="box" pos=".6 0 .15">
      <freejoint/>
      <geom type="box" size=".1 .1 .1" condim="1"/>
      <body pos="0 0 .2">
        <joint name="elbow" type="hinge" axis="1 0 0" damping=".1"/>
        <geom type="sphere" size=".08" condim="4"/>
      </body>
    </body>
    <body name="ball" pos="-.6 0 .1">
      <freejoint/>
      <geom type="sphere" size=".1"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="lift" gear="20"/>
    <motor joint="swing"/>
    <position joint="elbow" kp="5"/>
  </actuator>
  <sensor>
    <jointpos joint="elbow"/>
    <framepos objtype="body" objname="box"/>
  </sensor>
</mujoco>
"""


def boxes_engine(cone: str = "pyramidal", memory: str = "1M") -> NativeEngine:
    mj_model = mujoco.MjModel.from_xml_string(BOXES.format(cone=cone, memory=memory))
    engine = create_engine(mj_model, 0.02, 0.005, physics_impl="mujoco")
    assert isinstance(engine, NativeEngine)
    return engine


def both(engine: NativeEngine) -> tuple[NativeEngine, NativeEngine]:
    """The engine on the callback path and on the FFI path."""
    return dataclasses.replace(engine, transport=Callbacks()), dataclasses.replace(engine, transport=FfiCalls())


def assert_same_bits(a: Any, b: Any) -> None:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))


def starts(engine: NativeEngine, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    m = engine.mj_model
    rng = np.random.default_rng(seed)
    return {
        "qpos": (m.qpos0 + rng.normal(0, 0.05, (n, m.nq))).astype(np.float32),
        "qvel": rng.normal(0, 1.0, (n, m.nv)).astype(np.float32),
        "mass": (m.body_mass * rng.uniform(0.7, 1.3, (n, m.nbody))).astype(np.float32),
        "friction": (m.geom_friction * rng.uniform(0.5, 1.5, (n, m.ngeom, 1))).astype(np.float32),
        "damping": (m.dof_damping + rng.uniform(0, 0.5, (n, m.nv))).astype(np.float32),
        "push": rng.normal(0, 2.0, (n, m.nbody, 6)).astype(np.float32),
    }


def rollout(engine: NativeEngine) -> Callable[..., Any]:
    """make_data, a kick (velocities_changed), a push, PD-controlled and torque steps with randomized fields, a
    step whose fields drop one that the earlier calls randomized, and the contacts of each state."""

    def one(
        qpos: jax.Array, qvel: jax.Array, mass: jax.Array, friction: jax.Array, damping: jax.Array, push: jax.Array
    ):
        fields = {"body_mass": mass, "geom_friction": friction, "dof_damping": damping}
        data = engine.make_data(qpos, qvel, fields)
        states, tables = [data], [engine.contacts(data)]
        data = engine.velocities_changed(data.replace(qvel=data.qvel.at[0].add(0.5)), fields)
        data = data.replace(xfrc_applied=push)
        for _ in range(3):
            data, _ = engine.step(data, lambda d: jnp.clip(-3.0 * d.qpos[:3] - 0.3 * d.qvel[:3], -1, 1), fields)
            states.append(data)
            tables.append(engine.contacts(data))
        data, _ = engine.step(data, lambda _: jnp.array([0.5, -0.2, 0.1]), fields)
        states.append(data)
        fewer = {"body_mass": mass}  # geom_friction and dof_damping back to the model's own
        data, _ = engine.step(data, lambda d: jnp.clip(-d.qvel[:3], -1, 1), fewer)
        states.append(data)
        tables.append(engine.contacts(data))
        return states, tables

    return one


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_the_ffi_path_gives_the_callbacks_bits(cone: str) -> None:
    engine = boxes_engine(cone)
    x = starts(engine, 6)
    args = (x["qpos"], x["qvel"], x["mass"], x["friction"], x["damping"], x["push"])
    callback, ffi = (jax.jit(jax.vmap(rollout(e)))(*args) for e in both(engine))
    assert_same_bits(ffi, callback)
    _, tables = ffi
    assert np.any(np.asarray(tables[-1].geom1) >= 0) and np.any(np.asarray(tables[-1].normal_force) > 0)
    touching = {int(g) for table in tables for g in np.asarray(table.geom2).ravel()}
    assert {1, 2, 4} <= touching  # the capsule (condim 6: 10 facets), the box (condim 1) and the ball (condim 3)


def test_the_ffi_path_under_nested_vmap_and_for_one_env() -> None:
    """Two leading axes (nested vmap), and a call of one env outside vmap, as the callbacks compute them."""
    engine = boxes_engine()
    x = starts(engine, 4, seed=1)
    args = tuple(
        a.reshape(2, 2, *a.shape[1:]) for a in (x["qpos"], x["qvel"], x["mass"], x["friction"], x["damping"], x["push"])
    )
    nested = [jax.jit(jax.vmap(jax.vmap(rollout(e))))(*args) for e in both(engine)]
    assert_same_bits(nested[1], nested[0])
    single = [jax.jit(rollout(e))(*(a[0, 0] for a in args)) for e in both(engine)]
    assert_same_bits(single[1], single[0])
    assert_same_bits(single[1], jax.tree.map(lambda a: a[0, 0], nested[1]))


def test_the_state_row_is_defined_once_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ handlers take the packed row's fields and order from the call (native.STATE): reordered in Python
    alone, the FFI path gives the same bits."""
    x = starts(boxes_engine(), 3, seed=2)
    args = (x["qpos"], x["qvel"], x["mass"], x["friction"], x["damping"], x["push"])
    ffi = dataclasses.replace(boxes_engine(), transport=FfiCalls())
    expected = jax.jit(jax.vmap(rollout(ffi)))(*args)
    monkeypatch.setattr(native, "STATE", tuple(reversed(native.STATE)))
    reordered = dataclasses.replace(boxes_engine(), transport=FfiCalls())
    assert_same_bits(jax.jit(jax.vmap(rollout(reordered)))(*args), expected)


def test_a_simulation_mujoco_refuses_comes_back_as_nan_on_both_paths() -> None:
    """A tiny arena: one env's step overflows MuJoCo's stack (the one at the model's pose, as it happens), and its
    row is NaN; the other's (its free bodies moved to the origin) is not."""
    engine = boxes_engine(memory="8K")
    m = engine.mj_model
    qpos = np.stack([m.qpos0, m.qpos0]).astype(np.float32)
    for joint in np.flatnonzero(m.jnt_type == mujoco.mjtJoint.mjJNT_FREE):
        qpos[1, m.jnt_qposadr[joint] : m.jnt_qposadr[joint] + 3] = 0  # both free bodies at the origin

    def program(e: NativeEngine) -> Any:
        def one(qpos: jax.Array) -> Any:
            data = e.make_data(qpos, jnp.zeros(m.nv))
            return e.step(data, lambda _: jnp.zeros(e.action_dim))[0]

        return jax.jit(jax.vmap(one))(jnp.asarray(qpos))

    callback, ffi = (program(e) for e in both(engine))
    assert_same_bits(ffi, callback)
    assert np.all(np.isnan(ffi.qpos[0])) and np.all(np.isnan(ffi.sensordata[0])) and np.all(np.isfinite(ffi.qpos[1]))


def test_the_ffi_calls_and_clock_are_counted() -> None:
    """One forward call for make_data, one call per substep of a PD step, one for a torque step, one for the
    contacts; the clock grows."""
    engine = dataclasses.replace(boxes_engine(), transport=FfiCalls())
    library, key = engine._ffi
    counts = [library.calls(key, kind) for kind in range(3)]
    seconds = engine.host_clock.seconds
    data = jax.block_until_ready(
        jax.jit(engine.make_data)(jnp.asarray(engine.mj_model.qpos0), jnp.zeros(engine.mj_model.nv))
    )
    jax.jit(lambda d: engine.step(d, lambda d: -d.qvel[:3])[0].qpos)(data).block_until_ready()
    jax.jit(lambda d: engine.step(d, lambda _: jnp.ones(3))[0].qpos)(data).block_until_ready()
    jax.jit(lambda d: engine.contacts(d).dist)(data).block_until_ready()
    added = [library.calls(key, kind) - before for kind, before in enumerate(counts)]
    assert added == [1, engine.num_substeps + 1, 1]
    assert engine.host_clock.seconds > seconds


CACHE_PROBE = """
import sys, jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
import dataclasses
from ksim.engine import load_mujoco_model
from ksim.physics import create_engine
from ksim.physics.native import Callbacks, FfiCalls
from ksim.task.programs import CacheEvents
engine = dataclasses.replace(create_engine(load_mujoco_model("hopper.xml"), 0.02, 0.005, physics_impl="mujoco"),
                             transport=FfiCalls() if sys.argv[2] == "ffi" else Callbacks())
def one(qpos):
    data = engine.make_data(qpos, jnp.zeros(engine.mj_model.nv))
    data = engine.step(data, lambda d: -d.qvel[3:])[0]
    return data.qpos, engine.contacts(data).dist
events = CacheEvents.get()
lowered = jax.jit(jax.vmap(one)).lower(jnp.tile(jnp.asarray(engine.default_qpos), (4, 1)))
before = events.this_thread()
lowered.compile()
print("hits, misses:", *(after - first for after, first in zip(events.this_thread(), before)))
"""


@pytest.mark.parametrize("path", ["ffi", "callback"])
def test_ffi_programs_reach_the_persistent_cache(path: str, tmp_path: Path) -> None:
    """A second process loads the FFI program from the persistent cache; the callback program is never written."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", CACHE_PROBE, str(tmp_path), path],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    lines = [next(line for line in run.splitlines() if line.startswith("hits, misses:")) for run in runs]
    if path == "ffi":
        assert lines == ["hits, misses: 0 1", "hits, misses: 1 0"]
    else:
        assert lines == ["hits, misses: 0 0", "hits, misses: 0 0"]  # JAX skips the cache for host callbacks


def test_a_library_built_against_another_mujoco_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_ffi, "_load", native_ffi._open)  # not the process's cached answer
    monkeypatch.setattr(mujoco, "mj_version", lambda: 3003007)
    reason = native_ffi.load()
    assert isinstance(reason, str) and "\n" not in reason
    assert f"built against MuJoCo {mujoco.mjVERSION_HEADER}, this is 3003007" in reason


def test_a_stale_or_missing_library_is_refused_and_the_engine_falls_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(native_ffi, "_load", native_ffi._open)
    monkeypatch.setattr(build_ffi, "build_info", lambda: "source=0123 jaxlib=0.0")
    reason = native_ffi.load()
    assert isinstance(reason, str) and "built from source=" in reason and "not source=0123" in reason
    monkeypatch.setattr(build_ffi, "LIBRARY", tmp_path / "missing.so")
    assert native_ffi.load() == "the FFI extension is not built (make install builds it)"
    monkeypatch.setattr(native_ffi, "_said", set())
    model = boxes_engine()
    engine = create_native(model.mj_model, 0.02, 0.005, model.layout, model.default_qpos)
    assert isinstance(engine.transport, Callbacks)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "physics_impl='mujoco' steps through Python host callbacks (no program caching): the FFI extension is not"
        " built (make install builds it)"
    ]
    monkeypatch.setenv(native_ffi.OFF_VARIABLE, "0")
    monkeypatch.setattr(native_ffi, "_load", lambda: pytest.fail("the variable is read first"))
    assert native_ffi.load() == "KSIM_NATIVE_FFI=0"


@pytest.mark.parametrize("compiler", ["/nonexistent/g++", "false"])
def test_a_failed_build_says_why_and_exits_zero(
    compiler: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No compiler, or one that fails: one line, exit status 0, and the library in place (if any) untouched."""
    before = build_ffi.LIBRARY.stat().st_mtime_ns
    monkeypatch.setenv("CXX", compiler)
    assert build_ffi.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("ksim native FFI: not built (")
    assert out[0].endswith("physics_impl='mujoco' will use Python callbacks")
    assert build_ffi.LIBRARY.stat().st_mtime_ns == before
