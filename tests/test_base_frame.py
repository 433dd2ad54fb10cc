"""Base and joint quantities for free, planar and fixed roots, against plain MuJoCo (MjData after mj_forward)."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from mujoco import mjx

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.config import ConfigError
from ksim.engine import ModelLayout, StepContext
from ksim.physics import create_engine
from ksim.physics.mjx_jax import smooth_accelerations
from ksim.resets import RandomJointPositions

LEG = """
      <body name="thigh" pos="0 0 -0.1">
        <joint name="hip" type="hinge" axis="0 1 0" range="-1 1"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.4" size="0.05"/>
        <body name="shin" pos="0 0 -0.4">
          <joint name="knee" type="hinge" axis="0 1 0" range="-1 0"/>
          <geom type="capsule" fromto="0 0 0 0.1 0 -0.4" size="0.04"/>
        </body>
      </body>"""


def model(root: str) -> mujoco.MjModel:
    xml = f"""
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="torso" pos="0 0 1.2">
      {root}
      <geom type="capsule" fromto="-0.2 0 0 0.2 0 0" size="0.08"/>
      {LEG}
    </body>
  </worldbody>
  <actuator><motor joint="hip" gear="50"/><motor joint="knee" gear="50"/></actuator>
</mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


ROOTS = {
    "free": '<freejoint name="root"/>',
    "planar": '<joint name="rootx" type="slide" axis="1 0 0"/><joint name="rootz" type="slide" axis="0 0 1"/>'
    '<joint name="rooty" type="hinge" axis="0 1 0"/>',
    "fixed": "",
}


def random_state(mj_model: mujoco.MjModel, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    qpos = mj_model.qpos0 + rng.uniform(-0.3, 0.3, mj_model.nq)
    if mj_model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE:
        quat = rng.normal(size=4)
        qpos[3:7] = quat / np.linalg.norm(quat)
    return qpos, rng.uniform(-1.0, 1.0, mj_model.nv)


def contexts(kind: str, seed: int = 0) -> tuple[StepContext, mujoco.MjModel, mujoco.MjData]:
    """A context from MJX data at a random state, and MuJoCo's own MjData at that state."""
    mj_model = model(ROOTS[kind])
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    qpos, qvel = random_state(mj_model, seed)
    data = engine.make_data(jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))
    ctx = engine.context(data, data, jnp.zeros(2), jnp.zeros(2), data.ctrl)
    reference = mujoco.MjData(mj_model)
    reference.qpos[:], reference.qvel[:] = qpos, qvel
    mujoco.mj_forward(mj_model, reference)
    return ctx, mj_model, reference


def object_velocity(mj_model: mujoco.MjModel, data: mujoco.MjData, body: int, local: bool) -> np.ndarray:
    velocity = np.zeros(6)
    mujoco.mj_objectVelocity(mj_model, data, mujoco.mjtObj.mjOBJ_XBODY, body, velocity, int(local))
    return velocity  # (angular, linear) of the body frame (XBODY: not the inertial frame)


@pytest.mark.parametrize("kind", ["free", "planar"])
@pytest.mark.parametrize("seed", [0, 1])
def test_base_quantities_match_mujoco(kind: str, seed: int) -> None:
    ctx, mj_model, reference = contexts(kind, seed)
    torso = mj_model.body("torso").id
    assert ctx.layout.base_body == torso and ctx.layout.root_kind == ("free" if kind == "free" else "articulated")
    close = {"atol": 2e-5, "rtol": 1e-4}
    np.testing.assert_allclose(ctx.base_pos, reference.xpos[torso], **close)
    np.testing.assert_allclose(ctx.base_quat, reference.xquat[torso], **close)
    world, local = object_velocity(mj_model, reference, torso, False), object_velocity(mj_model, reference, torso, True)
    np.testing.assert_allclose(ctx.base_ang_vel_world, world[:3], **close)
    np.testing.assert_allclose(ctx.base_lin_vel_world, world[3:], **close)
    np.testing.assert_allclose(ctx.base_ang_vel, local[:3], **close)
    np.testing.assert_allclose(ctx.base_lin_vel, local[3:], **close)
    gravity = reference.xmat[torso].reshape(3, 3).T @ np.array([0.0, 0.0, -1.0])
    np.testing.assert_allclose(ctx.projected_gravity, gravity, **close)
    forward = reference.xmat[torso].reshape(3, 3)[:, 0]
    np.testing.assert_allclose(ctx.base_pitch, np.arctan2(-forward[2], forward[0]), **close)
    shin = mj_model.body("shin").id
    np.testing.assert_allclose(ctx.body_pos(shin), reference.xpos[shin], **close)
    np.testing.assert_allclose(
        ctx.body_lin_vel_world(shin), object_velocity(mj_model, reference, shin, False)[3:], **close
    )


@pytest.mark.parametrize("kind", ["free", "planar", "fixed"])
def test_joints_are_the_non_root_ones_and_named_ones_can_be_any(kind: str) -> None:
    ctx, mj_model, reference = contexts(kind)
    hip, knee = (mj_model.joint(name) for name in ("hip", "knee"))
    np.testing.assert_allclose(ctx.joint_pos, reference.qpos[[hip.qposadr[0], knee.qposadr[0]]], atol=1e-6)
    np.testing.assert_allclose(ctx.joint_vel, reference.qvel[[hip.dofadr[0], knee.dofadr[0]]], atol=1e-6)
    np.testing.assert_allclose(
        obs.JointPosition(joints=("knee",)).bind(ctx.layout).observe(ctx), [reference.qpos[knee.qposadr[0]]]
    )
    if kind == "planar":
        named = obs.JointVelocity(scale=1.0, joints=("rootz", "knee")).bind(ctx.layout).observe(ctx)
        np.testing.assert_allclose(named, reference.qvel[[1, knee.dofadr[0]]], atol=1e-6)


def test_the_base_stays_put_on_a_fixed_root() -> None:
    ctx, _, _ = contexts("fixed")
    assert ctx.layout.root_kind == "fixed" and ctx.layout.root_joints == ()
    np.testing.assert_allclose(ctx.base_pos, [0.0, 0.0, 1.2], atol=1e-6)
    np.testing.assert_allclose(ctx.base_lin_vel_world, 0.0, atol=1e-6)


def test_a_control_step_is_mjx_steps_and_leaves_the_final_state_computed() -> None:
    mj_model = model(ROOTS["planar"])
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    qpos, qvel = random_state(mj_model, 3)
    data = engine.make_data(jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))
    ctrl = jnp.asarray([0.3, -0.2])
    pushes = np.random.default_rng(4).normal(size=(mj_model.nbody, 6))  # external forces take ksim's own path
    data = data.replace(xfrc_applied=jnp.asarray(pushes, jnp.float32))
    stepped, _ = jax.jit(lambda d: engine.step(d, lambda d: ctrl))(data)
    plain = jax.jit(lambda d: jax.lax.fori_loop(0, engine.num_substeps, lambda _, d: mjx.step(engine.mjx_model, d), d))
    expected = plain(data.replace(ctrl=ctrl))
    np.testing.assert_allclose(stepped.qpos, expected.qpos, atol=1e-5)  # the same physics as mjx.step
    np.testing.assert_allclose(stepped.qvel, expected.qvel, atol=1e-4)
    reference = mujoco.MjData(mj_model)
    reference.qpos[:], reference.qvel[:] = np.asarray(stepped.qpos), np.asarray(stepped.qvel)
    mujoco.mj_forward(mj_model, reference)
    np.testing.assert_allclose(stepped.xpos, reference.xpos, atol=2e-5)  # bodies of the final state, not before it
    np.testing.assert_allclose(stepped.cvel, reference.cvel, atol=1e-4)
    # An event that changes velocities (a push) is reflected once the engine is told.
    pushed = engine.velocities_changed(stepped.replace(qvel=stepped.qvel.at[0].add(1.0)))
    reference.qvel[0] += 1.0
    mujoco.mj_forward(mj_model, reference)
    np.testing.assert_allclose(pushed.cvel, reference.cvel, atol=1e-4)


@pytest.mark.parametrize("kind", ["free", "planar", "fixed"])
def test_external_body_forces_give_mujocos_joint_forces_and_accelerations(kind: str) -> None:
    mj_model = model(ROOTS[kind])
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    qpos, qvel = random_state(mj_model, 5)
    pushes = np.random.default_rng(6).normal(size=(mj_model.nbody, 6))
    data = engine.make_data(jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))
    data = data.replace(xfrc_applied=jnp.asarray(pushes, jnp.float32), ctrl=jnp.asarray([0.3, -0.2]))
    model_ = engine.mjx_model
    ours = jax.jit(lambda d: smooth_accelerations(model_, mjx.fwd_actuation(model_, d)))(data)
    reference = mujoco.MjData(mj_model)
    reference.qpos[:], reference.qvel[:], reference.xfrc_applied[:], reference.ctrl[:] = qpos, qvel, pushes, [0.3, -0.2]
    mujoco.mj_forward(mj_model, reference)
    np.testing.assert_allclose(ours.qfrc_smooth, reference.qfrc_smooth, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ours.qacc_smooth, reference.qacc_smooth, rtol=1e-4, atol=1e-3)


SENSOR_MODEL = """
<mujoco>
  <option integrator="{integrator}"/>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <body name="box" pos="0 0 .3">
      <freejoint/>
      <geom type="box" size=".1 .1 .1"/>
      <site name="imu"/>
    </body>
  </worldbody>
  <sensor>
    <framepos objtype="site" objname="imu"/>
    <velocimeter site="imu"/>
    {acceleration_sensor}
  </sensor>
</mujoco>
"""


@pytest.mark.parametrize("with_accelerometer", [False, True])
def test_an_episode_start_computes_what_the_models_sensors_need(with_accelerometer: bool) -> None:
    xml = SENSOR_MODEL.format(
        integrator="Euler", acceleration_sensor='<accelerometer site="imu"/>' if with_accelerometer else ""
    )
    mj_model = mujoco.MjModel.from_xml_string(xml)
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    assert engine.has_acceleration_sensors == with_accelerometer
    qvel = np.array([0.3, 0.0, -0.2, 0.0, 0.5, 0.0])
    data = engine.make_data(jnp.asarray(mj_model.qpos0, jnp.float32), jnp.asarray(qvel, jnp.float32))
    reference = mujoco.MjData(mj_model)
    reference.qvel[:] = qvel
    mujoco.mj_forward(mj_model, reference)
    # Position and velocity sensors always; the accelerometer (gravity, 9.81 up) only where the model has one.
    np.testing.assert_allclose(data.sensordata, reference.sensordata, atol=1e-4)
    if not with_accelerometer:
        np.testing.assert_array_equal(data.qacc, 0.0)  # accelerations come with the first physics step


def test_an_integrator_mjx_lacks_is_refused_when_the_engine_is_built() -> None:
    mj_model = mujoco.MjModel.from_xml_string(SENSOR_MODEL.format(integrator="implicit", acceleration_sensor=""))
    with pytest.raises(
        ConfigError,
        match=r"MJX cannot run this model: integrator IMPLICIT: MJX implements Euler, RK4 and implicitfast: set",
    ):
        create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")


def test_forward_progress_is_displacement_over_the_control_step() -> None:
    ctx, _, _ = contexts("planar")
    moved = ctx.data.replace(xpos=ctx.data.xpos.at[ctx.layout.base_body, 0].add(0.03))
    progress = rew.ForwardProgress(scale=1.0).value(ctx.replace(data=moved))
    np.testing.assert_allclose(progress, 0.03 / 0.02, rtol=1e-5)
    sideways = rew.ForwardProgress(scale=1.0, direction=(0.0, 1.0, 0.0)).value(ctx.replace(data=moved))
    np.testing.assert_allclose(sideways, 0.0, atol=1e-6)


@pytest.mark.parametrize("kind", ["free", "planar"])
def test_healthy_range_bounds_height_and_pitch(kind: str) -> None:
    ctx, _, _ = contexts(kind)
    height, pitch = float(ctx.base_pos[2]), float(ctx.base_pitch)
    assert not term.HealthyRange(min_height=height - 0.1, max_pitch=abs(pitch) + 0.1).terminated(ctx)
    assert term.HealthyRange(min_height=height + 0.1).terminated(ctx)
    assert term.HealthyRange(max_height=height - 0.1).terminated(ctx)
    assert term.HealthyRange(max_pitch=max(abs(pitch) - 0.05, 1e-3)).terminated(ctx)


def test_velocity_observations_clip() -> None:
    ctx, _, _ = contexts("free")
    clipped = obs.JointVelocity(scale=100.0, clip=0.5).bind(ctx.layout).observe(ctx)
    assert float(jnp.max(jnp.abs(clipped))) == pytest.approx(0.5)
    assert float(jnp.max(jnp.abs(obs.BaseLinearVelocity(scale=100.0, clip=1.0).observe(ctx)))) <= 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_velocity_error_penalties_are_the_evaluations_errors_against_mujoco(seed: int) -> None:
    ctx, mj_model, reference = contexts("free", seed)
    ctx = ctx.replace(command=jnp.array([0.4, -0.3, 0.7]))
    torso = mj_model.body("torso").id
    forward = reference.xmat[torso].reshape(3, 3)[:, 0]
    yaw = np.arctan2(forward[1], forward[0])
    angular, linear = np.split(object_velocity(mj_model, reference, torso, False), 2)
    heading = np.array([[np.cos(yaw), np.sin(yaw)], [-np.sin(yaw), np.cos(yaw)]]) @ linear[:2]
    error, yaw_error = np.linalg.norm(heading - [0.4, -0.3]), abs(angular[2] - 0.7)
    close = {"atol": 2e-5, "rtol": 1e-4}
    np.testing.assert_allclose(rew.LinearVelocityError(scale=-2.0)(ctx), -2.0 * error, **close)
    np.testing.assert_allclose(rew.YawRateError(scale=-0.5)(ctx), -0.5 * yaw_error, **close)
    tracking = rew.LinearVelocityTracking(scale=1.0, sigma=0.25).value(ctx)
    np.testing.assert_allclose(tracking, np.exp(-(error**2) / 0.25), **close)  # the same error, another kernel


def test_control_cost_is_on_the_applied_control() -> None:
    ctx, _, _ = contexts("free")
    assert float(rew.ControlCost(scale=-1.0)(ctx.replace(ctrl=jnp.array([0.5, -2.0])))) == pytest.approx(-4.25)


@pytest.mark.parametrize(
    ("component", "message"),
    [
        (obs.JointPosition(joints=("elbow",)), r"JointPosition.joints: no joint named 'elbow'; .*'hip', 'knee'"),
        (
            obs.BodyPosition(body="head"),
            r"BodyPosition.body: no site, geom or body named 'head'; .*'torso', 'thigh', 'shin'",
        ),
        (
            term.BaseTooLow(min_height=0.5),
            r"BaseTooLow needs a moving base, but the base body 'torso' is welded to the world",
        ),
        (rew.ForwardProgress(scale=1.0), "ForwardProgress needs a moving base"),
        (term.HealthyRange(min_height=1.0, max_height=0.5), "min_height=1.0 must be below max_height=0.5"),
        (RandomJointPositions(scale=0.1, joints=("wrist",)), "RandomJointPositions.joints: no joint named 'wrist'"),
    ],
)
def test_components_refuse_models_they_cannot_apply_to(component: object, message: str) -> None:
    layout = ModelLayout.create(model(ROOTS["fixed"]))
    with pytest.raises(ConfigError, match=message):
        component.bind(layout)  # type: ignore[attr-defined]


def test_base_body_by_name_and_bad_names() -> None:
    mj_model = model(ROOTS["free"])
    assert ModelLayout.create(mj_model, "shin").base_body == mj_model.body("shin").id
    with pytest.raises(ConfigError, match=r"base_body: no body named 'pelvis'; the model's bodies are 'torso'"):
        ModelLayout.create(mj_model, "pelvis")
    with pytest.raises(ConfigError, match="base_body='world' is the world"):
        ModelLayout.create(mj_model, "world")


def test_mjx_data_type_is_what_the_context_holds() -> None:
    ctx, _, _ = contexts("free")
    assert isinstance(ctx.data, mjx.Data)
