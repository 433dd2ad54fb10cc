"""The quadruped example: its model is what the README says, it learns to move forward quickly, and on rough
terrain its envs climb the curriculum.

The slow tests train the README examples, seeded, on one device. The flat one for 100 of its train steps
(307k env steps): the default run's evaluation at that step measured 0.64 m/s with one fall in ten episodes,
and the bar asks for a clear forward speed and fewer falls than episodes. The rough one for 200 (614k env
steps), from level 0: its training envs' mean level must rise past 1 (of 0-5).
"""

import dataclasses
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from examples.quadruped import DEFAULT_CONFIG, FEET, KD, KP, QuadrupedTask, terrain_config
from ksim import observations as obs
from ksim import rewards as rew
from ksim.config import ConfigError, parse_overrides
from ksim.engine import load_mujoco_model
from ksim.physics import create_engine

NUM_STEPS = 100
SPEED_BAR = 0.2  # m/s


def test_model_is_a_small_quadruped_that_touches_the_floor_only_with_its_feet() -> None:
    model = load_mujoco_model("quadruped.xml")
    assert 12.0 < model.body_subtreemass[1] < 14.0
    hinges = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_HINGE]
    assert len(hinges) == 12 and all(model.jnt_limited[hinges]) and model.nu == 12
    touching = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in np.flatnonzero(model.geom_conaffinity)}
    assert touching == set(FEET)  # each foot body holds one sphere of the same name


def test_pd_loop_holds_the_home_pose() -> None:
    model = load_mujoco_model("quadruped.xml")
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, 0)
    home = model.key_qpos[0, 7:]
    for _ in range(400):  # 2 s
        torque = KP * (home - data.qpos[7:]) - KD * data.qvel[6:]  # the example's PD loop, zero action
        data.ctrl[:] = np.clip(torque, *model.actuator_ctrlrange.T)
        mujoco.mj_step(model, data)
    assert 0.2 < data.qpos[2] < 0.3 and np.abs(data.qvel).max() < 0.1  # standing still on its feet


def test_gait_components_at_the_home_pose() -> None:
    engine = create_engine(load_mujoco_model("quadruped.xml"), ctrl_dt=0.02, dt=0.005)
    home = engine.default_qpos
    qvel = np.zeros(engine.mj_model.nv)
    qvel[0] = 0.5  # the whole robot slides forward at 0.5 m/s, feet included
    data = engine.make_data(jnp.asarray(home), jnp.asarray(qvel))
    no_action = jnp.zeros(engine.action_dim)
    ctx = engine.context(data, data, no_action, no_action, data.ctrl)
    np.testing.assert_allclose(obs.GaitPhase(period_s=0.5).observe(ctx), [0.0, 1.0], atol=1e-6)  # t = 0
    quarter = ctx.replace(data=data.replace(time=jnp.asarray(0.125)))
    np.testing.assert_allclose(obs.GaitPhase(period_s=0.5).observe(quarter), [1.0, 0.0], atol=1e-6)
    assert float(rew.JointPoseDeviation(scale=1.0, pose=tuple(home[7:])).bind(ctx.layout).value(ctx)) == pytest.approx(
        0.0, abs=1e-10
    )
    assert float(rew.FeetSlip(scale=1.0, feet=FEET, contact_height=0.03).bind(ctx.layout).value(ctx)) == pytest.approx(
        4 * 0.5**2, rel=1e-4
    )
    swing = rew.FootSwingTracking(scale=1.0, feet=FEET, offsets=(0.0, 0.5, 0.5, 0.0), ground_height=0.022).bind(
        ctx.layout
    )
    assert float(swing.value(ctx)) > 0.99  # t = 0: every foot's target is the ground, where the feet are
    # A quarter cycle on, FR and RL (offset 0) should be 8 cm above the ground height; FL and RR on it.
    feet = np.asarray([data.xpos[engine.layout.body_names.index(foot), 2] for foot in FEET])
    miss = feet - (0.022 + np.array([0.08, 0.0, 0.0, 0.08]))
    assert float(swing.value(quarter)) == pytest.approx(np.exp(-np.sum(miss**2) / 0.05**2), rel=1e-4)
    # A swing of 0.4 of the cycle: a quarter cycle is 0.625 of the way through FR and RL's swing; at 0.45 of the
    # cycle every foot stands (FR and RL have landed, FL and RR at 0.95 have not lifted): double support.
    short = rew.FootSwingTracking(
        scale=1.0, feet=FEET, offsets=(0.0, 0.5, 0.5, 0.0), ground_height=0.022, swing_fraction=0.4
    ).bind(ctx.layout)
    lift = 0.08 * np.sin(np.pi * 0.625)
    miss = feet - (0.022 + np.array([lift, 0.0, 0.0, lift]))
    assert float(short.value(quarter)) == pytest.approx(np.exp(-np.sum(miss**2) / 0.05**2), rel=1e-4)
    between = ctx.replace(data=data.replace(time=jnp.asarray(0.225)))
    assert float(short.value(between)) == pytest.approx(np.exp(-np.sum((feet - 0.022) ** 2) / 0.05**2), rel=1e-4)
    with pytest.raises(ConfigError, match=r"swing_fraction=1.0 must be in \(0, 1\)"):
        rew.FootSwingTracking(scale=1.0, feet=FEET, offsets=(0.0, 0.5, 0.5, 0.0), swing_fraction=1.0).bind(
            engine.layout
        )
    # With min_command, a zero command makes every target the ground; a command above it keeps the swing.
    standing = rew.FootSwingTracking(
        scale=1.0, feet=FEET, offsets=(0.0, 0.5, 0.5, 0.0), ground_height=0.022, min_command=0.1
    ).bind(ctx.layout)
    assert standing.command_size == 1
    on_ground = np.exp(-np.sum((feet - 0.022) ** 2) / 0.05**2)
    assert float(standing.value(quarter.replace(command=jnp.zeros(3)))) == pytest.approx(on_ground, rel=1e-4)
    walking = quarter.replace(command=jnp.array([0.5, 0.0, 0.0]))
    assert float(standing.value(walking)) == pytest.approx(float(swing.value(quarter)), rel=1e-5)
    with pytest.raises(ConfigError, match="offsets has 2 values; feet has 4"):
        rew.FootSwingTracking(scale=1.0, feet=FEET, offsets=(0.0, 0.5)).bind(engine.layout)
    with pytest.raises(ConfigError, match="pose has 3 values; the model has 12 robot joints"):
        rew.JointPoseDeviation(scale=1.0, pose=(0.0, 0.0, 0.0)).bind(engine.layout)
    # Named joints: only theirs count, in the order named.
    names = tuple(engine.layout.joint_names[j] for j in engine.layout.robot_joints[:2])
    some = rew.JointPoseDeviation(scale=1.0, pose=(0.3, -0.2), joints=names[::-1]).bind(ctx.layout)
    expected = (home[8] - 0.3) ** 2 + (home[7] + 0.2) ** 2
    assert float(some.value(ctx)) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ConfigError, match="pose has 1 values; the model has 2 named joints"):
        rew.JointPoseDeviation(scale=1.0, pose=(0.0,), joints=names).bind(engine.layout)


@pytest.mark.slow
def test_quadruped_moves_forward_after_a_short_training(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "num_devices": 1,
        "num_steps": NUM_STEPS,
        "eval_every_n_steps": 0,
        "save_every_n_steps": 0,
    }
    task = QuadrupedTask(dataclasses.replace(DEFAULT_CONFIG, run_dir=str(tmp_path), **settings))
    state = task.run()
    result = task.evaluate(task.fetch_replicated(state.shared))
    speed, fall_rate = float(np.mean(result.speed_x)), float(np.mean(result.fell))
    print(f"quadruped after {NUM_STEPS} train steps: base speed {speed:.2f} m/s, fall rate {fall_rate:.2f}")
    assert speed > SPEED_BAR and fall_rate < 1.0


ROUGH_STEPS = 200
LEVEL_BAR = 1.0  # of 0-5; both seeds of the README's run were at 1.7-1.8 after 150 train steps


@pytest.mark.slow
def test_rough_quadruped_climbs_the_curriculum(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "terrain": "rough",
        "num_devices": 1,
        "num_steps": ROUGH_STEPS,
        "eval_every_n_steps": 0,
        "save_every_n_steps": 0,
    }
    task = QuadrupedTask(dataclasses.replace(DEFAULT_CONFIG, run_dir=str(tmp_path), **settings))
    assert task.curriculum is not None and task.curriculum.max_start_level == 0  # every env starts on level 0
    state = task.run()
    mean_level = float(np.mean(np.asarray(state.env.terrain.level)))
    print(f"rough quadruped after {ROUGH_STEPS} train steps: training envs' mean level {mean_level:.2f}")
    assert mean_level > LEVEL_BAR


def test_terrain_rough_on_the_command_line_trains_1500_steps_unless_told() -> None:
    assert terrain_config([]).num_steps == DEFAULT_CONFIG.num_steps != 1500
    rough = parse_overrides(terrain_config(["terrain=rough"]), ["terrain=rough"])
    assert (rough.terrain, rough.num_steps) == ("rough", 1500)
    told = parse_overrides(terrain_config(["num_steps=200", "terrain=rough"]), ["num_steps=200", "terrain=rough"])
    assert (told.terrain, told.num_steps) == ("rough", 200)
    assert parse_overrides(terrain_config(["terrain=flat"]), ["terrain=flat"]).num_steps == DEFAULT_CONFIG.num_steps
