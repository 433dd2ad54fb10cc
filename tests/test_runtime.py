"""ksim.runtime: the training environment and the runtime, fed the same states, agree on every observation
class of ksim that a robot can compute (the others are declared simulator-only), on docs/tasks.md's worked
observation, on the action and on the actuators' control (float32 precision)."""

import dataclasses
import functools
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import mujoco
import numpy as np
import pytest
from helpers import BLOCK_JAX, TINY, docs_observation

from examples import cartpole, g1_tracking, hopper, kbot, quadruped, spot, walking
from ksim import observations as obs
from ksim import tracking as trk
from ksim.actuators import Actuators, PositionActuators, PositionServoActuators, TorqueActuators
from ksim.config import ConfigError
from ksim.deploy.onnx import export_policy
from ksim.deploy.robot_side import describe_inputs
from ksim.engine import ModelLayout, load_mujoco_model
from ksim.modes.export import exported_policy, robot_side, simulator_inputs_line, task_identity
from ksim.policy_spec import SIMULATOR, load_policy_spec
from ksim.runtime import PolicyRuntime, RuntimeInputError
from ksim.sim2sim import MujocoReader

STEPS = 30


class HopperWithOrientation(hopper.HopperTask):
    """The hopper's actor also reads the base's orientation, which no example's does."""

    def get_observations(self) -> list[obs.Observation]:
        return [*super().get_observations(), obs.BaseOrientation()]


class KBotWithClippedGyro(kbot.KBotTask):
    """K-Bot's actor also reads docs/tasks.md's gyro observation."""

    def get_observations(self) -> list[obs.Observation]:
        return [*super().get_observations(), docs_observation()()]


CASES: dict[str, tuple[type, Any, dict[str, Any]]] = {
    "cartpole": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {}),
    "cartpole with history": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {"observation_history": 3}),
    "cartpole with a GRU": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {"recurrent_size": 8}),
    "hopper": (HopperWithOrientation, hopper.DEFAULT_CONFIG, {}),
    "quadruped": (quadruped.QuadrupedTask, quadruped.DEFAULT_CONFIG, {}),
    "spot": (spot.SpotTask, spot.DEFAULT_CONFIG, {}),
    "humanoid, sim-to-real preset": (walking.WalkingTask, walking.GPU_CONFIG, {}),
    "K-Bot (gravity from the IMU's quaternion, docs/tasks.md's clipped gyro)": (
        KBotWithClippedGyro,
        kbot.DEFAULT_CONFIG,
        {},
    ),
    "G1 tracking every clip (the reference from the motion file at the runtime's clock)": (
        g1_tracking.G1TrackingTask,
        g1_tracking.DEFAULT_CONFIG,
        {"motion": "all"},
    ),
}


def build(case: str) -> Any:
    task_type, config, overrides = CASES[case]
    return task_type(dataclasses.replace(config, **{**TINY, **overrides}))


def shared_state(task: Any) -> Any:
    """Fresh parameters with an observation normaliser that is not the identity, so the export carries it."""
    shared = task.init_shared(jax.random.PRNGKey(0))
    dim = shared.normalizer.mean.shape[0]
    mean_key, var_key = jax.random.split(jax.random.PRNGKey(1))
    normalizer = shared.normalizer.replace(
        mean=0.3 * jax.random.normal(mean_key, (dim,)), var=jax.random.uniform(var_key, (dim,), minval=0.5, maxval=2)
    )
    return shared.replace(normalizer=normalizer)


def drive(task: Any, shared: Any) -> dict[str, np.ndarray]:
    """One env's deterministic episode in the training environment: per step its state, command, observation,
    action and the actuators' control at that state."""
    environment = task.environment
    episode = jax.jit(environment.start_episode)(jax.random.PRNGKey(2))
    step = jax.jit(functools.partial(environment.step_env, deterministic=True))
    ctrl = jax.jit(lambda action, data: environment.components.actuators.ctrl(action, data))
    keys = ("qpos", "qvel", "command", "command_state", "obs", "action", "ctrl")
    record: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    for _ in range(STEPS):
        before = episode
        episode, transition = step(shared, episode)
        action = transition.trajectory.action
        for key, value in (
            ("qpos", before.data.qpos),
            ("qvel", before.data.qvel),
            ("command", before.command),
            ("command_state", before.command_state),
            ("obs", transition.trajectory.obs),
            ("action", action),
            ("ctrl", ctrl(action, before.data)),
        ):
            record[key].append(np.asarray(value))
    return {key: np.stack(values) for key, values in record.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_runtime_matches_training_on_the_same_states(case: str, tmp_path: Path) -> None:
    task = build(case)
    shared = shared_state(task)
    recorded = drive(task, shared)
    onnx_path = tmp_path / "policy.onnx"
    export_policy(
        exported_policy(task, shared),
        task.checkpoints.metadata,
        "",
        onnx_path,
        robot=robot_side(task),
        task=task_identity(task, onnx_path.parent),
    )
    runtime = PolicyRuntime.load(onnx_path)
    model = mujoco.MjModel.from_binary_path(str(tmp_path / "policy.mjb"))
    data, reader = mujoco.MjData(model), MujocoReader(model, runtime.spec)
    actuated = [model.joint(name) for name in runtime.actuation.joints]
    qpos_index = [int(joint.qposadr[0]) for joint in actuated]
    qvel_index = [int(joint.dofadr[0]) for joint in actuated]
    assert runtime.spec.observation_size == task.environment.observation_dim
    if runtime.motion is None:
        runtime.reset()
    else:  # the episode's first frame, in the simulator's world (no heading to align)
        runtime.reset(frame=int(recorded["command_state"][0]), heading=0.0)
    for t in range(STEPS):
        data.qpos[:], data.qvel[:] = recorded["qpos"][t], recorded["qvel"][t]
        mujoco.mj_forward(model, data)
        readings = reader.read(model, data, recorded["command"][t])
        frame = recorded["obs"][t][-runtime.spec.observation_size :]  # with history, the newest of the frames
        np.testing.assert_allclose(runtime.observation(readings), frame, rtol=1e-5, atol=2e-5)
        out = runtime.step(readings)
        assert not out.held
        np.testing.assert_allclose(out.action, recorded["action"][t], rtol=1e-5, atol=2e-5)
        q, qd = recorded["qpos"][t][qpos_index], recorded["qvel"][t][qvel_index]
        np.testing.assert_allclose(out.ctrl(q, qd), recorded["ctrl"][t], rtol=1e-5, atol=1e-4)
        if out.kind != "servo":  # a motor's torque is gear x ctrl; a servo's is the servo's own
            gear = np.asarray(runtime.actuation.gear, np.float32)
            np.testing.assert_allclose(out.torque(q, qd), gear * recorded["ctrl"][t], rtol=1e-5, atol=1e-3)


def observation_classes() -> list[type[obs.Observation]]:
    """Every observation class ksim defines (ksim.observations, ksim.tracking), abstract and private ones left out."""
    found, queue = [], list(obs.Observation.__subclasses__())
    while queue:
        cls = queue.pop()
        queue.extend(cls.__subclasses__())
        ours = cls.__module__ in (obs.__name__, trk.__name__)
        if ours and not cls.__name__.startswith("_") and not inspect.isabstract(cls):
            found.append(cls)
    return sorted(set(found), key=lambda cls: cls.__name__)


def test_every_observation_class_is_checked_on_a_robot_or_declared_simulator_only() -> None:
    """Each class of ksim.observations either says only a simulator knows it, or is read by a case above, whose
    test proves its robot-side form equal to its training form on the same states."""
    used = {type(o) for case in CASES for o in build(case).environment.components.observations}
    classes = observation_classes()
    assert {obs.JointPosition, obs.Sensor, obs.HeightScan} <= set(classes)  # the enumeration sees them
    unchecked = [cls.__name__ for cls in classes if cls.robot_input is not obs.simulator_only and cls not in used]
    assert unchecked == []


def test_every_actuator_class_is_checked_on_a_robot() -> None:
    """Each actuator class of ksim.actuators drives a case above, whose test proves the robot's control equal to
    training's on the same states."""
    used = {type(build(case).environment.components.actuators) for case in CASES}
    classes = {cls for cls in Actuators.__subclasses__() if not inspect.isabstract(cls)}
    assert {TorqueActuators, PositionActuators, PositionServoActuators} <= classes
    assert sorted(cls.__name__ for cls in classes - used) == []


def test_an_observation_that_does_not_say_what_a_robot_reads_is_refused_at_export() -> None:
    @dataclass(frozen=True)
    class TorsoHeight(obs.Observation):
        def observe(self, ctx: Any) -> Any:
            return ctx.base_pos[2:]

    @dataclass(frozen=True)
    class HalfGyro(obs.Sensor):  # observes otherwise than the Sensor whose robot form it inherits
        def observe(self, ctx: Any) -> Any:
            return 0.5 * super().observe(ctx)

    layout = ModelLayout.create(load_mujoco_model("kbot/kbot.xml"))
    with pytest.raises(ConfigError) as undefined:
        describe_inputs([TorsoHeight()], [("TorsoHeight", 1)], layout)
    assert str(undefined.value) == (
        "mode='export': TorsoHeight does not say what a robot reads for it: define TorsoHeight.robot_input(size, "
        "robot) (ksim.policy_spec's readings and transforms), or set robot_input = ksim.observations.simulator_only"
    )
    gyro = HalfGyro(sensor="imu_gyro").bind(layout)
    with pytest.raises(
        ConfigError, match=r"^mode='export': HalfGyro redefines observe\(\) but inherits robot_input\(\) "
    ):
        describe_inputs([gyro], [(gyro.name, 3)], layout)


def test_policy_json_says_which_inputs_only_a_simulator_knows(tmp_path: Path) -> None:
    task = build("hopper")
    export_policy(
        exported_policy(task, shared_state(task)),
        task.checkpoints.metadata,
        "",
        tmp_path / "policy.onnx",
        robot=robot_side(task),
    )
    spec = load_policy_spec(tmp_path / "policy.json")
    assert spec.simulator_inputs == ["BaseHeight", "BaseLinearVelocity"]
    assert [i.reading for i in spec.inputs if i.source == SIMULATOR] == ["base_height", "base_linear_velocity_world"]
    assert len(spec.joints) == 3  # hip, knee, ankle: the encoders


@pytest.fixture(scope="module")
def cartpole_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = build("cartpole")
    onnx_path = tmp_path_factory.mktemp("cartpole") / "policy.onnx"
    export_policy(
        exported_policy(task, shared_state(task)),
        task.checkpoints.metadata,
        "",
        onnx_path,
        robot=robot_side(task),
        task=task_identity(task, onnx_path.parent),
    )
    return onnx_path


CARTPOLE_READINGS = {"joint_positions": [0.1, 0.05], "joint_velocities": [0.0, -0.1]}  # slider, hinge


def test_a_missing_or_misshapen_reading_is_one_line_naming_it(cartpole_policy: Path) -> None:
    runtime = PolicyRuntime.load(cartpole_policy)
    with pytest.raises(RuntimeInputError) as missing:
        runtime.step({"joint_positions": [0.1, 0.05]})
    assert str(missing.value) == "reading 'joint_velocities' is missing: JointVelocity needs it (2 values)"
    with pytest.raises(RuntimeInputError) as wrong:
        runtime.step({**CARTPOLE_READINGS, "joint_positions": [0.1]})
    assert str(wrong.value) == "reading 'joint_positions' has 1 values; JointPosition needs 2"


def test_a_nan_reading_holds_the_previous_targets_and_says_so(cartpole_policy: Path) -> None:
    runtime = PolicyRuntime.load(cartpole_policy)
    first = runtime.step({"joint_positions": [0.1, float("nan")], "joint_velocities": [0.0, 0.0]})
    assert first.held == "reading 'joint_positions' holds nan at index 1: holding zero torque"
    assert np.all(first.ctrl() == 0) and runtime.steps == 0  # nothing advanced
    good = runtime.step(CARTPOLE_READINGS)
    assert not good.held and np.all(np.isfinite(good.ctrl())) and runtime.steps == 1


def test_an_older_policy_json_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text('{"format": "ksim-policy/1", "inputs": []}')
    with pytest.raises(ConfigError) as error:
        PolicyRuntime.load(tmp_path / "policy.onnx")
    assert "is an older export (format 'ksim-policy/1'" in str(error.value) and "mode=export" in str(error.value)
    assert "\n" not in str(error.value)


def test_export_refuses_simulator_inputs_when_the_task_is_for_a_robot() -> None:
    task = build("hopper")
    with pytest.raises(ConfigError) as error:
        simulator_inputs_line(robot_side(task), refuse=True)
    assert str(error.value) == (
        "robot_inputs_only=true: the policy reads what only a simulator knows: BaseHeight (reading 'base_height'), "
        "BaseLinearVelocity (reading 'base_linear_velocity_world')"
    )
    assert simulator_inputs_line(robot_side(build("spot")), refuse=True) == ""  # Spot's actor reads only sensors


def test_the_runtime_runs_without_jax(cartpole_policy: Path) -> None:
    """On a robot's computer: numpy, onnxruntime and mujoco, no JAX (blocked in a fresh interpreter)."""
    script = BLOCK_JAX + (
        "from ksim.runtime import PolicyRuntime\n"
        f"runtime = PolicyRuntime.load({str(cartpole_policy)!r})\n"
        f"print(runtime.step({CARTPOLE_READINGS!r}).ctrl().tolist())\n"
        "assert not any(m.split('.')[0] in ('jax', 'flax') for m in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = PolicyRuntime.load(cartpole_policy).step(CARTPOLE_READINGS).ctrl()
    np.testing.assert_allclose(json.loads(result.stdout), expected, rtol=1e-6)
