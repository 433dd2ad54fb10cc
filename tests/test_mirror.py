"""ksim.mirror: K-Bot's joints pair with their namesakes, the mirror image of a state gives the mirror image of
its observations, the symmetry loss is what it says, and what has no mirror image is refused in one line."""

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import docs_observation

from examples.kbot import DEFAULT_CONFIG, KBotTask
from ksim import observations as obs
from ksim.config import ConfigError
from ksim.engine import ModelLayout
from ksim.learner.networks import ActorCritic, Feedforward
from ksim.learner.ppo_update import PPOBatch, ppo_loss
from ksim.mirror import Mirror, MirrorContext, RobotGeometry, policy_mirror
from ksim.task.ppo import PPOConfig

TINY: dict[str, Any] = {"num_envs": 8, "batch_size": 4, "rollout_length_frames": 8, "symmetry_coef": 0.5}


@pytest.fixture(scope="module")
def task() -> KBotTask:
    return KBotTask(dataclasses.replace(DEFAULT_CONFIG, **TINY))


def test_kbots_joints_mirror_onto_their_namesakes_turning_the_way_their_limits_say(task: KBotTask) -> None:
    model, mirror = task.engine.mj_model, task.mirror
    assert mirror is not None
    joints = [model.joint(int(j)) for j in model.actuator_trnid[:, 0]]
    for joint, image, sign in zip(joints, mirror.action.order, mirror.action.sign, strict=True):
        name = joint.name.replace("left", "LEFT").replace("right", "left").replace("LEFT", "right")
        assert joints[image].name == name
        np.testing.assert_allclose(sorted(sign * joint.range), joints[image].range, atol=1e-5)


def _mirror_state(task: KBotTask, qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The state's reflection across the base's x-z plane (world y -> -y), joints by the joints' own mirror."""
    layout = task.engine.layout
    joints = layout.robot_joints
    joint_mirror = RobotGeometry.create(task.engine.mj_model, layout).joint_mirror(joints, "test")
    qpos, qvel = qpos.copy(), qvel.copy()
    qpos[1] *= -1
    qpos[3:7] *= [1, -1, 1, -1]  # R -> M R M
    qvel[1] *= -1  # world linear velocity
    qvel[3:6] *= [-1, 1, -1]  # body-frame angular velocity, a rotation vector
    qpos[layout.qpos_indices(joints)] = joint_mirror(qpos[layout.qpos_indices(joints)])
    qvel[layout.qvel_indices(joints)] = joint_mirror(qvel[layout.qvel_indices(joints)])
    return qpos, qvel


def test_the_mirror_image_of_a_state_gives_the_mirror_image_of_the_actors_observations(task: KBotTask) -> None:
    engine, environment, mirror = task.engine, task.environment, task.mirror
    assert mirror is not None
    rng = np.random.default_rng(0)
    qpos = np.asarray(engine.layout.default_qpos, np.float32)
    qpos[7:] += rng.normal(scale=0.2, size=qpos.size - 7)
    tilt = rng.normal(scale=0.1, size=3)
    quat = np.asarray([1.0, *tilt])
    qpos[3:7] = quat / np.linalg.norm(quat)
    qvel = rng.normal(scale=0.5, size=engine.mj_model.nv).astype(np.float32)
    action = rng.normal(size=engine.action_dim).astype(np.float32)
    command = np.asarray([0.6, 0.3, -0.4], np.float32)
    period = DEFAULT_CONFIG.gait_period_s

    def observe(qpos: np.ndarray, qvel: np.ndarray, action: np.ndarray, command: np.ndarray, time: float) -> np.ndarray:
        data = jax.jit(engine.make_data)(jnp.asarray(qpos), jnp.asarray(qvel)).replace(time=jnp.asarray(time))
        ctx = engine.context(data, data, jnp.asarray(action), jnp.asarray(action), data.ctrl, jnp.asarray(command))
        return np.asarray(environment.observe(ctx))

    original = observe(qpos, qvel, action, command, 0.13)
    mirrored = observe(
        *_mirror_state(task, qpos, qvel), mirror.action(action), command * [1, -1, -1], 0.13 + period / 2
    )
    np.testing.assert_allclose(mirrored, mirror.observation(original), atol=2e-4)
    assert mirror.observation(mirror.observation(original)) == pytest.approx(original)  # an involution


def test_the_symmetry_loss_is_the_mean_squared_distance_to_the_mirrored_action_and_enters_the_loss() -> None:
    model = ActorCritic(action_dim=2, actor_hidden=(8,), critic_hidden=(8,), init_log_std=-0.3)
    rng = np.random.default_rng(1)
    obs_, mirror_obs = (jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32) for _ in range(2))
    params = model.init(jax.random.PRNGKey(0), obs_)
    mean, _, value = cast(tuple[jax.Array, jax.Array, jax.Array], model.apply(params, obs_))
    zeros = jnp.zeros(value.shape)
    target = jnp.asarray(rng.normal(size=mean.shape), jnp.float32)
    plain = PPOBatch(obs_, mean, jnp.zeros(value.shape), value, zeros, value)
    mirrored = plain.replace(mirror_obs=mirror_obs, mirror_target=target)
    config = PPOConfig(symmetry_coef=0.5)

    loss, _ = ppo_loss(Feedforward(model), params, plain, config, zeros)
    with_symmetry, metrics = ppo_loss(Feedforward(model), params, mirrored, config, zeros)

    mirror_mean = np.asarray(model.apply(params, mirror_obs)[0])
    expected = np.mean((mirror_mean - np.asarray(target)) ** 2)
    assert float(metrics["symmetry_loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(with_symmetry) == pytest.approx(float(loss) + 0.5 * expected, rel=1e-5)


LEGS = """
<mujoco><worldbody><body name="base" pos="0 0 1"><freejoint/><geom size="0.1"/>
  <body name="left_leg" pos="0 0.1 0"><joint name="left_hip" axis="0 1 0"/><geom size="0.05"/></body>
  <body name="right_leg" pos="0 {right_y} 0"><joint name="right_hip" axis="0 1 0"/><geom size="0.05"/></body>
</body></worldbody>
<actuator><motor joint="left_hip"/><motor joint="right_hip"/></actuator></mujoco>
"""


def _mirror_of(xml: str, observations: list[obs.Observation]) -> Mirror:
    model = mujoco.MjModel.from_xml_string(xml)
    layout = ModelLayout.create(model)
    bound = [o.bind(layout) for o in observations]
    return policy_mirror(model, layout, bound, [2] * len(bound), None, 1).observation


def test_what_has_no_mirror_image_is_refused_in_one_line() -> None:
    mirror = _mirror_of(LEGS.format(right_y=-0.1), [obs.JointPosition()])
    assert mirror.order.tolist() == [1, 0] and mirror.sign.tolist() == [1.0, 1.0]
    feet = _mirror_of(LEGS.format(right_y=-0.1), [obs.FeetContact(feet=("right_leg", "left_leg"))])
    assert feet.order.tolist() == [1, 0] and feet.sign.tolist() == [1.0, 1.0]
    right_foot_forward = LEGS.format(right_y=-0.1).replace(
        'right_hip" axis="0 1 0"/><geom', 'right_hip" axis="0 1 0"/><geom pos="0.05 0 0"'
    )
    with pytest.raises(ConfigError, match=r"FeetContact\.feet: foot 'left_leg' has no mirror image among these feet"):
        _mirror_of(right_foot_forward, [obs.FeetContact(feet=("left_leg", "right_leg"))])
    with pytest.raises(ConfigError, match="joint 'left_hip' has no mirror image across the base's x-z plane"):
        _mirror_of(LEGS.format(right_y=-0.13), [obs.JointPosition()])
    with pytest.raises(ConfigError, match="observation BaseOrientation has no mirror image"):
        _mirror_of(LEGS.format(right_y=-0.1), [obs.BaseOrientation()])
    with pytest.raises(ConfigError, match=r"symmetry_coef=0\.5 needs a memoryless policy"):
        KBotTask(dataclasses.replace(DEFAULT_CONFIG, **TINY, recurrent_size=8))
    with pytest.raises(ConfigError, match=r"symmetry_coef=-1\.0 must be"):
        KBotTask(dataclasses.replace(DEFAULT_CONFIG, **{**TINY, "symmetry_coef": -1.0}))


def test_a_users_observation_without_its_own_mirror_is_told_what_to_define() -> None:
    @dataclass(frozen=True)
    class HipGap(obs.Observation):
        def observe(self, ctx: Any) -> Any:
            return ctx.joint_pos[:1] - ctx.joint_pos[1:]

    @dataclass(frozen=True)
    class DoubledJoints(obs.JointPosition):  # observes otherwise than the JointPosition whose mirror it inherits
        def observe(self, ctx: Any) -> Any:
            return 2.0 * super().observe(ctx)

    legs = LEGS.format(right_y=-0.1)
    with pytest.raises(ConfigError) as undefined:
        _mirror_of(legs, [HipGap()])
    assert str(undefined.value) == (
        "symmetry_coef > 0: observation HipGap has no mirror image: define HipGap.mirror(context) (ksim.mirror has "
        "the pieces)"
    )
    with pytest.raises(ConfigError) as stale:
        _mirror_of(legs, [DoubledJoints()])
    assert str(stale.value) == (
        "symmetry_coef > 0: DoubledJoints redefines observe() but inherits mirror() from JointPosition: define "
        "DoubledJoints.mirror(context) (ksim.mirror)"
    )


def test_the_docs_gyro_observation_mirrors_as_the_gyro_sensor_does(task: KBotTask) -> None:
    """docs/tasks.md's worked observation: its own mirror is the one ksim's Sensor gives the same gyro."""
    layout, model = task.engine.layout, task.engine.mj_model
    context = MirrorContext(RobotGeometry.create(model, layout), Mirror.signs(), None)
    own = docs_observation()().bind(layout).mirror(context)
    sensor = obs.Sensor(sensor="imu_gyro").bind(layout).mirror(context)
    assert own.order.tolist() == sensor.order.tolist() and own.sign.tolist() == sensor.sign.tolist()
    assert own.sign.tolist() != [1.0, 1.0, 1.0]  # some rates turn over: a mirror, not the identity
