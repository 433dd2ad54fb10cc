"""The MJX contract: ksim's control step against `mjx.step`, for every integrator MJX implements, on a small
model with (and without) contacts, a joint equality constraint, a fixed and a spatial tendon, acceleration-stage
sensors, actuators with activation (a filtered servo, an integrated-velocity servo) and external body forces;
and physics_impl='warp' (MJX's Warp implementation, run here on the CPU) against the JAX implementation
(tests/test_physics_impl.py runs it through a task)."""

import importlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from mujoco import mjx

from ksim.config import ConfigError
from ksim.engine import PhysicsEngine
from ksim.physics import create_engine, mjx_contract

MODEL = """
<mujoco>
  <compiler angle="radian"/>
  <option timestep="0.005" integrator="{integrator}" iterations="4" ls_iterations="8">
    <flag contact="{contact}"/>
  </option>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="torso" pos="0 0 0.32">
      <freejoint/>
      <geom type="box" size="0.2 0.1 0.05" mass="3"/>
      <site name="imu"/>
      <body name="arm" pos="0.2 0 0">
        <joint name="shoulder" type="hinge" axis="0 1 0" range="-1 1" damping="0.5"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
        <site name="arm_tip" pos="0.3 0 0"/>
        <body name="forearm" pos="0.3 0 0">
          <joint name="elbow" type="hinge" axis="0 1 0"/>
          <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.025"/>
          <geom name="hand" type="sphere" pos="0.2 0 0" size="0.04"/>
        </body>
      </body>
      <body name="leg" pos="-0.2 0 -0.05">
        <joint name="hip" type="hinge" axis="0 1 0" range="-1 1"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.25" size="0.03"/>
        <geom name="foot" type="sphere" pos="0 0 -0.25" size="0.04"/>
        <site name="foot_site" pos="0 0 -0.25" size="0.05"/>
      </body>
    </body>
  </worldbody>
  <tendon>
    <fixed name="coupling"><joint joint="shoulder" coef="1"/><joint joint="hip" coef="-0.5"/></fixed>
    <spatial name="string" limited="true" range="0 0.9"><site site="arm_tip"/><site site="foot_site"/></spatial>
  </tendon>
  <equality><joint joint1="elbow" joint2="shoulder" polycoef="0 0.5 0 0 0" solref="0.05 1"/></equality>
  <actuator>
    <motor name="shoulder_motor" joint="shoulder" gear="10"/>
    <general joint="hip" dyntype="filter" dynprm="0.05" gainprm="20" biastype="affine" biasprm="0 -20 -1"/>
    <intvelocity joint="elbow" kp="10" actrange="-1 1"/>
    <motor tendon="coupling" gear="5"/>
  </actuator>
  <sensor>
    <accelerometer site="imu"/>
    {touch}
    <actuatorfrc actuator="shoulder_motor"/>
    <gyro site="imu"/>
    <jointpos joint="hip"/>
    <tendonpos tendon="string"/>
    <framepos objtype="site" objname="foot_site"/>
  </sensor>
</mujoco>"""
ACCELERATION_SENSORS = 3  # accelerometer, touch (or a second accelerometer), actuator force: listed first
SUBSTEPS = 4


def contract_model(integrator: str, contact: bool = True, touch: bool = True) -> mujoco.MjModel:
    sensor = '<touch name="foot_touch" site="foot_site"/>' if touch else '<accelerometer site="foot_site"/>'
    xml = MODEL.format(integrator=integrator, contact="enable" if contact else "disable", touch=sensor)
    return mujoco.MjModel.from_xml_string(xml)


def compare(mj_model: mujoco.MjModel) -> None:
    engine = create_engine(mj_model, ctrl_dt=SUBSTEPS * 0.005, dt=0.005, physics_impl="jax")
    rng = np.random.default_rng(0)
    start = mujoco.MjData(mj_model)
    start.qpos[7:] = rng.uniform(-0.3, 0.3, mj_model.nq - 7)
    start.qvel[:] = rng.uniform(-0.5, 0.5, mj_model.nv)
    start.act[:] = rng.uniform(-0.2, 0.2, mj_model.na)
    start.xfrc_applied[1] = rng.normal(size=6)  # a push on the torso: ksim's own body-force path
    mujoco.mj_forward(mj_model, start)
    before_push = mjx.put_data(mj_model, start, impl="jax")
    # An event kicks the torso: ksim is told the velocities changed; the reference starts from MuJoCo's
    # forward of the kicked state.
    start.qvel[:3] += rng.uniform(-0.5, 0.5, 3)
    mujoco.mj_forward(mj_model, start)
    data, kicked = mjx.put_data(mj_model, start, impl="jax"), jnp.asarray(start.qvel, jnp.float32)
    ctrl = jnp.asarray(rng.uniform(-1.0, 1.0, mj_model.nu), jnp.float32)

    def reference(data: mjx.Data) -> mjx.Data:
        data = data.replace(ctrl=ctrl)
        return jax.lax.fori_loop(0, SUBSTEPS, lambda _, d: mjx.step(engine.mjx_model, d), data)

    def control_step(data: mjx.Data) -> mjx.Data:
        return engine.step(engine.velocities_changed(data.replace(qvel=kicked)), lambda _: ctrl)[0]

    ours = jax.jit(control_step)(before_push)
    stepped = jax.jit(reference)(data)
    close = {"atol": 2e-4, "rtol": 2e-3}
    for field in ("qpos", "qvel", "act", "qacc"):
        np.testing.assert_allclose(getattr(ours, field), getattr(stepped, field), err_msg=field, **close)
    # Position- and velocity-stage quantities describe the final state (MuJoCo's forward of it is the
    # reference); acceleration-stage sensors, like qacc, the last substep's start (mjx.step's output).
    final = mujoco.MjData(mj_model)
    final.qpos[:], final.qvel[:], final.act[:], final.ctrl[:] = stepped.qpos, stepped.qvel, stepped.act, ctrl
    mujoco.mj_forward(mj_model, final)
    np.testing.assert_allclose(ours.xpos, final.xpos, err_msg="xpos", **close)
    np.testing.assert_allclose(ours.ten_length, final.ten_length, err_msg="tendon lengths", **close)
    acc_size = int(np.sum(mj_model.sensor_dim[:ACCELERATION_SENSORS]))
    np.testing.assert_allclose(ours.sensordata[acc_size:], final.sensordata[acc_size:], **close)
    np.testing.assert_allclose(ours.sensordata[:acc_size], stepped.sensordata[:acc_size], atol=2e-3, rtol=2e-3)
    assert np.abs(np.asarray(ours.act) - start.act).max() > 1e-4  # activation did change
    assert mjx_contract.constraint_rows(ours) > 0  # limits, contacts, the equality and the tendon limit


# Each integrator once (RK4 with contacts runs in tests/test_public_models.py, on the ant).
@pytest.mark.parametrize(("integrator", "contact"), [("Euler", True), ("implicitfast", True), ("RK4", False)])
def test_control_step_equals_mjx_steps_for_every_integrator(integrator: str, contact: bool) -> None:
    compare(contract_model(integrator, contact=contact, touch=contact))


def test_a_touch_sensor_without_contacts_is_refused() -> None:
    assert [str(r) for r in mjx_contract.refusals(contract_model("Euler", contact=False))] == [
        "touch sensor 'foot_touch' in a model where nothing can collide: remove it, or let geoms collide"
    ]


def test_the_contract_names_its_versions() -> None:
    assert mjx_contract.mjx_version().rsplit(".", 1)[0] in mjx_contract.TESTED_MJX_VERSIONS


def test_warp_without_warp_lang_is_refused_before_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mjx_contract._mjx_warp, "WARP_INSTALLED", False)
    with pytest.raises(ConfigError, match=r"physics_impl='warp' needs warp-lang.*pip install 'ksim\[warp\]'"):
        create_engine(contract_model("Euler"), ctrl_dt=0.02, dt=0.005, physics_impl="warp")


def test_warp_on_a_device_it_cannot_run_on_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mjx_contract._mjx_warp, "WARP_INSTALLED", True)
    with pytest.raises(ConfigError, match=r"runs on a CUDA GPU or the CPU, not on .*tpu.*set physics_impl='jax'"):
        mjx_contract.require_impl("warp", SimpleNamespace(platform="tpu"))  # type: ignore[arg-type]


needs_warp = pytest.mark.skipif(
    not mjx_contract.warp_installed(), reason="warp-lang is not installed (pip install 'ksim[warp]')"
)
NUM_ENVS = 2


def engine_run(impl: str) -> tuple[PhysicsEngine, mjx.Data]:
    """Per env: a start with its own torso mass, a push (velocities changed), then a PD-controlled control step."""
    model = contract_model("Euler")
    engine = create_engine(model, SUBSTEPS * 0.005, 0.005, physics_impl=impl, max_envs=NUM_ENVS)
    mj_model = engine.mj_model
    rng = np.random.default_rng(1)
    qpos = np.tile(mj_model.qpos0, (NUM_ENVS, 1))
    qpos[:, 7:] = rng.uniform(-0.3, 0.3, (NUM_ENVS, mj_model.nq - 7))
    qvel = rng.uniform(-0.5, 0.5, (NUM_ENVS, mj_model.nv))
    mass = np.tile(mj_model.body_mass, (NUM_ENVS, 1))
    mass[:, 1] *= np.array([0.7, 1.4])
    push = np.zeros((mj_model.nbody, 6))
    push[1] = rng.normal(size=6)

    def control(data: mjx.Data) -> jax.Array:
        return jnp.tanh(jnp.concatenate([-2.0 * data.qpos[7:], -data.qvel[6:7]]))

    def one(qpos: jax.Array, qvel: jax.Array, mass: jax.Array) -> mjx.Data:
        fields = {"body_mass": mass}
        data = engine.make_data(qpos, qvel, fields)
        data = engine.velocities_changed(data.replace(qvel=data.qvel.at[0].add(0.3)), fields)
        data = data.replace(xfrc_applied=jnp.asarray(push, jnp.float32))
        return engine.step(data, control, fields)[0]

    args = (jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32), jnp.asarray(mass, jnp.float32))
    return engine, jax.jit(jax.vmap(one))(*args)


@needs_warp
def test_warp_control_step_equals_the_jax_one() -> None:
    warp_engine, warp = engine_run("warp")
    assert warp_engine.mjx_model.impl == mjx.Impl.WARP
    jax_engine, reference = engine_run("jax")
    assert jax_engine.mjx_model.impl == mjx.Impl.JAX
    close = {"atol": 2e-4, "rtol": 2e-3}
    for field in ("qpos", "qvel", "act", "xpos", "ten_length"):
        np.testing.assert_allclose(getattr(warp, field), getattr(reference, field), err_msg=field, **close)
    acc_size = int(np.sum(warp_engine.mj_model.sensor_dim[:ACCELERATION_SENSORS]))
    np.testing.assert_allclose(warp.sensordata[:, acc_size:], reference.sensordata[:, acc_size:], **close)
    assert np.abs(np.diff(np.asarray(reference.qpos[:, 2]))) > 1e-4  # the two torso masses move apart


@needs_warp
def test_warp_is_silent_when_the_solver_spends_its_iteration_budget(capfd: pytest.CaptureFixture[str]) -> None:
    model = contract_model("Euler")
    model.opt.iterations, model.opt.ls_iterations = 1, 1  # a budget every step uses up
    engine = create_engine(model, SUBSTEPS * 0.005, 0.005, physics_impl="warp", max_envs=NUM_ENVS)
    overflow = importlib.import_module("mujoco.mjx.third_party.mujoco_warp._src.types").OverflowType
    warnings = overflow(engine.mjx_model.opt._impl.warn_overflow)
    assert not warnings & (overflow.ITERATIONS | overflow.LS_ITERATIONS)
    assert warnings & overflow.NARROWPHASE and warnings & overflow.NEFC  # lost contacts still warn
    qpos = jnp.tile(jnp.asarray(model.qpos0, jnp.float32), (NUM_ENVS, 1))
    data = jax.vmap(engine.make_data)(qpos, jnp.zeros((NUM_ENVS, model.nv)))
    step = jax.jit(jax.vmap(lambda d: engine.step(d, lambda _: jnp.zeros(model.nu))[0]))
    for _ in range(3):
        data = jax.block_until_ready(step(data))
    assert "iterations limit" not in capfd.readouterr().out
