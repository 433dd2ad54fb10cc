"""physics_impl='mujoco' (C MuJoCo through mujoco.batch): its control step against MuJoCo's own `mj_step` loop
and against the JAX implementation on the MJX contract model (contacts, an equality, tendons, activation, a
push, a randomized field), its contacts against `mj_contactForce`, a train step on 1 and 2 devices, a model
MJX refuses, and the refusals."""

import copy
import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import DistributedBallTask, cartpole_config, distributed_ball_config
from test_mjx_contract import NUM_ENVS, SUBSTEPS, contract_model, engine_run

from examples.cartpole import CartpoleTask
from ksim.config import ConfigError
from ksim.engine import load_mujoco_model
from ksim.physics import create_engine, native_ffi
from ksim.physics.native import STATE, Callbacks, FfiCalls, NativeData, NativeEngine, reads_state
from ksim.task.run_checkpoints import physics_impl_note

MASS_SCALES = np.array([0.7, 1.4])
FFI_REASON = native_ffi.load()
# The engine's two paths for its host work: XLA FFI calls into the C++ extension, and Python host callbacks.
PATHS = [
    pytest.param(True, id="ffi", marks=pytest.mark.skipif(isinstance(FFI_REASON, str), reason=str(FFI_REASON))),
    pytest.param(False, id="callback"),
]


def native_engine(mj_model: mujoco.MjModel, ctrl_dt: float, dt: float, use_ffi: bool) -> NativeEngine:
    """The native engine of the model on one path (FFI calls or Python callbacks)."""
    engine = create_engine(mj_model, ctrl_dt, dt, physics_impl="mujoco")
    assert isinstance(engine, NativeEngine)
    return dataclasses.replace(engine, transport=FfiCalls() if use_ffi else Callbacks())


def starts(mj_model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    qpos = np.tile(mj_model.qpos0, (NUM_ENVS, 1)).astype(np.float32)
    qpos[:, 7:] = rng.uniform(-0.3, 0.3, (NUM_ENVS, mj_model.nq - 7))
    qvel = rng.uniform(-0.5, 0.5, (NUM_ENVS, mj_model.nv)).astype(np.float32)
    mass = np.tile(mj_model.body_mass, (NUM_ENVS, 1)).astype(np.float32)
    mass[:, 1] *= MASS_SCALES
    push = np.zeros((mj_model.nbody, 6), np.float32)
    push[1] = rng.normal(size=6)
    return qpos, qvel, mass, push


def law(qpos: np.ndarray, qvel: np.ndarray, xp: object = np) -> np.ndarray:
    """A control of the state that float32 NumPy and XLA compute alike (no transcendental functions)."""
    return xp.concatenate([xp.clip(-2.0 * qpos[7:], -1.0, 1.0), -qvel[6:7]])  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module", params=PATHS)
def native_steps(request: pytest.FixtureRequest) -> tuple[mujoco.MjModel, NativeData, bool]:
    """Three control steps of each env (a push before the first) on the native engine, on each path."""
    engine = native_engine(contract_model("Euler"), SUBSTEPS * 0.005, 0.005, request.param)
    qpos, qvel, mass, push = starts(engine.mj_model)

    def one(qpos: jax.Array, qvel: jax.Array, mass: jax.Array) -> NativeData:
        fields = {"body_mass": mass}
        data = engine.make_data(qpos, qvel, fields)
        data = engine.velocities_changed(data.replace(qvel=data.qvel.at[0].add(0.3)), fields)
        data = data.replace(xfrc_applied=jnp.asarray(push))
        for _ in range(3):
            data = engine.step(data, lambda d: law(d.qpos, d.qvel, jnp), fields)[0]
        return data

    return engine.mj_model, jax.jit(jax.vmap(one))(qpos, qvel, mass), request.param


def descends(model: mujoco.MjModel, body: int, ancestor: int) -> bool:
    while body != ancestor and body != 0:
        body = int(model.body_parentid[body])
    return body == ancestor


def reference(mj_model: mujoco.MjModel, env: int) -> mujoco.MjData:
    """MuJoCo's own loop: `mj_step` from the state rounded to float32 at each substep, as the JAX state holds
    it, then `mj_forward` at the final state (the engine computes those fields before rounding the state)."""
    qpos, qvel, mass, push = starts(mj_model)
    model = copy.copy(mj_model)
    model.body_mass[:] = mass[env]
    for body in range(model.nbody):  # the subtrees' masses follow, as MJX computes them from the masses
        model.body_subtreemass[body] = sum(model.body_mass[b] for b in range(model.nbody) if descends(model, b, body))
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = qpos[env], qvel[env]
    data.qvel[0] += np.float32(0.3)
    data.xfrc_applied[:] = push
    for _ in range(3 * SUBSTEPS):
        for name in ("qpos", "qvel", "act", "qacc_warmstart"):
            getattr(data, name)[:] = np.float32(getattr(data, name))
        data.time = float(np.float32(data.time))
        data.ctrl[:] = law(data.qpos, data.qvel)
        mujoco.mj_step(model, data)
    mujoco.mj_forward(model, data)  # the derived fields of the final state, before it is rounded
    return data


def test_the_control_step_is_mujocos_own_step_loop(native_steps: tuple[mujoco.MjModel, NativeData, bool]) -> None:
    mj_model, native, _ = native_steps
    for env in range(NUM_ENVS):
        expected = reference(mj_model, env)
        for name in (*STATE, "xpos", "xquat", "cvel", "subtree_com", "sensordata"):
            got = np.asarray(getattr(native, name)[env])
            want = np.float32(getattr(expected, name)).reshape(got.shape)  # the final state, rounded as JAX holds it
            np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(native.site_xmat[env], np.float32(expected.site_xmat).reshape(-1, 3, 3))
    assert abs(float(native.qpos[0, 2] - native.qpos[1, 2])) > 1e-4  # the two torso masses move apart
    assert np.any(native.act != 0)  # the filter and the integrated-velocity servo have activations


def test_contacts_are_those_mj_contact_force_reports(native_steps: tuple[mujoco.MjModel, NativeData, bool]) -> None:
    mj_model, native, use_ffi = native_steps
    engine = native_engine(mj_model, SUBSTEPS * 0.005, 0.005, use_ffi)
    table = jax.jit(jax.vmap(engine.contacts))(native)
    for env in range(NUM_ENVS):
        expected = reference(mj_model, env)
        assert expected.ncon > 0
        force = np.zeros(6)
        wanted = []
        for i in range(expected.ncon):
            mujoco.mj_contactForce(mj_model, expected, i, force)
            contact = expected.contact[i]
            wanted.append((contact.dist, contact.geom1, contact.geom2, force[0], *contact.pos))
        wanted.sort()
        rows = len(wanted)
        got = np.stack(
            [table.dist[env, :rows], table.geom1[env, :rows], table.geom2[env, :rows], table.normal_force[env, :rows]],
            axis=1,
        )
        np.testing.assert_allclose(got, np.float32(np.array(wanted)[:, :4]), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(table.pos[env, :rows], np.array(wanted)[:, 4:], atol=1e-5)
        assert np.all(table.geom1[env, rows:] == -1) and np.all(table.normal_force[env, rows:] == 0)
        assert np.any(table.normal_force[env, :rows] > 0)


def test_the_native_step_agrees_with_the_jax_one() -> None:
    """test_mjx_contract's run (a push, a PD control, randomized torso masses) on both implementations."""
    _, native = engine_run("mujoco")
    _, mjx_data = engine_run("jax")
    close = {"atol": 2e-3, "rtol": 2e-3}
    for name in ("qpos", "qvel", "act", "xpos", "subtree_com"):
        np.testing.assert_allclose(getattr(native, name), getattr(mjx_data, name), err_msg=name, **close)


class PgsBallTask(DistributedBallTask):
    """The test ball on MuJoCo's PGS solver, which MJX refuses (its FeetAirTime reads contacts)."""

    def get_mujoco_model(self) -> mujoco.MjModel:
        mj_model = super().get_mujoco_model()
        mj_model.opt.solver = mujoco.mjtSolver.mjSOL_PGS
        return mj_model


def test_a_train_step_on_one_and_two_devices_agrees() -> None:
    """Resets, 9 randomized fields, pushes, commands and a reward that reads contacts (each contacts callback
    on an XLA thread: a per-thread model once crashed here) on a model MJX refuses (the PGS solver); no program
    compiles after the first train step."""
    with pytest.raises(ConfigError, match="MJX"):
        PgsBallTask(distributed_ball_config(physics_impl="jax"))
    compiles: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kwargs: compiles.append(event) if event.startswith("/jax/core/compile/") else None
    )
    results = []
    for devices in (1, 2):
        task = PgsBallTask(distributed_ball_config(num_devices=devices, physics_impl="mujoco"))
        assert task.engine.physics_impl == "mujoco"
        assert task.engine.mj_model.opt.solver == mujoco.mjtSolver.mjSOL_PGS
        state, metrics = task.train_step(task.init_train_state())
        compiled = len(compiles)
        state, metrics = task.train_step(state)
        assert len(compiles) == compiled
        results.append((task.fetch_replicated(state.shared), task.fetch_replicated(metrics)))
    (one, one_metrics), (two, two_metrics) = results
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(one_metrics["loss"], two_metrics["loss"], rtol=1e-4)


def test_a_model_mjx_refuses_steps_natively() -> None:
    mj_model = load_mujoco_model("hopper.xml")
    mj_model.opt.solver = mujoco.mjtSolver.mjSOL_PGS
    with pytest.raises(ConfigError, match="MJX"):
        create_engine(mj_model, 0.02, 0.005, physics_impl="jax")
    engine = create_engine(mj_model, 0.02, 0.005, physics_impl="mujoco")
    data = engine.make_data(jnp.asarray(engine.default_qpos), jnp.zeros(mj_model.nv))
    data, _ = jax.jit(lambda d: engine.step(d, lambda _: jnp.ones(engine.action_dim)))(data)
    assert np.all(np.isfinite(data.qpos)) and float(data.time) == pytest.approx(0.02)


def test_physics_impl_mujoco_on_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax, "local_devices", lambda: [SimpleNamespace(platform="gpu")])
    with pytest.raises(ConfigError, match=r"physics_impl='mujoco' runs on CPU devices only.*'jax' or 'warp'"):
        create_engine(contract_model("Euler"), 0.02, 0.005, physics_impl="mujoco")


@pytest.mark.parametrize("use_ffi", PATHS)
def test_a_control_that_reads_no_state_steps_all_substeps_in_one_call(use_ffi: bool) -> None:
    """Torques (or the model's servos) stay the same over a control step: MuJoCo steps its substeps at once,
    from the state as JAX holds it, like `mj_step` with that control."""
    mj_model = load_mujoco_model("hopper.xml")
    engine = native_engine(mj_model, 0.02, 0.005, use_ffi)
    torque = jnp.linspace(-1.0, 1.0, engine.action_dim)
    probe = engine.make_data(jnp.asarray(engine.default_qpos), jnp.zeros(mj_model.nv))
    assert not reads_state(lambda _: torque, probe)
    assert reads_state(lambda d: -d.qvel[3:], probe)
    data = probe
    for _ in range(2):
        data, ctrl = jax.jit(lambda d: engine.step(d, lambda _: torque))(data)
    np.testing.assert_array_equal(ctrl, torque)
    expected = mujoco.MjData(mj_model)
    expected.qpos[:] = np.float32(engine.default_qpos)
    for _ in range(2):
        expected.ctrl[:] = np.asarray(torque)
        mujoco.mj_step(mj_model, expected, nstep=engine.num_substeps)
        for name in ("qpos", "qvel", "qacc_warmstart"):
            getattr(expected, name)[:] = np.float32(getattr(expected, name))
    for name in ("qpos", "qvel", "qacc_warmstart"):
        np.testing.assert_array_equal(getattr(data, name), np.float32(getattr(expected, name)), err_msg=name)


@pytest.mark.parametrize("use_ffi", PATHS)
def test_the_host_clock_counts_the_steps_and_contacts_callbacks(use_ffi: bool) -> None:
    """`host_clock` (what benchmarks split a train step by) grows with each kind of host call a program runs."""
    mj_model = load_mujoco_model("hopper.xml")
    engine = native_engine(mj_model, 0.02, 0.005, use_ffi)
    data = engine.make_data(jnp.asarray(engine.default_qpos), jnp.zeros(mj_model.nv))
    torque = jnp.zeros(engine.action_dim)
    for program in (lambda d: engine.step(d, lambda _: torque)[0].qpos, lambda d: engine.contacts(d).dist):
        before = engine.host_clock.seconds
        jax.block_until_ready(jax.jit(program)(data))
        assert engine.host_clock.seconds > before


@pytest.mark.parametrize("use_ffi", PATHS)
def test_a_refill_computes_every_used_start_in_one_call(use_ffi: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A native refill costs mostly its fixed part (the program around the callback, the crossing), so one call
    computes every used start (MJX's refills take an eighth of the envs at a time), each the start that its env
    and episode always get."""
    calls: list[int] = []
    host = NativeEngine._host

    def counted(self: NativeEngine, nstep: int, *args: object) -> np.ndarray:
        calls.append(nstep)
        return host(self, nstep, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(NativeEngine, "_host", counted)
    if not use_ffi:
        monkeypatch.setenv(native_ffi.OFF_VARIABLE, "0")
    task = CartpoleTask(cartpole_config(physics_impl="mujoco"))
    assert isinstance(task.engine, NativeEngine) and isinstance(task.engine.transport, FfiCalls) == use_ffi
    env = jax.block_until_ready(task.init_train_state().env)  # its calls are counted before the refill's
    assert not np.any(np.asarray(env.next_start_ready))
    if use_ffi:
        library, key = task.engine._ffi
        before = [library.calls(key, kind) for kind in (native_ffi.FORWARD_CALLS, native_ffi.STEP_CALLS)]
    filled = jax.block_until_ready(jax.jit(task.env_pool.refill_next_starts)(env))
    if use_ffi:
        after = [library.calls(key, kind) for kind in (native_ffi.FORWARD_CALLS, native_ffi.STEP_CALLS)]
        calls = [0] * (after[0] - before[0]) + [1] * (after[1] - before[1])
    assert calls == [0]  # one forward call for all the envs
    keys = jax.vmap(jax.random.fold_in)(env.reset_key, env.episodes_started)
    expected = jax.vmap(task.environment.start_episode)(keys)
    np.testing.assert_allclose(filled.next_start.obs, expected.obs, atol=1e-6)  # compiled apart: fused apart
    np.testing.assert_allclose(filled.next_start.data.qpos, expected.data.qpos, atol=1e-6)


def test_resuming_with_another_physics_impl_says_so_in_one_line() -> None:
    note = physics_impl_note({"physics_impl": "jax"}, {"physics_impl": "mujoco"})
    assert note is not None and "\n" not in note
    assert "physics_impl='jax'" in note and "physics_impl='mujoco'" in note
    assert physics_impl_note({"physics_impl": "mujoco"}, {"physics_impl": "mujoco"}) is None
    assert physics_impl_note({}, {"physics_impl": "mujoco"}) is None  # written before the field existed
