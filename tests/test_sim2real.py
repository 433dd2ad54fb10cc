"""Domain randomization, commands, pushes, observation noise and action delay on one device."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import BALL_MOTOR, BALL_XML, BallTask, ball_config, cartpole_config

from examples.cartpole import CartpoleTask
from ksim import observations as obs
from ksim import randomization as rnd
from ksim import rewards as rew
from ksim.actuators import PositionActuators, TorqueActuators, delay_action
from ksim.commands import VelocityCommand, advance_command, check_command_users
from ksim.config import ConfigError
from ksim.engine import ModelLayout, load_mujoco_model
from ksim.events import Push, run_events
from ksim.physics import create_engine
from ksim.task.env import Episode, bind_components

NUM_ENVS = 8


@pytest.fixture(scope="module")
def task() -> BallTask:
    return BallTask(ball_config())


@pytest.fixture(scope="module")
def starts(task: BallTask) -> list[Episode]:
    """Episodes 0 and 1 of 8 envs, as the env pool draws them: key fold_in(env key, episode)."""
    env_keys = jax.random.split(jax.random.PRNGKey(3), NUM_ENVS)
    start = jax.jit(
        jax.vmap(lambda key, index: task.environment.start_episode(jax.random.fold_in(key, index)), (0, None))
    )
    return [jax.device_get(start(env_keys, index)) for index in (0, 1)]


def test_randomized_fields_differ_per_env_and_per_episode_and_stay_in_range(task: BallTask, starts: list) -> None:
    first, second = (episode.randomized for episode in starts)
    model = task.engine.mj_model
    assert set(first.model_fields) == {
        "geom_friction",
        "body_mass",
        "body_inertia",
        "body_ipos",
        "dof_damping",
        "dof_armature",
        "actuator_gainprm",
        "actuator_biasprm",
    }  # only the randomized fields are per env
    assert set(first.gain_scales) == {"kp", "kd"}
    for values in (first, second):
        friction = values.model_fields["geom_friction"]
        assert friction.shape == (NUM_ENVS, model.ngeom, 3)
        assert np.all((friction[:, 0, 0] >= 0.5) & (friction[:, 0, 0] <= 1.5))  # the floor
        np.testing.assert_array_equal(
            friction[:, 1:], np.broadcast_to(np.float32(model.geom_friction[1:]), (NUM_ENVS, model.ngeom - 1, 3))
        )
        np.testing.assert_array_equal(
            friction[:, 0, 1:], np.broadcast_to(np.float32(model.geom_friction[0, 1:]), (NUM_ENVS, 2))
        )
        ball_mass = values.model_fields["body_mass"][:, 1]  # 2 kg scaled by [0.8, 1.2], plus [-0.5, 1] kg
        assert np.all((ball_mass >= 2 * 0.8 - 0.5) & (ball_mass <= 2 * 1.2 + 1.0))
        offset = values.model_fields["body_ipos"][:, 1] - model.body_ipos[1]
        assert np.all(np.abs(offset) <= 0.02 + 1e-7)
        damping = values.model_fields["dof_damping"][:, 6] / model.dof_damping[6]
        assert np.all((damping >= 0.5) & (damping <= 2.0))
        np.testing.assert_array_equal(values.model_fields["dof_damping"][:, :6], 0.0)  # root dofs untouched
        assert np.all((values.gain_scales["kp"] >= 0.8) & (values.gain_scales["kp"] <= 1.2))
    for field in ("body_mass", "geom_friction", "dof_damping"):
        per_env = first.model_fields[field].reshape(NUM_ENVS, -1)
        assert len({row.tobytes() for row in per_env}) == NUM_ENVS, field
        assert not np.any(np.all(per_env == second.model_fields[field].reshape(NUM_ENVS, -1), axis=1)), field


def test_commands_and_timers_are_drawn_per_env_at_episode_start(starts: list) -> None:
    first, second = starts
    command = first.command
    assert command.shape == (NUM_ENVS, 3)
    both = np.concatenate([first.command, second.command])
    assert np.any(np.all(both == 0, axis=1)) and np.any(both != 0)  # zero_probability=0.3: some stand still
    assert np.all((command[:, 0] >= -0.5) & (command[:, 0] <= 1.0))
    assert np.all(np.abs(command[:, 1]) <= 0.3) and np.all(np.abs(command[:, 2]) <= 0.5)
    assert np.all((first.command_state >= 2) & (first.command_state <= 5))  # 0.04 .. 0.1 s at ctrl_dt=0.02
    assert first.event_timers.shape == (NUM_ENVS, 1)
    assert not np.array_equal(first.command, second.command)
    assert first.action_queue.shape == (NUM_ENVS, 1, 1)  # action_delay_steps=1


def test_mass_randomization_changes_the_dynamics() -> None:
    engine = create_engine(load_mujoco_model("cartpole.xml"), ctrl_dt=0.02, dt=0.01)
    qpos, qvel = jnp.asarray(engine.default_qpos, jnp.float32), jnp.zeros(engine.mj_model.nv)
    # An episode's data is made with its model fields, and stepped with them.
    step = jax.jit(
        lambda fields: engine.step(engine.make_data(qpos, qvel, fields), lambda _: jnp.ones(1), fields)[0].qvel
    )
    mass = jnp.asarray(engine.mj_model.body_mass)
    light, heavy = step({"body_mass": mass}), step({"body_mass": mass.at[1].multiply(3.0)})
    assert float(light[0]) == pytest.approx(3.0 * float(heavy[0]), rel=0.05)  # same push, a 3x heavier cart


def test_pd_gain_scales_reach_the_actuators(task: BallTask) -> None:
    actuators = task.actuators
    assert isinstance(actuators, PositionActuators)
    data = SimpleNamespace(qpos=jnp.asarray(task.engine.default_qpos), qvel=jnp.zeros(task.engine.mj_model.nv))
    action = jnp.full(1, 0.01)
    base = actuators.ctrl(action, data)  # type: ignore[arg-type]
    np.testing.assert_allclose(
        actuators.ctrl(
            action,
            data,  # type: ignore[arg-type]
            {"kp": jnp.full(1, 0.5)},
        ),
        0.5 * base,
        rtol=1e-6,
    )


def test_push_kicks_the_base_when_its_timer_runs_out(task: BallTask) -> None:
    layout, engine = task.engine.layout, task.engine
    push = Push(max_velocity=(1.0, 1.0, 0.5), interval_s=(0.04, 0.1)).bind(layout)
    data = engine.make_data(jnp.asarray(engine.default_qpos, jnp.float32), jnp.zeros(engine.mj_model.nv))
    pushed, timers = run_events((push,), data, jnp.array([1]), layout, jax.random.PRNGKey(0), 0.02)
    kick = np.asarray(pushed.qvel[:3])
    assert np.all(np.abs(kick) <= [1.0, 1.0, 0.5]) and np.abs(kick).sum() > 0
    np.testing.assert_array_equal(pushed.qvel[3:], 0.0)
    assert 2 <= int(timers[0]) <= 5
    waiting, timers = run_events((push,), data, jnp.array([4]), layout, jax.random.PRNGKey(0), 0.02)
    np.testing.assert_array_equal(waiting.qvel, data.qvel)
    assert int(timers[0]) == 3


def test_command_is_redrawn_only_when_its_timer_runs_out() -> None:
    command = VelocityCommand(zero_probability=0.0)
    value, timer = advance_command(command, jnp.zeros(3), jnp.asarray(3), jax.random.PRNGKey(1), 0.02)
    assert int(timer) == 2 and np.all(np.asarray(value) == 0)
    value, timer = advance_command(command, jnp.zeros(3), jnp.asarray(1), jax.random.PRNGKey(1), 0.02)
    assert np.any(np.asarray(value) != 0) and 200 <= int(timer) <= 400  # resample_s=(4, 8)


def test_observation_noise_is_on_in_training_only_unless_asked_for_in_evaluation(task: BallTask) -> None:
    assert task.environment.noisy_observations(deterministic=False) and not task.environment.noisy_observations(
        deterministic=True
    )
    evaluated_with_noise = BallTask(ball_config(eval_observation_noise=True))
    assert evaluated_with_noise.environment.noisy_observations(deterministic=True)
    # JointPosition (1, Gaussian), JointVelocity (1, uniform), then none
    gaussian, uniform = task.environment.noise_scales
    np.testing.assert_allclose(gaussian, [0.05, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(uniform, [0, 0.05, 0, 0, 0, 0, 0, 0])
    noisy = jax.vmap(lambda key: obs.add_noise(jnp.zeros(8), task.environment.noise_scales, key))(
        jax.random.split(jax.random.PRNGKey(0), 4000)
    )
    assert np.std(noisy[:, 0]) == pytest.approx(0.05, rel=0.1)
    assert np.max(np.abs(noisy[:, 1])) <= 0.05 and np.std(noisy[:, 1]) == pytest.approx(0.05 / np.sqrt(3), rel=0.1)
    np.testing.assert_array_equal(noisy[:, 2:], 0.0)


def test_actions_are_applied_after_the_configured_delay() -> None:
    queue = jnp.zeros((2, 1))
    applied = []
    for step in range(1, 5):
        action, queue = delay_action(queue, jnp.full(1, float(step)))
        applied.append(float(action[0]))
    assert applied == [0.0, 0.0, 1.0, 2.0]
    action, _ = delay_action(jnp.zeros((0, 1)), jnp.ones(1))
    assert float(action[0]) == 1.0


FREE = BallTask(ball_config(sim2real=False)).engine.layout


def test_scaling_a_field_the_model_sets_to_zero_is_refused_when_the_task_is_built() -> None:
    model = load_mujoco_model("kbot/kbot.xml")  # friction loss and armature on its joints, no damping
    layout, actuators = ModelLayout.create(model), TorqueActuators.from_model(model)

    def bind(randomizations: list[rnd.Randomization]) -> None:
        bind_components(layout, model, [], None, [], [], [], randomizations, None, [], actuators)

    bind([rnd.JointFrictionLoss(0.8, 1.2), rnd.JointArmature(0.8, 1.2)])
    with pytest.raises(ConfigError) as error:
        bind([rnd.JointArmature(0.8, 1.2), rnd.JointDamping(0.8, 1.2)])
    assert str(error.value) == (
        "JointDamping scales dof_damping, which the model sets to 0 on every dof it names: "
        "there is nothing to randomize"
    )


@pytest.mark.parametrize(
    ("component", "message"),
    [
        (rnd.BodyMass(1.2, 0.8), "BodyMass: low=1.2 must be <= high=0.8 (the range of body_mass)"),
        (rnd.BodyMass(0.0, 1.2), "BodyMass: low=0.0 must be positive (it scales body_mass)"),
        (rnd.FloorFriction(-0.1, 1.0), "FloorFriction: low=-0.1 must be positive (it scales geom_friction)"),
        (rnd.GeomFriction(0.5, 1.0, geoms=("ice",)), "GeomFriction.geoms: no geom named 'ice'; the model's geoms"),
        (rnd.JointDamping(0.0, 2.0), "JointDamping: low=0.0 must be positive (it scales dof_damping)"),
        (rnd.JointArmature(2.0, 1.0), "JointArmature: low=2.0 must be <= high=1.0 (the range of dof_armature)"),
        (rnd.JointFrictionLoss(0.5, 2.0, joints=("elbow",)), "JointFrictionLoss.joints: no joint named 'elbow'"),
        (rnd.ActuatorStrength(-1.0, 1.0), "ActuatorStrength: low=-1.0 must be positive (it scales actuator_gainprm)"),
        (rnd.PositionGain(0.0, 1.0), "PositionGain: low=0.0 must be positive (it scales kp)"),
        (rnd.AddedBaseMass(1.0, -1.0), "AddedBaseMass: low=1.0 must be <= high=-1.0 (the range of body_mass)"),
        (rnd.CenterOfMassOffset(0.1, 0.0), "CenterOfMassOffset: low=0.1 must be <= high=0.0 (the range of body_ipos)"),
        (rnd.BodyMass(0.8, 1.2, bodies=("leg",)), "BodyMass.bodies: no body named 'leg'"),
        (VelocityCommand(forward=(1.0, 0.5)), "VelocityCommand.forward=(1.0, 0.5) is an empty range (low must be <="),
        (VelocityCommand(yaw_rate=(0.2, -0.2)), "VelocityCommand.yaw_rate=(0.2, -0.2) is an empty range"),
        (VelocityCommand(resample_s=(0.0, 1.0)), "VelocityCommand.resample_s=(0.0, 1.0) must be positive"),
        (VelocityCommand(zero_probability=1.5), "VelocityCommand.zero_probability=1.5 must be in [0, 1]"),
        (Push(interval_s=(2.0, 1.0)), "Push.interval_s=(2.0, 1.0) is an empty range"),
        (Push(max_velocity=(-1.0, 0.0, 0.0)), "Push.max_velocity=(-1.0, 0.0, 0.0) must be >= 0 on every axis"),
        (rew.LinearVelocityTracking(scale=1.0, sigma=0.0), "LinearVelocityTracking: sigma=0.0 must be positive"),
    ],
)
def test_bad_component_settings_name_the_component_and_the_rule(component: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        component.bind(FREE)  # type: ignore[attr-defined]
    assert str(error.value).startswith(message)


def test_push_refuses_a_fixed_base_and_a_planar_root() -> None:
    with pytest.raises(
        ConfigError, match=r"^Push needs a moving base, but the base body 'ball' is welded to the world"
    ):
        Push().bind(ModelLayout.create(mujoco.MjModel.from_xml_string(BALL_XML.format(root="", actuator=BALL_MOTOR))))
    cartpole = ModelLayout.create(load_mujoco_model("cartpole.xml"))  # its root is a slider
    with pytest.raises(ConfigError, match=r"^Push needs a free root joint, but the base body 'cart'"):
        Push().bind(cartpole)


class _CartpoleWithGains(CartpoleTask):
    def get_randomizations(self) -> list[rnd.Randomization]:
        return [rnd.VelocityGain(0.5, 1.5)]


class _CartpoleTracking(CartpoleTask):
    def get_observations(self) -> list[obs.Observation]:
        return [obs.JointPosition(joints=("hinge",)), obs.Command()]


class _CartpoleNoisy(CartpoleTask):
    def get_observations(self) -> list[obs.Observation]:
        return [obs.JointPosition(joints=("hinge",), noise=0.1, noise_type="pink")]


@pytest.mark.parametrize(
    ("task_class", "overrides", "message"),
    [
        (
            _CartpoleWithGains,
            {},
            "VelocityGain scales PD gains, which needs PositionActuators or PositionServoActuators",
        ),
        (_CartpoleTracking, {}, "Command reads the command, but the task has none (get_command returns None)"),
        (_CartpoleNoisy, {}, "JointPosition.noise_type='pink' must be one of 'gaussian', 'uniform'"),
        (CartpoleTask, {"action_delay_steps": -1}, "action_delay_steps=-1 must be >= 0"),
    ],
)
def test_bad_task_settings_fail_when_the_task_is_built(task_class: type, overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        task_class(cartpole_config(**overrides))
    assert str(error.value).startswith(message)


def test_command_users_need_a_command_big_enough() -> None:
    @dataclasses.dataclass(frozen=True)
    class OneValue(VelocityCommand):
        size = 1  # type: ignore[misc]

    with pytest.raises(ConfigError, match="AngularVelocityTracking reads 3 command values; OneValue has 1"):
        check_command_users(OneValue(), [rew.AngularVelocityTracking(scale=1.0)])


def test_evaluation_runs_the_pushes_unless_eval_events_is_off(task: BallTask, starts: list) -> None:
    episode = jax.tree.map(lambda leaf: leaf[0], starts[0])
    due = episode.replace(event_timers=jnp.ones_like(episode.event_timers))
    not_due = episode.replace(event_timers=jnp.full_like(episode.event_timers, 100))
    shared = task.init_shared(jax.random.PRNGKey(0))

    def evaluation_step(of: BallTask, start: Episode) -> np.ndarray:
        stepped, _ = jax.jit(lambda e: of.environment.step_env(shared, e, deterministic=True))(start)
        return np.asarray(stepped.data.qvel)

    calm = BallTask(ball_config(eval_events=False))
    assert not np.allclose(evaluation_step(task, due), evaluation_step(task, not_due))  # pushed
    np.testing.assert_array_equal(evaluation_step(calm, due), evaluation_step(calm, not_due))
