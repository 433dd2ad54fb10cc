"""Concurrent state estimation (`estimated_observations`): an estimator network predicts critic observations from
the actor's input, the actor reads its estimates, only the regression trains it, and the export carries it."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import optax
import pytest
from helpers import DistributedMemoryTask, MemoryTask, distributed_memory_config, memory_config
from test_distributed import relative_error

from ksim.checkpoint import save_checkpoint
from ksim.config import ConfigError
from ksim.learner.networks import ActorCritic, Feedforward
from ksim.learner.ppo_update import PPOBatch, ppo_minibatch_update
from ksim.modes import export
from ksim.task.devices import put_sharded, shard_env_axis
from ksim.task.ppo import critic_entries
from ksim.task.run_checkpoints import checkpoint_contents
from ksim.task.types import TrainState

LOSS = SimpleNamespace(
    clip_eps=0.2, value_clip_eps=0.2, value_coef=0.5, entropy_coef=0.0, symmetry_coef=0.0, estimator_coef=1.0
)
# The memory task's actor sees its target through noise for two steps; its critic sees the clean value.
ESTIMATING = {
    "privileged_critic": True,
    "noise": 0.05,
    "estimated_observations": ["TargetAtFirst"],
    "estimator_hidden": [16],
    "num_steps": 40,
}


def small_model() -> tuple[ActorCritic, Any]:
    model = ActorCritic(2, (8,), (8,), init_log_std=-1.0, estimate_size=3, estimator_hidden=(8,))
    return model, model.init(jax.random.PRNGKey(0), jnp.ones((1, 4)))


def test_the_actor_reads_the_estimate_but_its_gradient_stops_there() -> None:
    model, params = small_model()
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, 4))

    def action_mean(params: Any) -> jax.Array:
        return model.apply(params, obs, method=ActorCritic.policy)[0]

    grads = jax.grad(lambda p: jnp.sum(action_mean(p)))(params)["params"]
    assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(grads["estimator"]))
    assert any(np.any(leaf != 0) for leaf in jax.tree.leaves(grads["actor"]))
    moved = jax.tree.map(lambda leaf: leaf + 0.5, params["params"]["estimator"])
    other = {"params": {**params["params"], "estimator": moved}}
    assert np.abs(action_mean(other) - action_mean(params)).max() > 1e-4  # a different estimate, another action
    assert np.shape(model.apply(params, obs, method=ActorCritic.estimate)) == (5, 3)


def synthetic_batch(rng: jax.Array) -> PPOBatch:
    obs = jax.random.normal(rng, (8, 8, 4))
    zeros = jnp.zeros((8, 8))
    target = jnp.stack([2.0 * obs[..., 0] - obs[..., 1], jnp.tanh(obs[..., 2]), 0.5 * obs[..., 3]], axis=-1)
    return PPOBatch(obs, jnp.zeros((8, 8, 2)), zeros, zeros, zeros, zeros, estimate_target=target)


def test_the_update_fits_the_estimator_to_its_targets() -> None:
    model, params = small_model()
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    batch = synthetic_batch(jax.random.PRNGKey(3))
    update = jax.jit(lambda p, s: ppo_minibatch_update(Feedforward(model), optimizer, LOSS, p, s, batch))
    losses = []
    for _ in range(300):
        params, opt_state, metrics = update(params, opt_state)
        losses.append(float(metrics["estimator_loss"]))
    assert losses[-1] < 0.05 * losses[0]


def test_critic_entries_are_the_named_observations_values_in_the_order_asked() -> None:
    layout = [("A", 2), ("B", 3), ("C", 1)]
    assert critic_entries(layout, ["C", "A"]) == (5, 0, 1)
    with pytest.raises(ConfigError) as error:
        critic_entries(layout, ["D"])
    assert str(error.value) == "estimated_observations: 'D' is not a critic observation (they are A, B, C)"
    with pytest.raises(ConfigError, match="names an observation twice"):
        critic_entries(layout, ["A", "A"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"privileged_critic": False},
            "estimated_observations=['TargetAtFirst'] needs critic observations (get_critic_observations returns None)",
        ),
        (
            {"estimated_observations": ["Target"]},
            "estimated_observations: 'Target' is not a critic observation (they are TargetAtFirst, Command)",
        ),
        (
            {"recurrent_size": 8},
            "estimated_observations=['TargetAtFirst'] needs a memoryless policy (recurrent_size=8); a GRU can "
            "estimate for itself",
        ),
        ({"estimator_coef": 0.0}, "estimator_coef=0.0 must be positive"),
    ],
)
def test_an_estimator_that_cannot_apply_is_refused_in_one_line(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        MemoryTask(memory_config(**{**ESTIMATING, **overrides}))
    assert str(error.value) == message


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemoryTask, TrainState, Path]:
    """The memory task trained with an estimator of its clean target, and its checkpoint."""
    task = MemoryTask(memory_config(**ESTIMATING))
    state = task.init_train_state()
    for _ in range(task.config.num_steps):
        state, metrics = task.train_step(state)
    assert np.isfinite(float(metrics["estimator_loss"]))
    contents = checkpoint_contents(jax.device_get(state.shared), jax.random.PRNGKey(0), 40, 0)
    path = tmp_path_factory.mktemp("estimator") / "ckpt.bin"
    return task, state, save_checkpoint(path, contents, task.checkpoints.metadata)


def test_training_teaches_the_estimator_what_the_critic_sees(trained: tuple) -> None:
    task, state, _ = trained
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    shared = state.shared
    obs = task.normalize_obs(shared, trajectory.obs)
    target = task.critic_input(shared, trajectory.critic_obs, obs)[..., jnp.asarray(task.estimate_index)]
    estimate = task.model.estimate(shared.params, obs)
    assert task.estimate_index == (0,)  # TargetAtFirst, the critic's first observation
    explained = 1.0 - float(jnp.mean(jnp.square(estimate - target)) / jnp.var(target))
    assert explained > 0.9  # from inputs noised by 0.05, of a target whose deviation is 0.24


def test_the_exported_policy_runs_the_estimator_as_ksim_does(trained: tuple, tmp_path: Path) -> None:
    task, _, ckpt = trained
    onnx_path = tmp_path / "policy.onnx"
    exporter = MemoryTask(memory_config(**ESTIMATING, mode="export", load_from_ckpt_path=str(ckpt)))
    assert exporter.run(export.Settings(export_path=str(onnx_path))) == onnx_path
    shared = exporter.checkpoints.load(ckpt)["shared"]
    observations = np.linspace(-1.0, 1.0, 7, dtype=np.float32)[:, None]
    state = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (7, *leaf.shape)), task.initial_policy_state())
    obs, critic_obs, first = jnp.asarray(observations), jnp.zeros((7, 2)), jnp.ones(7, bool)
    out = task.act(shared, state, obs, critic_obs, first, jax.random.PRNGKey(0), deterministic=True)
    session = ort.InferenceSession(str(onnx_path))
    (onnx_actions,) = session.run(None, {session.get_inputs()[0].name: observations})
    np.testing.assert_allclose(onnx_actions, np.asarray(out.action), atol=1e-5, rtol=0)


def test_the_update_with_an_estimator_on_two_devices_equals_one_devices() -> None:
    one_minibatch = {**ESTIMATING, "num_envs": 8, "batch_size": 8, "rollout_length_frames": 8, "num_passes": 2}
    task = MemoryTask(memory_config(**one_minibatch))  # one minibatch: the same samples on any device count
    state = task.init_train_state()
    _, trajectory, _ = task.programs["rollout"](state.shared, state.env)
    shared, trajectory, rng = jax.device_get(state.shared), jax.device_get(trajectory), jax.random.PRNGKey(7)
    expected, expected_metrics = task.programs["update"](shared, trajectory, rng)

    distributed = DistributedMemoryTask(distributed_memory_config(**one_minibatch, num_devices=2))
    env_major = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), trajectory)
    per_device = jax.tree.map(lambda x: np.swapaxes(x, 1, 2), shard_env_axis(env_major, 2))
    placed = put_sharded(per_device, distributed.devices, distributed.axis_name)
    place = distributed.place_replicated
    result, metrics = distributed.programs["update"](place(shared), placed, place(rng))

    assert relative_error(distributed.fetch_replicated(result), jax.device_get(expected)) < 1e-5
    estimator_loss = distributed.fetch_replicated(metrics)["estimator_loss"]
    assert relative_error(estimator_loss, expected_metrics["estimator_loss"]) < 1e-5


def test_a_checkpoint_with_an_estimator_is_refused_by_a_task_without_one(trained: tuple) -> None:
    _, _, ckpt = trained
    plain = MemoryTask(memory_config(privileged_critic=True, noise=0.05, allow_checkpoint_mismatch=True))
    with pytest.raises(ConfigError) as error:
        plain.checkpoints.load(ckpt)
    assert str(error.value) == (
        f"load_from_ckpt_path={str(ckpt)!r}: estimated_observations=['TargetAtFirst'] in the checkpoint, [] here "
        "(the setting must match the checkpoint's)"
    )
