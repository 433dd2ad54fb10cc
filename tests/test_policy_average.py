"""policy_average_decay: a moving average of the parameters (Polyak averaging) is what is evaluated, exported and
viewed, while the update keeps training the latest parameters."""

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from helpers import DistributedMemoryTask, MemoryTask, distributed_memory_config, memory_config
from test_distributed import relative_error

from ksim.checkpoint import save_checkpoint
from ksim.config import ConfigError
from ksim.modes import export
from ksim.modes.view import view_shared
from ksim.task.run_checkpoints import checkpoint_contents
from ksim.task.types import SharedState, TrainState

DECAY = 0.8
STEPS = 6


def host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, jax.device_get(tree))


def trained_with_history(task: MemoryTask) -> tuple[TrainState, list[Any]]:
    """`STEPS` train steps and the latest parameters after each."""
    state = task.init_train_state()
    history = [host(task.fetch_replicated(state.shared).params)]
    for _ in range(STEPS):
        state, _ = task.train_step(state)
        history.append(host(task.fetch_replicated(state.shared).params))
    return state, history


def moving_average(history: list[Any], decay: float) -> Any:
    average = history[0]
    for params in history[1:]:
        average = jax.tree.map(lambda a, p: decay * a + (1.0 - decay) * p, average, params)
    return average


@pytest.fixture(scope="module")
def averaging() -> tuple[MemoryTask, TrainState, list[Any]]:
    task = MemoryTask(memory_config(policy_average_decay=DECAY))
    state, history = trained_with_history(task)
    return task, state, history


@pytest.fixture(scope="module")
def checkpoint(averaging: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    task, state, _ = averaging
    contents = checkpoint_contents(jax.device_get(state.shared), jax.random.PRNGKey(0), STEPS, 0)
    return save_checkpoint(tmp_path_factory.mktemp("average") / "ckpt.bin", contents, task.checkpoints.metadata)


@pytest.mark.parametrize("decay", [1.0, -0.1])
def test_a_decay_outside_zero_to_one_is_refused_in_one_line(decay: float) -> None:
    with pytest.raises(ConfigError) as error:
        MemoryTask(memory_config(policy_average_decay=decay))
    assert str(error.value) == f"policy_average_decay={decay} must be in [0, 1)"


def test_the_average_follows_the_latest_parameters_with_the_decay(averaging: tuple) -> None:
    _, state, history = averaging
    shared = host(state.shared)
    assert relative_error(shared.average_params, moving_average(history, DECAY)) < 1e-5
    assert relative_error(shared.average_params, shared.params) > 1e-3  # the update still trains the latest


def test_without_a_decay_no_average_is_kept_and_training_is_unchanged(averaging: tuple) -> None:
    _, _, history = averaging
    plain = MemoryTask(memory_config())
    state, plain_history = trained_with_history(plain)
    assert state.shared.average_params is None
    # The average is read by nothing in the update: the latest parameters train exactly as without one.
    assert relative_error(plain_history[-1], history[-1]) == 0.0


def test_evaluation_runs_the_average(averaging: tuple) -> None:
    task, state, _ = averaging
    shared = host(state.shared)
    averaged = task.evaluate(shared)
    same = task.evaluate(shared.replace(params=shared.average_params))
    latest = task.evaluate(shared.replace(average_params=shared.params))
    np.testing.assert_array_equal(averaged.returns, same.returns)
    assert not np.array_equal(averaged.returns, latest.returns)


def test_the_export_is_the_averaged_policy(averaging: tuple, checkpoint: Path, tmp_path: Path) -> None:
    task, state, _ = averaging
    onnx_path = tmp_path / "policy.onnx"
    exporter = MemoryTask(memory_config(policy_average_decay=DECAY, mode="export", load_from_ckpt_path=str(checkpoint)))
    assert exporter.run(export.Settings(export_path=str(onnx_path))) == onnx_path
    observations = np.linspace(-1.0, 1.0, 7, dtype=np.float32)[:, None]
    policy_state = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (7, *leaf.shape)), task.initial_policy_state())
    inputs = (jnp.asarray(observations), jnp.zeros((7, 1)), jnp.ones(7, bool), jax.random.PRNGKey(0))
    shared = host(state.shared)
    averaged = task.act(shared.deployed(), policy_state, *inputs, deterministic=True).action
    latest = task.act(shared, policy_state, *inputs, deterministic=True).action
    session = ort.InferenceSession(str(onnx_path))
    (onnx_actions,) = session.run(None, {session.get_inputs()[0].name: observations})
    np.testing.assert_allclose(onnx_actions, np.asarray(averaged), atol=1e-5, rtol=0)
    assert np.abs(onnx_actions - np.asarray(latest)).max() > 1e-4


def test_the_viewer_shows_the_average(averaging: tuple, checkpoint: Path) -> None:
    _, state, _ = averaging
    viewer = MemoryTask(memory_config(policy_average_decay=DECAY, mode="view", load_from_ckpt_path=str(checkpoint)))
    assert relative_error(view_shared(viewer).params, host(state.shared).average_params) == 0.0


def test_a_checkpoint_loads_with_or_without_an_average(averaging: tuple, checkpoint: Path, tmp_path: Path) -> None:
    task, state, _ = averaging
    saved = host(state.shared)
    plain = MemoryTask(memory_config())  # keeps no average: evaluates the checkpoint's latest parameters
    loaded: SharedState = plain.checkpoints.load(checkpoint)["shared"]
    assert loaded.average_params is None
    assert relative_error(loaded.deployed().params, saved.params) == 0.0

    contents = checkpoint_contents(saved.replace(average_params=None), jax.random.PRNGKey(0), STEPS, 0)
    without = save_checkpoint(tmp_path / "without.bin", contents, plain.checkpoints.metadata)
    started: SharedState = task.checkpoints.load(without)["shared"]  # the average starts at its parameters
    assert relative_error(started.average_params, saved.params) == 0.0


def test_on_two_devices_the_average_is_the_same_on_each_and_equals_the_latest_parameters_average() -> None:
    task = DistributedMemoryTask(distributed_memory_config(policy_average_decay=DECAY, num_devices=2))
    state, history = trained_with_history(task)
    assert not task.replica_divergences(state)  # the replica check covers the average
    average = task.fetch_replicated(state.shared).average_params
    assert relative_error(host(average), moving_average(history, DECAY)) < 1e-5


def test_local_sgd_averages_the_average_over_devices_too() -> None:
    task = DistributedMemoryTask(
        distributed_memory_config(policy_average_decay=DECAY, num_devices=2, grad_sync_period=2)
    )
    state = task.init_train_state()
    state, _ = task.train_step(state)  # local SGD: each device's average follows its own parameters
    per_device = host(state.shared.average_params)
    assert relative_error(jax.tree.map(lambda x: x[0], per_device), jax.tree.map(lambda x: x[1], per_device)) > 0
    state = task.after_train_step(state, 2)
    synced = host(state.shared.average_params)
    expected = jax.tree.map(lambda x: x.mean(axis=0), per_device)
    assert relative_error(jax.tree.map(lambda x: x[0], synced), expected) < 1e-6
    assert relative_error(jax.tree.map(lambda x: x[1], synced), expected) < 1e-6
