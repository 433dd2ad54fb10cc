"""ksim on MJCF models it did not write: Gymnasium's MuJoCo models (a test-only dependency).

For each: the base body, root kind, root and robot joints by the joint rule; default joint observations
sized by those joints; ksim's physics step equal to `mjx.step` with the model's own integrator (on one model of
each kind); MJX's refusals as one line; `ksim.inspect` on each.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from mujoco import mjx

gymnasium = pytest.importorskip("gymnasium")

from ksim import inspect as ksim_inspect  # noqa: E402
from ksim import observations as obs  # noqa: E402
from ksim.config import ConfigError  # noqa: E402
from ksim.engine import Contacts, ModelLayout, StepContext  # noqa: E402
from ksim.physics import create_engine, mjx_contract  # noqa: E402
from ksim.physics.mjx_jax import physics_step  # noqa: E402

ASSETS = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"
REPO = Path(__file__).resolve().parents[1]

# model: (base body, root kind, root joints, robot joints)
PLANAR = ("rootx", "rootz", "rooty")
EXPECTED = {
    "ant.xml": ("torso", "free", ("root",), tuple(f"{j}_{i}" for i in range(1, 5) for j in ("hip", "ankle"))),
    "half_cheetah.xml": ("torso", "articulated", PLANAR, ("bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot")),
    "hopper.xml": ("torso", "articulated", PLANAR, ("thigh_joint", "leg_joint", "foot_joint")),
    "walker2d_v5.xml": (
        "torso",
        "articulated",
        PLANAR,
        ("thigh_joint", "leg_joint", "foot_joint", "thigh_left_joint", "leg_left_joint", "foot_left_joint"),
    ),
    "swimmer.xml": ("torso", "articulated", ("slider1", "slider2", "free_body_rot"), ("motor1_rot", "motor2_rot")),
    # Fixed-base robots: the joint of the base body is actuated, so it is a robot joint.
    "inverted_pendulum.xml": ("cart", "articulated", (), ("slider", "hinge")),
    "inverted_double_pendulum.xml": ("cart", "articulated", (), ("slider", "hinge", "hinge2")),
    "reacher.xml": ("body0", "articulated", (), ("joint0", "joint1", "target_x", "target_y")),
    "pusher_v5.xml": (
        "r_shoulder_pan_link",
        "articulated",
        (),
        (
            "r_shoulder_pan_joint",
            "r_shoulder_lift_joint",
            "r_upper_arm_roll_joint",
            "r_elbow_flex_joint",
            "r_forearm_roll_joint",
            "r_wrist_flex_joint",
            "r_wrist_roll_joint",
            "obj_slidey",
            "obj_slidex",
            "goal_slidey",
            "goal_slidex",
        ),
    ),
}
REFUSED = {"humanoid.xml": "solver PGS", "humanoidstandup.xml": "solver PGS"}


def load(name: str) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(ASSETS / name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_root_and_robot_joints_follow_the_joint_rule(name: str) -> None:
    base, root_kind, roots, robot = EXPECTED[name]
    layout = ModelLayout.create(load(name))
    assert layout.body_names[layout.base_body] == base
    assert layout.root_kind == root_kind
    assert layout.names(layout.root_joints) == roots
    assert layout.names(layout.robot_joints) == robot


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_default_joint_observations_have_the_robot_joints_sizes(name: str) -> None:
    mj_model = load(name)
    layout = ModelLayout.create(mj_model)
    data = mjx.put_data(mj_model, mujoco.MjData(mj_model), impl="jax")
    no_action = jnp.zeros(mj_model.nu)
    contacts = Contacts(*mjx_contract.contact_table(mj_model, data))
    ctx = StepContext(data, data, no_action, no_action, data.ctrl, jnp.zeros(0), contacts, layout, 0.02)
    robot = layout.robot_joints
    assert obs.JointPosition().bind(ctx.layout).observe(ctx).shape == (sum(len(layout.joint_qpos[j]) for j in robot),)
    assert obs.JointVelocity().bind(ctx.layout).observe(ctx).shape == (sum(len(layout.joint_qvel[j]) for j in robot),)
    for observation in (obs.JointPosition(), obs.JointVelocity()):
        observation.bind(layout)  # no refusal: every model here has robot joints


def test_a_model_without_robot_joints_is_refused_by_joint_components_naming_its_joints() -> None:
    layout = ModelLayout.create(load("inverted_pendulum.xml"), root_joints=("slider", "hinge"))
    with pytest.raises(ConfigError, match=r"^JointPosition.joints: the model has no robot joints \(its joints: "):
        obs.JointPosition().bind(layout)


def test_root_joints_and_base_body_can_be_set() -> None:
    mj_model = load("reacher.xml")
    layout = ModelLayout.create(mj_model, root_joints=("target_x", "target_y"))
    assert layout.names(layout.robot_joints) == ("joint0", "joint1")
    assert ModelLayout.create(mj_model, base_body="body1").body_names[1:3] == ("body0", "body1")
    with pytest.raises(ConfigError, match=r"^root_joints: no joint named 'shoulder'; the model's joints are 'joint0'"):
        ModelLayout.create(mj_model, root_joints=("shoulder",))


def random_state(mj_model: mujoco.MjModel, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A pose near the model's reference pose (quaternions kept unit length) and random velocities."""
    rng = np.random.default_rng(seed)
    qpos = mj_model.qpos0.copy()
    for joint in range(mj_model.njnt):
        start, kind = mj_model.jnt_qposadr[joint], mj_model.jnt_type[joint]
        if kind in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
            qpos[start] += rng.uniform(-0.1, 0.1)
    return qpos, rng.uniform(-0.5, 0.5, mj_model.nv)


def assert_steps_match_mjx(mj_model: mujoco.MjModel, num_steps: int = 3) -> None:
    """`num_steps` of ksim's physics step against `mjx.step` from the same state, with a random control."""
    engine = create_engine(mj_model, ctrl_dt=mj_model.opt.timestep, dt=mj_model.opt.timestep, physics_impl="jax")
    reference_start = mujoco.MjData(mj_model)
    reference_start.qpos[:], reference_start.qvel[:] = random_state(mj_model, 0)
    reference_start.ctrl[:] = np.random.default_rng(1).uniform(-0.5, 0.5, mj_model.nu)
    mujoco.mj_forward(mj_model, reference_start)  # what ksim's step expects computed (MuJoCo's, not compiled here)
    start = mjx.put_data(mj_model, reference_start, impl="jax")

    def run(step: Callable[[mjx.Model, mjx.Data], mjx.Data]) -> mjx.Data:
        return jax.lax.fori_loop(0, num_steps, lambda _, data: step(engine.mjx_model, data), start)

    ours, reference = jax.jit(lambda: run(physics_step))(), jax.jit(lambda: run(mjx.step))()
    close = {"atol": 2e-4, "rtol": 2e-3}
    np.testing.assert_allclose(ours.qpos, reference.qpos, **close)
    np.testing.assert_allclose(ours.qvel, reference.qvel, **close)
    assert np.abs(np.asarray(ours.qvel) - start.qvel).max() > 1e-4  # the state did move


# One model of each kind: a free root with contacts (RK4), a planar root with contacts (Euler), a fixed-base arm
# pushing free objects (Euler), a swimmer in a viscous fluid (RK4). Every integrator with contacts on a model with
# tendons, an equality and activations: tests/test_mjx_contract.py.
STEPPED = ["ant.xml", "half_cheetah.xml", "pusher_v5.xml", "swimmer.xml"]


@pytest.mark.parametrize("name", STEPPED)
def test_ksim_physics_step_equals_mjx_step_with_the_models_integrator(name: str) -> None:
    assert_steps_match_mjx(load(name))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_models_mjx_cannot_run_are_refused_with_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        create_engine(load(name), ctrl_dt=0.015, dt=0.003, physics_impl="jax")
    message = str(refused.value)
    assert (
        message == 'MJX cannot run this model: solver PGS: MJX implements Newton and CG: set <option solver="Newton"/>'
    )


def test_a_task_on_a_refused_model_exits_2_with_one_line() -> None:
    script = (
        "from helpers import CartpoleTask, cartpole_config\n"
        "import mujoco\n"
        f"class Task(CartpoleTask):\n"
        f"    def get_mujoco_model(self): return mujoco.MjModel.from_xml_path({str(ASSETS / 'humanoid.xml')!r})\n"
        "Task.launch(cartpole_config(), argv=['physics_impl=jax'])\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        'error: MJX cannot run this model: solver PGS: MJX implements Newton and CG: set <option solver="Newton"/>'
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", sorted([*EXPECTED, *REFUSED]))
def test_inspect_reports_every_public_model(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = ksim_inspect.main([str(ASSETS / name), "--no-timing"])
    out = capsys.readouterr().out
    base, root_kind, _, robot = EXPECTED.get(name, ("torso", "free", (), ()))
    assert f"base body: {base!r}, root: {root_kind}" in out
    assert all(f"\n  {joint} " in out for joint in robot)
    if name in REFUSED:
        assert code == 1 and f"MJX cannot run this model:\n  {REFUSED[name]}" in out
    else:
        assert code == 0 and "MJX: runs this model" in out


def test_inspect_advises_on_an_untuned_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert ksim_inspect.main([str(ASSETS / "ant.xml"), "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert 'solver iterations=100: MJX runs them for the whole batch; try <option iterations="4"/>' in out
    assert 'line-search iterations=50: try <option ls_iterations="8"/>' in out
    assert "integrator RK4 evaluates the dynamics 4 times a step" in out
    assert re.search(r"actuators \(8\):\n  actuator #0 +motor +joint hip_4, gear 150, ctrl \[-1, 1\]\n", out)
    assert "fits: TorqueActuators (the action is the torque) or PositionActuators" in out


def test_the_advices_option_changes_apply_to_a_copy() -> None:
    mj_model = load("ant.xml")
    tuned, changes = ksim_inspect.tuned_options(mj_model)
    assert changes == ["iterations=4", "ls_iterations=8", "integrator=implicitfast"]
    assert (tuned.opt.iterations, tuned.opt.ls_iterations) == (4, 8)
    assert tuned.opt.integrator == mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    assert (mj_model.opt.iterations, mj_model.opt.integrator) == (100, mujoco.mjtIntegrator.mjINT_RK4)
    swimmer, changes = ksim_inspect.tuned_options(load("swimmer.xml"))  # viscous: implicitfast has no fluid forces
    assert "integrator=Euler" in changes and not mjx_contract.refusals(swimmer)
