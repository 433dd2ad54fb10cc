"""Policies with memory (recurrent_size, observation_history) and the privileged critic, on the memory task.

One rollout of a recurrent, history-keeping policy with a privileged critic and noised observations, with
episodes that end inside the rollout: its recorded memory, the update's replay of it (log-probabilities equal
the rollout's), the critic's and the actor's inputs, and one update on 1, 2 and 4 devices.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DistributedMemoryTask, MemoryTask, distributed_memory_config, memory_config, onnxruntime_snippet
from test_distributed import relative_error

from ksim.checkpoint import save_checkpoint
from ksim.config import ConfigError
from ksim.deploy.onnx import load_policy_spec
from ksim.learner.ppo_update import PPOBatch, ppo_loss, ppo_minibatch_update
from ksim.modes import export
from ksim.task.devices import put_sharded, shard_env_axis
from ksim.task.run_checkpoints import checkpoint_contents
from ksim.task.types import SharedState, Trajectory

ROOT = Path(__file__).resolve().parents[1]
HISTORY = 3
SMALL = {
    "num_envs": 8,
    "batch_size": 8,  # one minibatch: updates on different device counts agree to float precision
    "rollout_length_frames": 8,
    "episode_length_steps": 5,  # every env starts a second episode inside the rollout
    "num_passes": 2,
    "actor_hidden": [16],
    "critic_hidden": [16],
}
MEMORY_POLICY = {**SMALL, "recurrent_size": 8, "observation_history": HISTORY, "privileged_critic": True, "noise": 0.1}


@pytest.fixture(scope="module")
def task() -> MemoryTask:
    return MemoryTask(memory_config(**MEMORY_POLICY))


@pytest.fixture(scope="module")
def rollout(task: MemoryTask) -> tuple:
    state = task.init_train_state()
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    return jax.device_get(state.shared), jax.device_get(trajectory)


def frames(trajectory: Trajectory) -> np.ndarray:
    return np.asarray(trajectory.obs).reshape(*trajectory.obs.shape[:2], HISTORY, -1)


def starts(trajectory: Trajectory) -> np.ndarray:
    """(T, E): whether a step is an episode's first (episode lengths are 5, so steps 0 and 5)."""
    return np.isin(np.arange(trajectory.obs.shape[0]), [0, 5])[:, None] & np.ones(trajectory.obs.shape[1], bool)


def test_history_starts_from_the_first_frame_and_shifts_by_one(rollout: tuple) -> None:
    _, trajectory = rollout
    done = np.asarray(trajectory.truncated)
    assert done[4].all() and not done[:4].any()  # the rollout holds an episode end, at step 4
    history, first = frames(trajectory), starts(trajectory)
    np.testing.assert_array_equal(history[first], np.repeat(history[first][:, -1:], HISTORY, axis=1))
    np.testing.assert_array_equal(history[1:][~first[1:]][:, :-1], history[:-1][~first[1:]][:, 1:])


def test_recurrent_state_starts_from_zeros_with_every_episode(rollout: tuple) -> None:
    _, trajectory = rollout
    carry = np.asarray(trajectory.carry)  # (T, E, 2, recurrent_size): before each step
    first = starts(trajectory)
    assert carry.shape[2:] == (2, 8)
    assert np.all(carry[first] == 0)
    assert np.all(np.abs(carry[~first]).max(axis=(1, 2)) > 0)  # both networks' states move


def test_critic_reads_its_own_unnoised_inputs_and_the_actor_its_own(task: MemoryTask, rollout: tuple) -> None:
    shared, trajectory = rollout
    target_seen = np.asarray(trajectory.critic_obs)[..., 0]  # the critic's TargetAtFirst: exact
    command = np.asarray(trajectory.critic_obs)[..., 1]  # the critic's Command: the target, all episode
    actor_frame = frames(trajectory)[..., -1, 0]
    shown = starts(trajectory) | np.roll(starts(trajectory), 1, axis=0)  # the first two steps of an episode
    np.testing.assert_array_equal(target_seen[shown], command[shown])
    assert np.all(target_seen[~shown] == 0)
    assert np.abs(actor_frame - target_seen).min() > 0  # the actor's frame is noised, every step
    assert 0.05 < np.std(actor_frame - target_seen) < 0.2  # noise=0.1

    values = jax.jit(task.replay_rollout)
    mean, _, value, _ = values(shared, trajectory)
    other_actor = trajectory.replace(obs=trajectory.obs + 1.0)
    other_critic = trajectory.replace(critic_obs=trajectory.critic_obs + 1.0)
    mean_a, _, value_a, _ = values(shared, other_actor)
    mean_c, _, value_c, _ = values(shared, other_critic)
    np.testing.assert_array_equal(value_a, value)  # the critic never reads the actor's input
    np.testing.assert_array_equal(mean_c, mean)  # nor the actor the critic's
    assert np.abs(value_c - value).max() > 1e-4 and np.abs(mean_a - mean).max() > 1e-6


def test_first_epoch_log_probs_equal_the_rollouts(task: MemoryTask, rollout: tuple) -> None:
    shared, trajectory = rollout
    batch = jax.jit(task.prepare_batch)(shared, trajectory)
    np.testing.assert_allclose(batch.log_prob, np.swapaxes(trajectory.log_prob, 0, 1), atol=2e-5, rtol=0)
    advantage = batch.advantage
    _, metrics = jax.jit(lambda p, b: ppo_loss(task.model, p, b, task.config, advantage))(shared.params, batch)
    assert abs(float(metrics["approx_kl"])) < 1e-6 and float(metrics["clip_fraction"]) == 0.0


def test_minibatch_update_is_a_free_function(task: MemoryTask, rollout: tuple) -> None:
    shared, trajectory = rollout
    batch = jax.jit(task.prepare_batch)(shared, trajectory)
    update = jax.jit(lambda p, o, b: ppo_minibatch_update(task.model, task.optimizer, task.config, p, o, b))
    params, _, metrics = update(shared.params, shared.opt_state, batch)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["local_grad_norm"]) > 0
    assert relative_error(params, shared.params) > 0
    assert isinstance(batch, PPOBatch) and batch.carry.shape == (8, 2, 8) and batch.starts.shape == (8, 8)


@pytest.mark.parametrize("num_devices", [1, 2, 4])
def test_update_on_n_devices_equals_single_device_update(task: MemoryTask, rollout: tuple, num_devices: int) -> None:
    shared, trajectory = rollout
    rng = jax.random.PRNGKey(7)
    expected, expected_metrics = task.programs["update"](shared, trajectory, rng)

    distributed = DistributedMemoryTask(distributed_memory_config(**MEMORY_POLICY, num_devices=num_devices))
    env_major = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), trajectory)
    per_device = jax.tree.map(lambda x: np.swapaxes(x, 1, 2), shard_env_axis(env_major, num_devices))
    placed = put_sharded(per_device, distributed.devices, distributed.axis_name)
    place = distributed.place_replicated
    result, metrics = distributed.programs["update"](place(shared), placed, place(rng))

    assert relative_error(distributed.fetch_replicated(result), jax.device_get(expected)) < 1e-5
    assert relative_error(distributed.fetch_replicated(metrics)["loss"], expected_metrics["loss"]) < 1e-5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"recurrent_size": -1}, "recurrent_size=-1 must be >= 0"),
        ({"observation_history": 0}, "observation_history=0 must be positive"),
    ],
)
def test_bad_memory_settings_fail_before_anything_is_built(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        MemoryTask(memory_config(**overrides))
    assert str(error.value) == message


def test_bad_memory_setting_is_one_line_and_exit_code_2_on_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.cartpole", "observation_history=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: observation_history=0 must be positive"
    ]
    assert "compiling" not in result.stdout


def test_critic_observation_needing_a_missing_command_is_refused() -> None:
    class NoCommand(MemoryTask):
        def get_command(self) -> None:
            return None

        def get_observations(self) -> list:
            return []

        def get_rewards(self) -> list:
            return []

    with pytest.raises(ConfigError) as error:
        NoCommand(memory_config(privileged_critic=True))
    assert str(error.value) == "TargetAtFirst reads the command, but the task has none (get_command returns None)"


def checkpoint_of(task: MemoryTask, path: Path) -> Path:
    """A checkpoint file with `task`'s metadata (its contents do not matter: the metadata is refused first)."""
    return save_checkpoint(path, {"step": np.asarray(0)}, task.checkpoints.metadata)


@pytest.mark.parametrize(
    ("written", "loaded", "message"),
    [
        ({}, {"recurrent_size": 8}, "recurrent_size=0 in the checkpoint, 8 here"),
        ({"observation_history": 3}, {}, "observation_history=3 in the checkpoint, 1 here"),
        (
            {},
            {"privileged_critic": True},
            "critic observations differ: the checkpoint has no critic group (the critic reads the actor's input), "
            "MemoryTask has TargetAtFirst(1), Command(1)",
        ),
    ],
)
def test_checkpoints_refuse_another_memory_or_critic_layout(
    tmp_path: Path, written: dict, loaded: dict, message: str
) -> None:
    path = checkpoint_of(MemoryTask(memory_config(**written)), tmp_path / "ckpt.bin")
    with pytest.raises(ConfigError) as error:
        MemoryTask(memory_config(**loaded)).checkpoints.load(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    if "recurrent_size" in message:  # a memory mismatch cannot be overridden: the networks differ
        with pytest.raises(ConfigError, match="recurrent_size=0 in the checkpoint"):
            MemoryTask(memory_config(**loaded, allow_checkpoint_mismatch=True)).checkpoints.load(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemoryTask, SharedState, Path]:
    """A recurrent, history-keeping policy (random weights, non-trivial normaliser) exported with mode=export."""
    directory = tmp_path_factory.mktemp("export")
    settings = {**MEMORY_POLICY, "noise": 0.0}
    writer = MemoryTask(memory_config(**settings))
    shared = jax.device_get(writer.init_shared(jax.random.PRNGKey(1)))
    leaves, treedef = jax.tree.flatten(shared.params)
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    noisy = [leaf + 0.3 * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys, strict=True)]
    normalizer = shared.normalizer.replace(mean=shared.normalizer.mean + 0.2, var=shared.normalizer.var * 3.0)
    shared = shared.replace(params=jax.tree.unflatten(treedef, noisy), normalizer=normalizer)
    contents = checkpoint_contents(shared, jax.random.PRNGKey(0), 0, 0)
    ckpt = save_checkpoint(directory / "ckpt.bin", contents, writer.checkpoints.metadata)
    onnx_path = directory / "policy.onnx"
    exporter = MemoryTask(memory_config(**settings, mode="export", load_from_ckpt_path=str(ckpt)))
    assert exporter.run(export.Settings(export_path=str(onnx_path))) == onnx_path
    return exporter, shared, onnx_path


def ksim_actions(task: MemoryTask, shared: SharedState, observations: np.ndarray, episode_steps: int) -> np.ndarray:
    """ksim's own deterministic actions, step by step, for one robot whose episodes last `episode_steps`."""
    act = jax.jit(
        lambda state, obs, first: task.act(shared, state, obs, jnp.zeros((1, 2)), first, jax.random.PRNGKey(0), True)
    )
    fresh = jax.tree.map(lambda leaf: leaf[None], task.initial_policy_state())  # every episode starts from it
    actions, state = [], fresh
    for step, obs in enumerate(observations):
        first = step % episode_steps == 0
        out = act(fresh if first else state, obs[None], jnp.asarray(first))
        actions.append(np.asarray(out.action[0]))
        state = out.state
    return np.stack(actions)


def test_policy_json_describes_the_memory_and_its_reset_rule(exported: tuple) -> None:
    _, _, onnx_path = exported
    spec = load_policy_spec(onnx_path.with_suffix(".json"))
    assert (spec.recurrent_size, spec.observation_history, spec.observation_size) == (8, HISTORY, 1)
    assert [(item.input_name, item.output_name, item.shape) for item in spec.memory] == [
        ("recurrent_state", "next_recurrent_state", [8]),
        ("past_observations", "next_past_observations", [HISTORY - 1, 1]),
    ]
    assert "zeros" in spec.memory[0].reset and "first observation" in spec.memory[1].reset


def test_docs_snippet_runs_the_exported_policy_step_by_step_as_ksim_does(exported: tuple) -> None:
    task, shared, onnx_path = exported
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", onnxruntime_snippet("policies.md")],  # -I: no ksim on the path, as on a robot
        cwd=onnx_path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.strip().splitlines()]
    assert len(printed) == 8
    observations = np.sin(np.arange(8, dtype=np.float32))[:, None]  # what the snippet's read_sensors returns
    expected = ksim_actions(task, shared, observations, episode_steps=5)
    np.testing.assert_allclose(np.asarray(printed), expected, atol=1e-5, rtol=0)
    assert np.ptp(expected) > 0.01  # the actions move with the observations and the memory
