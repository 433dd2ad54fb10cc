"""Sensors, points named by site/geom/body, contacts and stateful components on a public model (Playground's
Spot, bundled as ksim/assets/spot): sensor values equal MuJoCo's `sensordata` for the same state (every sensor
type the model has), foot contact and air time on a scripted drop and a scripted step, and bad names refused.

Every physics test runs once per physics implementation the engine offers (`PHYSICS_IMPLS`).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import docs_observation

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.config import ConfigError
from ksim.engine import ModelLayout, PhysicsEngine, StepContext, load_mujoco_model
from ksim.physics import create_engine, mjx_contract

PHYSICS_IMPLS = ["jax", "mujoco", "warp"]  # warp: with warp-lang installed (`make test-warp`), else skipped
FEET = ("FL", "FR", "HL", "HR")
CTRL_DT, DT = 0.02, 0.004
# The joints that lift the front-right foot ~0.17 m off the floor from the home pose (hip pitch, knee bent).
FR_HY, FR_KN = 11, 12  # qpos indices of fr_hy, fr_kn (after the free joint's 7 values and fl's 3 joints)


@pytest.fixture(scope="module")
def mj_model() -> mujoco.MjModel:
    return load_mujoco_model("spot/spot.xml")


@pytest.fixture(scope="module", params=PHYSICS_IMPLS)
def engine(request: pytest.FixtureRequest, mj_model: mujoco.MjModel) -> PhysicsEngine:
    if request.param == "warp" and not mjx_contract.warp_installed():
        pytest.skip("warp-lang is not installed (make test-warp installs it)")
    return create_engine(mj_model, CTRL_DT, DT, physics_impl=request.param)


@pytest.fixture(scope="module")
def contacts_engine(engine: PhysicsEngine) -> PhysicsEngine:
    """The engine, for the tests of contacts: Warp gives components none (PhysicsEngine.no_contacts)."""
    if engine.no_contacts:
        pytest.skip(engine.no_contacts)
    return engine


def _context(engine: PhysicsEngine, data: Any, prev: Any = None, state: Any = None) -> StepContext:
    no_action = jnp.zeros(engine.action_dim)
    ctx = engine.context(data, data if prev is None else prev, no_action, no_action, data.ctrl)
    return ctx.replace(state=state)


@pytest.fixture(scope="module")
def make_data(engine: PhysicsEngine) -> Callable[[np.ndarray, np.ndarray], Any]:
    return jax.jit(lambda qpos, qvel: engine.make_data(qpos, qvel))


def _mujoco_forward(mj_model: mujoco.MjModel, qpos: np.ndarray, qvel: np.ndarray) -> mujoco.MjData:
    reference = mujoco.MjData(mj_model)
    reference.qpos[:], reference.qvel[:] = qpos, qvel
    mujoco.mj_forward(mj_model, reference)
    return reference


def _moving_pose(mj_model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    """The home pose, tilted, its front-right foot lifted, the rest of the feet on the floor, moving."""
    qpos = mj_model.key_qpos[0].copy()
    qpos[2] -= 0.008  # the other feet press into the floor: contacts with a force
    qpos[3:7] = [1.0, 0.002, 0.003, 0.0] / np.linalg.norm([1.0, 0.002, 0.003, 0.0])
    qpos[FR_HY] += 0.5
    qpos[FR_KN] -= 0.6
    qvel = np.linspace(-0.5, 0.5, mj_model.nv)
    return qpos, qvel


class Moving(NamedTuple):
    """The moving pose, its context on the engine under test, and MuJoCo's own `mj_forward` of it."""

    qpos: np.ndarray
    qvel: np.ndarray
    ctx: StepContext
    reference: mujoco.MjData


@pytest.fixture(scope="module")
def moving(mj_model: mujoco.MjModel, engine: PhysicsEngine, make_data: Callable) -> Moving:
    qpos, qvel = _moving_pose(mj_model)
    return Moving(qpos, qvel, _context(engine, make_data(qpos, qvel)), _mujoco_forward(mj_model, qpos, qvel))


def test_every_sensor_reads_what_mujoco_computes(mj_model: mujoco.MjModel, moving: Moving) -> None:
    ctx, reference = moving.ctx, moving.reference
    kinds = {mujoco.mjtSensor(int(t)).name for t in mj_model.sensor_type}
    assert {"mjSENS_GYRO", "mjSENS_ACCELEROMETER", "mjSENS_VELOCIMETER", "mjSENS_FRAMEQUAT", "mjSENS_CONTACT"} <= kinds
    for sensor in range(mj_model.nsensor):
        name = mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_SENSOR, sensor)
        start, dim = int(mj_model.sensor_adr[sensor]), int(mj_model.sensor_dim[sensor])
        want = reference.sensordata[start : start + dim]
        # The accelerometer includes the contact forces, which MJX's and MuJoCo's solvers find to ~1e-3.
        atol = 2e-2 if mj_model.sensor_type[sensor] == mujoco.mjtSensor.mjSENS_ACCELEROMETER else 1e-4
        np.testing.assert_allclose(ctx.sensor(name), want, atol=atol, rtol=1e-3, err_msg=name)
        np.testing.assert_allclose(
            obs.Sensor(sensor=name).bind(ctx.layout).observe(ctx), want, atol=atol, rtol=1e-3, err_msg=name
        )
    found = [reference.sensordata[mj_model.sensor(f"{foot}_floor_found").adr[0]] for foot in FEET]
    assert found == [1.0, 0.0, 1.0, 1.0]  # the state has the contacts the feet tests rely on


def test_points_by_site_geom_and_body_move_with_their_frame(moving: Moving) -> None:
    ctx, reference = moving.ctx, moving.reference
    for foot in FEET:  # a site's velocity against MuJoCo's framelinvel sensor of that site
        site = ctx.layout.point(foot, "test")
        assert site.kind == "site"
        want = reference.sensor(f"{foot}_global_linvel").data
        np.testing.assert_allclose(ctx.point_lin_vel_world(site), want, atol=1e-4, rtol=1e-4, err_msg=foot)
        np.testing.assert_allclose(ctx.point_pos(site), reference.site(foot).xpos, atol=1e-5)
    geom = ctx.layout.point("fl_thigh", "test")
    body = ctx.layout.point("fr_lleg", "test")
    assert (geom.kind, body.kind) == ("geom", "body")
    np.testing.assert_allclose(ctx.point_pos(geom), reference.geom("fl_thigh").xpos, atol=1e-5)
    lleg_velocity = obs.BodyLinearVelocity(body="fr_lleg").bind(ctx.layout).observe(ctx)
    np.testing.assert_allclose(lleg_velocity, ctx.body_lin_vel_world(body.index), atol=1e-6)
    # The foot site sits 0.3365 m below the lower leg's origin: FootSwingTracking sees the sole, not the knee.
    heights = [float(ctx.point_pos(ctx.layout.point(name, "test"))[2]) for name in ("FL", "fl_lleg")]
    assert heights[0] == pytest.approx(0.036, abs=0.02) and heights[1] - heights[0] > 0.2


def test_foot_contact_and_force_come_from_the_simulator(
    contacts_engine: PhysicsEngine, make_data: Callable, moving: Moving
) -> None:
    engine, (qpos, qvel, ctx, _) = contacts_engine, moving
    np.testing.assert_array_equal(obs.FeetContact(feet=FEET).bind(ctx.layout).observe(ctx), [1.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(
        obs.FeetContact(feet=("fl_lleg", "fr_lleg")).bind(ctx.layout).observe(ctx), [1.0, 0.0]
    )  # bodies
    forces = np.asarray(obs.FeetContactForce(feet=FEET, scale=1.0).bind(ctx.layout).observe(ctx))
    assert forces[1] == 0.0 and np.all(forces[[0, 2, 3]] > 0)
    assert float(rew.UndesiredContacts(scale=-1.0, bodies=("trunk", "fl_thigh")).bind(ctx.layout).value(ctx)) == 0.0
    assert not bool(term.IllegalContact(bodies=("trunk",)).bind(ctx.layout).terminated(ctx))
    lying = qpos.copy()
    lying[2] = 0.08  # the trunk box (half-height 0.085) is on the floor
    assert bool(
        term.IllegalContact(bodies=("trunk",))
        .bind(engine.layout)
        .terminated(_context(engine, make_data(lying, 0 * qvel)))
    )


@pytest.fixture(scope="module")
def dropped(mj_model: mujoco.MjModel, contacts_engine: PhysicsEngine, make_data: Callable) -> list[StepContext]:
    """Spot held in its home pose by its servos, dropped from 0.15 m above standing height: 30 control steps."""
    engine = contacts_engine
    qpos = mj_model.key_qpos[0].copy()
    qpos[2] += 0.15
    ctrl = jnp.asarray(mj_model.key_ctrl[0])
    step = jax.jit(lambda data: engine.step(data, lambda _: ctrl)[0])
    data, contexts = make_data(qpos, np.zeros(mj_model.nv)), []
    for _ in range(30):
        stepped = step(data)
        contexts.append(_context(engine, stepped, data))
        data = stepped
    return contexts


def _run_air_time(reward: rew.FeetAirTime, contexts: list[StepContext]) -> tuple[np.ndarray, list[Any]]:
    """The reward at every step and the state after it, as the env carries it from a fresh episode."""
    reward = reward.bind(contexts[0].layout)
    state, values, states = reward.initial_state(contexts[0].layout), [], []
    for ctx in contexts:
        values.append(float(reward.value(ctx.replace(state=state))))
        state = reward.next_state(ctx.replace(state=state))
        states.append(state)
    return np.asarray(values), states


def test_a_dropped_robot_touches_down_with_every_foot_and_earns_its_air_time(dropped: list[StepContext]) -> None:
    contact = np.asarray([obs.FeetContact(feet=FEET).bind(ctx.layout).observe(ctx) for ctx in dropped])
    assert not contact[0].any() and contact[-1].all()  # falls free, then stands
    first = [int(np.argmax(contact[:, foot])) for foot in range(len(FEET))]
    reward = rew.FeetAirTime(scale=1.0, feet=FEET, threshold_s=0.1)
    values, states = _run_air_time(reward, dropped)
    # Each foot pays (air time - threshold) at its first touchdown: its air time counts every step since the start.
    for step in set(first):
        expected = sum((step + 1) * CTRL_DT - 0.1 for f in first if f == step)
        assert values[step] == pytest.approx(expected, abs=1e-5)
    assert values[: min(first)].sum() == 0.0
    np.testing.assert_allclose(states[-1]["air_time"], 0.0)  # standing: reset at touchdown
    for foot, step in enumerate(first):
        assert float(states[step - 1]["air_time"][foot]) == pytest.approx(step * CTRL_DT, abs=1e-6)


def test_a_scripted_step_pays_the_lifted_foot_only(
    mj_model: mujoco.MjModel, contacts_engine: PhysicsEngine, make_data: Callable
) -> None:
    """Kinematic poses: standing, the front-right foot lifted for 12 control steps, standing again."""
    engine = contacts_engine
    standing, _ = _moving_pose(mj_model)
    standing[3:7] = [1.0, 0.0, 0.0, 0.0]
    standing[FR_HY], standing[FR_KN] = mj_model.key_qpos[0][FR_HY], mj_model.key_qpos[0][FR_KN]
    lifted, _ = _moving_pose(mj_model)
    lifted[3:7] = standing[3:7]
    zero = np.zeros(mj_model.nv)
    stand_ctx, lift_ctx = (_context(engine, make_data(q, zero)) for q in (standing, lifted))
    np.testing.assert_array_equal(
        obs.FeetContact(feet=FEET).bind(stand_ctx.layout).observe(stand_ctx), [1.0, 1.0, 1.0, 1.0]
    )
    script = [stand_ctx] * 3 + [lift_ctx] * 12 + [stand_ctx] * 3
    values, states = _run_air_time(rew.FeetAirTime(scale=1.0, feet=FEET, threshold_s=0.1), script)
    touchdown = 15
    np.testing.assert_allclose(values[touchdown], 13 * CTRL_DT - 0.1, atol=1e-6)  # 12 steps up, the 13th lands
    assert np.count_nonzero(values) == 1
    np.testing.assert_allclose(states[touchdown - 1]["air_time"], [0.0, 12 * CTRL_DT, 0.0, 0.0], atol=1e-6)
    swing = rew.FeetSwingHeight(scale=1.0, feet=FEET, height=0.2).bind(lift_ctx.layout)
    peak = float(lift_ctx.point_pos(lift_ctx.layout.point("FR", "test"))[2])
    state = swing.initial_state(lift_ctx.layout)
    paid = []
    for ctx in script:
        paid.append(float(swing.value(ctx.replace(state=state))))
        state = swing.next_state(ctx.replace(state=state))
    assert paid[touchdown] == pytest.approx((peak - 0.2) ** 2, rel=1e-4) and np.count_nonzero(paid) == 1


def test_the_new_terms_measure_what_they_say(
    mj_model: mujoco.MjModel, engine: PhysicsEngine, make_data: Callable, moving: Moving
) -> None:
    qpos, qvel, ctx, _ = moving
    reference = _mujoco_forward(mj_model, qpos, qvel)  # its own: this test sets its controls
    local_lin, local_ang = ctx.base_lin_vel, ctx.base_ang_vel
    assert float(rew.BaseVerticalVelocityPenalty(scale=-1.0).value(ctx)) == pytest.approx(float(local_lin[2]) ** 2)
    np.testing.assert_allclose(rew.BaseRollPitchRatePenalty(scale=-1.0).value(ctx), np.sum(local_ang[:2] ** 2))
    tilt = float(rew.TiltPenalty(scale=-1.0).value(ctx))
    up = reference.xmat[1].reshape(3, 3)[:, 2]  # the base's z axis in the world
    assert tilt == pytest.approx(1.0 - up[2] ** 2, abs=1e-5)
    # MuJoCo's actuator forces for the applied ctrl give the same mechanical power.
    ctrl = mj_model.key_ctrl[0] + 0.1
    reference.ctrl[:] = ctrl
    mujoco.mj_forward(mj_model, reference)
    joints = mj_model.actuator_trnid[:, 0]
    power = np.sum(np.abs(reference.actuator_force * reference.qvel[mj_model.jnt_dofadr[joints]]))
    powered = ctx.replace(ctrl=jnp.asarray(ctrl, jnp.float32))
    assert float(rew.MechanicalPower(scale=-1.0).value(powered)) == pytest.approx(power, rel=1e-4)
    # Joint limits: fr_kn's range is [-2.79, -0.256]; 0.05 of it is a 0.127 rad band.
    near_limit = qpos.copy()
    near_limit[FR_KN] = -0.256 - 0.027
    limit_ctx = _context(engine, make_data(near_limit, qvel))
    penalty = float(
        rew.JointLimitPenalty(scale=-1.0, margin=0.05, joints=("fr_kn",)).bind(limit_ctx.layout).value(limit_ctx)
    )
    low, high = mj_model.jnt_range[mj_model.joint("fr_kn").id]
    assert penalty == pytest.approx(near_limit[FR_KN] - (high - 0.05 * (high - low)), rel=1e-4)
    # The default pose, by name: the home keyframe's joints.
    home = _context(engine, make_data(mj_model.key_qpos[0], 0 * qvel))
    np.testing.assert_allclose(obs.JointPosition(offset="default").bind(home.layout).observe(home), 0.0, atol=1e-6)
    assert float(rew.JointPoseDeviation(scale=-1.0, pose="default").bind(home.layout).value(home)) == pytest.approx(
        0.0, abs=1e-10
    )
    assert float(rew.StandStill(scale=-1.0).bind(ctx.layout).value(ctx.replace(command=jnp.zeros(3)))) > 0.5
    assert float(rew.StandStill(scale=-1.0).bind(ctx.layout).value(ctx.replace(command=jnp.ones(3)))) == 0.0
    assert float(rew.TerminationPenalty(scale=-1.0).value(ctx.replace(terminated=jnp.array(True)))) == 1.0
    clearance = rew.FeetClearance(scale=-1.0, feet=("FR",), height=0.1).bind(ctx.layout).value(ctx)
    fr = ctx.layout.point("FR", "test")
    speed = np.linalg.norm(np.asarray(ctx.point_lin_vel_world(fr))[:2])
    assert float(clearance) == pytest.approx((float(ctx.point_pos(fr)[2]) - 0.1) ** 2 * speed, rel=1e-4)


@pytest.mark.parametrize(
    ("component", "message"),
    [
        (obs.Sensor(sensor="imu_gyro"), r"^Sensor.sensor: no sensor named 'imu_gyro'; the model's sensors are 'gyro'"),
        (obs.FeetContact(feet=("FL", "paw")), r"^FeetContact.feet: no geom or body named 'paw'; .*'FL'"),
        (obs.FeetContact(feet=()), r"^FeetContact.feet is empty"),
        (obs.BodyPosition(body="toe"), r"^BodyPosition.body: no site, geom or body named 'toe'; the model's sites"),
        (rew.FootSwingTracking(scale=1.0, feet=("FL", "nose"), offsets=(0, 0)), r"FootSwingTracking.feet: .*'nose'"),
        (rew.FeetAirTime(scale=1.0, feet=("imu",)), r"^FeetAirTime.feet: no geom or body named 'imu'"),
        (
            term.IllegalContact(bodies=("fl_hip",)),
            r"^IllegalContact.bodies: 'fl_hip' has no geom that can touch anything",
        ),
        (rew.JointLimitPenalty(scale=-1.0, joints=("freejoint",)), r"^JointLimitPenalty.joints: \['freejoint'\]"),
        (obs.JointPosition(offset="home"), r"^JointPosition.offset='home': give values or 'default'"),
    ],
)
def test_bad_names_are_refused_when_the_task_is_built(mj_model: mujoco.MjModel, component: Any, message: str) -> None:

    with pytest.raises(ConfigError, match=message):
        component.bind(ModelLayout.create(mj_model))


def test_inspect_lists_the_sites(mj_model: mujoco.MjModel) -> None:
    from ksim.inspect import site_lines

    lines = site_lines(mj_model)
    assert lines[0].startswith("sites (5;") and any(line.split() == ["FL", "on", "body", "fl_lleg"] for line in lines)


def test_the_spot_example_names_its_sensor_inputs_for_policy_json() -> None:
    """The observation layout (what a checkpoint and policy.json record) names each sensor it reads."""
    from examples.spot import DEFAULT_CONFIG, SpotTask

    task = SpotTask(dataclasses.replace(DEFAULT_CONFIG, num_envs=4, batch_size=4, compilation_cache_dir=""))
    layout = dict(task.environment.observation_layout())
    assert layout["Sensor[gyro]"] == 3 and layout["Sensor[local_linvel]"] == 3 and layout["FeetContact"] == 4
    assert layout["JointPosition"] == 12


def test_components_resolve_their_names_once_when_the_task_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the task is built, tracing an episode start and a step of every component searches no name."""
    from examples.spot import DEFAULT_CONFIG, SpotTask

    config = dataclasses.replace(
        DEFAULT_CONFIG, num_envs=4, batch_size=4, compilation_cache_dir="", physics_impl="mujoco"
    )
    task = SpotTask(config)
    assert task.components.observations[0].span == task.engine.layout.sensor("gyro", "test")  # type: ignore[attr-defined]

    def searched(*_: Any) -> None:
        raise AssertionError("a component searched a name list after the task was built")

    for lookup in ("joints", "point", "sensor", "contact_geoms"):
        monkeypatch.setattr(type(task.engine.layout), lookup, searched)
    environment = task.environment
    shared = jax.eval_shape(task.init_shared, jax.random.PRNGKey(0))
    episode = jax.eval_shape(
        lambda rng: environment.start_episode(rng, policy_state=task.initial_policy_state()), jax.random.PRNGKey(0)
    )
    _, transition = jax.eval_shape(environment.step_env, shared, episode)
    assert set(transition.reward_terms) == set(task.components.reward_names)


def test_a_component_used_unbound_says_so(moving: Moving) -> None:
    ctx = moving.ctx
    with pytest.raises(ConfigError, match=r"before bind\(layout\)"):
        obs.JointVelocity(joints=("fr_kn",)).observe(ctx)


def test_the_documented_custom_component_binds_and_observes(moving: Moving) -> None:
    """docs/tasks.md's worked observation, run as written, on Spot's gyro."""
    ctx, reference = moving.ctx, moving.reference
    gyro = docs_observation()(sensor="gyro", limit=0.05).bind(ctx.layout)
    want = np.clip(reference.sensor("gyro").data, -0.05, 0.05)
    np.testing.assert_allclose(gyro.observe(ctx), want, atol=1e-4, rtol=1e-3)
    with pytest.raises(ConfigError, match=r"^ClippedGyro\.sensor: no sensor named 'imu_gyro'"):
        docs_observation()().bind(ctx.layout)
