"""ksim.runtime: the training environment and the runtime, fed the same states, agree on every observation
component the bundled examples use, on the action and on the actuators' control (float32 precision)."""

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import mujoco
import numpy as np
import pytest
from helpers import BLOCK_JAX, TINY

from examples import cartpole, hopper, kbot, quadruped, spot, walking
from ksim.config import ConfigError
from ksim.export import export_policy
from ksim.modes.export import deterministic_step, robot_side, simulator_inputs_line, task_identity
from ksim.policy_spec import SIMULATOR, load_policy_spec
from ksim.runtime import PolicyRuntime, RuntimeInputError
from ksim.sim2sim import MujocoReader

STEPS = 30
CASES: dict[str, tuple[type, Any, dict[str, Any]]] = {
    "cartpole": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {}),
    "cartpole with history": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {"observation_history": 3}),
    "cartpole with a GRU": (cartpole.CartpoleTask, cartpole.DEFAULT_CONFIG, {"recurrent_size": 8}),
    "hopper": (hopper.HopperTask, hopper.DEFAULT_CONFIG, {}),
    "quadruped": (quadruped.QuadrupedTask, quadruped.DEFAULT_CONFIG, {}),
    "spot": (spot.SpotTask, spot.DEFAULT_CONFIG, {}),
    "humanoid, sim-to-real preset": (walking.WalkingTask, walking.GPU_CONFIG, {}),
    "K-Bot (gravity from the IMU's quaternion)": (kbot.KBotTask, kbot.DEFAULT_CONFIG, {}),
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
    record: dict[str, list[np.ndarray]] = {key: [] for key in ("qpos", "qvel", "command", "obs", "action", "ctrl")}
    for _ in range(STEPS):
        before = episode
        episode, transition = step(shared, episode)
        action = transition.trajectory.action
        for key, value in (
            ("qpos", before.data.qpos),
            ("qvel", before.data.qvel),
            ("command", before.command),
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
        deterministic_step(task, shared),
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
    runtime.reset()
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


def test_every_observation_component_of_the_examples_is_covered() -> None:
    """The cases above read every observation class the bundled examples' actors use."""
    used = {type(o).__name__ for case in CASES for o in build(case).environment.components.observations}
    assert used >= {
        "JointPosition",
        "JointVelocity",
        "ProjectedGravity",
        "BaseHeight",
        "BaseLinearVelocity",
        "BaseAngularVelocity",
        "Sensor",
        "FeetContact",
        "LastAction",
        "Command",
        "GaitPhase",
    }


def test_policy_json_says_which_inputs_only_a_simulator_knows(tmp_path: Path) -> None:
    task = build("hopper")
    export_policy(
        deterministic_step(task, shared_state(task)),
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
        deterministic_step(task, shared_state(task)),
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
