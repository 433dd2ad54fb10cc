"""DistributedPPOTask on forced CPU devices: equivalence with one device, replica checks, local SGD."""

import os
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import DistributedCartpoleTask, cartpole_config, distributed_cartpole_config

from examples.cartpole import CartpoleTask
from ksim.task.devices import (
    put_sharded,
    shard_env_axis,
    unshard_env_axis,
)
from ksim.task.distributed_rl import ReplicaDivergenceError
from ksim.task.rl import TrainState
from ksim.xla_setup import (
    cap_cpu_isa_at_avx2,
    keep_small_dots_off_ynnpack,
    lapack_splits_batches,
    quiet_cached_program_loads,
    version_tuple,
)

ONE_MINIBATCH = {"num_envs": 8, "batch_size": 8}


def relative_error(a: object, b: object) -> float:
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-12)))
    return worst


@pytest.fixture(scope="module")
def single() -> CartpoleTask:
    return CartpoleTask(cartpole_config(**ONE_MINIBATCH))


@pytest.fixture(scope="module")
def rollout_data(single: CartpoleTask) -> tuple:
    state = single.init_train_state()
    _, trajectory, _ = single.programs["rollout"](state.shared, state.env)
    return jax.device_get(state.shared), jax.device_get(trajectory)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_update_on_n_devices_equals_single_device_update(
    single: CartpoleTask, rollout_data: tuple, num_devices: int
) -> None:
    shared, trajectory = rollout_data
    rng = jax.random.PRNGKey(7)
    expected, expected_metrics = single.programs["update"](shared, trajectory, rng)

    task = DistributedCartpoleTask(distributed_cartpole_config(**ONE_MINIBATCH, num_devices=num_devices))
    # Trajectories are time-major (T, E, ...): shard the env axis, then put the device axis first.
    env_major = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), trajectory)
    per_device = jax.tree.map(lambda x: np.swapaxes(x, 1, 2), shard_env_axis(env_major, num_devices))
    placed = put_sharded(per_device, task.devices, task.axis_name)
    result, metrics = task.programs["update"](task.place_replicated(shared), placed, task.place_replicated(rng))

    assert relative_error(task.fetch_replicated(result), jax.device_get(expected)) < 1e-5
    assert relative_error(task.fetch_replicated(metrics)["loss"], expected_metrics["loss"]) < 1e-5


def test_one_device_run_matches_ppo_task_step_for_step(single: CartpoleTask) -> None:
    reference = CartpoleTask(cartpole_config())
    distributed = DistributedCartpoleTask(distributed_cartpole_config(num_devices=1))
    ref_state, dist_state = reference.init_train_state(), distributed.init_train_state()
    for _ in range(3):
        ref_state, ref_metrics = reference.train_step(ref_state)
        dist_state, dist_metrics = distributed.train_step(dist_state)
        assert relative_error(distributed.fetch_replicated(dist_state.shared), ref_state.shared) < 1e-5
        assert relative_error(unshard_env_axis(dist_state.env.obs), ref_state.env.obs) < 1e-5
        assert relative_error(distributed.fetch_replicated(dist_metrics), ref_metrics) < 1e-5


@pytest.fixture(scope="module")
def four_device_task() -> DistributedCartpoleTask:
    return DistributedCartpoleTask(distributed_cartpole_config(num_devices=4))


@pytest.fixture(scope="module")
def four_device_state(four_device_task: DistributedCartpoleTask) -> TrainState:
    return four_device_task.init_train_state()


def perturbed(task: DistributedCartpoleTask, state: TrainState, device: int, value: float) -> TrainState:
    """The state with one element of the first parameter leaf changed on one device only."""
    leaves, treedef = jax.tree.flatten(state.shared.params)
    copies = np.array(jax.device_get(leaves[0]))
    copies[device].flat[0] = value if np.isnan(value) else copies[device].flat[0] + value
    leaves[0] = put_sharded(copies, task.devices, task.axis_name)
    return state.replace(shared=state.shared.replace(params=jax.tree.unflatten(treedef, leaves)))


def test_replicas_start_identical(four_device_task: DistributedCartpoleTask, four_device_state: TrainState) -> None:
    assert four_device_task.replica_divergences(four_device_state) == []


def test_check_raises_naming_leaf_and_device(four_device_task, four_device_state) -> None:
    broken = perturbed(four_device_task, four_device_state, device=2, value=1e-3)
    with pytest.raises(
        ReplicaDivergenceError,
        match=r"step 5: shared/params/params/actor/Dense_0/bias: device 2 differs from device 0 by up to 0.001",
    ):
        four_device_task.check_replicas(broken, step=5)


def test_check_reports_nan_separately(four_device_task, four_device_state) -> None:
    broken = perturbed(four_device_task, four_device_state, device=1, value=float("nan"))
    with pytest.raises(ReplicaDivergenceError, match="1 NaN/Inf values on device 1"):
        four_device_task.check_replicas(broken, step=1)


def test_resync_repairs_from_device_zero(four_device_state: TrainState) -> None:
    task = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4, on_divergence="resync"))
    broken = perturbed(task, four_device_state, device=3, value=0.5)
    with pytest.warns(UserWarning, match="device 3 differs .* resynchronising from device 0"):
        repaired = task.check_replicas(broken, step=1)
    assert task.replica_divergences(repaired) == []
    assert relative_error(task.fetch_replicated(repaired.shared), task.fetch_replicated(four_device_state.shared)) == 0


def test_train_step_makes_no_implicit_transfers(four_device_task, four_device_state) -> None:
    with jax.transfer_guard("disallow"):
        state, metrics = four_device_task.train_step(four_device_state)
        state, metrics = four_device_task.train_step(state)
    assert np.isfinite(four_device_task.fetch_replicated(metrics)["loss"])
    assert four_device_task.replica_divergences(state) == []


def test_local_sgd_averages_at_sync_points_only() -> None:
    task = DistributedCartpoleTask(
        distributed_cartpole_config(num_devices=2, grad_sync_period=2, consistency_check_every_n_steps=1)
    )
    state = task.init_train_state()
    state, _ = task.train_step(state)
    state = task.after_train_step(state, step=1)  # not a sync point: no averaging, no check
    assert {d.path.split("/")[0] for d in task.replica_divergences(state)} == {"shared"}
    state, _ = task.train_step(state)
    state = task.after_train_step(state, step=2)  # averages, then checks (raise mode) without error
    assert task.replica_divergences(state) == []


def test_checkpoints_move_between_device_counts_and_to_ppo_task(tmp_path: Path) -> None:
    four = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4, run_dir=str(tmp_path / "four")))
    four_state = four.run()
    ckpt = tmp_path / "four" / "checkpoints" / "ckpt_latest.bin"

    single = CartpoleTask(cartpole_config())
    contents = single.checkpoints.load(ckpt)
    assert relative_error(contents["shared"], four.fetch_replicated(four_state.shared)) == 0
    returns = single.evaluate(contents["shared"], num_episodes=2).returns
    assert returns.shape == (2,)

    two = DistributedCartpoleTask(
        distributed_cartpole_config(
            num_devices=2, num_steps=3, load_from_ckpt_path=str(ckpt), run_dir=str(tmp_path / "two")
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no divergence warnings on resume
        two_state = two.run()
    resumed = two.checkpoints.load(tmp_path / "two" / "checkpoints" / "ckpt_latest.bin")
    assert int(resumed["step"]) == 3
    assert two.replica_divergences(two_state) == []


def test_debug_prints_per_device_from_inside_the_train_step(capfd: pytest.CaptureFixture[str]) -> None:
    task = DistributedCartpoleTask(distributed_cartpole_config(num_devices=2, debug=True))
    _, metrics = task.train_step(task.init_train_state())
    jax.block_until_ready(metrics)
    jax.effects_barrier()
    out = capfd.readouterr().out
    for device in (0, 1):
        assert f"[device {device}] rollout: episodes_finished=" in out
        assert f"[device {device}] update: loss=" in out and "local_grad_norm=" in out


def test_lapack_deadlock_guard_applies_from_jaxlib_0_10() -> None:
    assert version_tuple("0.10.2.dev20260101") == (0, 10, 2)
    assert not lapack_splits_batches("0.9.2")
    assert lapack_splits_batches("0.10.0") and lapack_splits_batches("1.0")


def test_ynnpack_fusions_are_turned_off_from_jaxlib_0_10_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    keep_small_dots_off_ynnpack("0.10.0")
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    keep_small_dots_off_ynnpack("0.10.2")
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2",
        "--xla_cpu_experimental_ynn_fusion_type=",
    ]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")  # a user's own choice stays
    keep_small_dots_off_ynnpack("0.10.2")
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_experimental_ynn_fusion_type=dot"


def test_cached_program_load_warnings_are_quieted_on_jaxlib_0_9_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    quiet_cached_program_loads("0.10.2")
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    quiet_cached_program_loads("0.9.2")
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"  # warnings off, errors on
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # a user's own choice stays
    quiet_cached_program_loads("0.9.2")
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_cpu_programs_are_capped_at_avx2_on_x86_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    cap_cpu_isa_at_avx2("aarch64")
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    cap_cpu_isa_at_avx2("x86_64")
    assert os.environ["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=2", "--xla_cpu_max_isa=AVX2"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX512")  # a user's own choice stays
    cap_cpu_isa_at_avx2("AMD64")
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX512"


@pytest.mark.parametrize("num_devices", [2])
def test_the_scaled_learner_updates_alike_on_one_and_n_devices(rollout_data: tuple, num_devices: int) -> None:
    """At 4x the reference's envs the adaptive rule steers to 4^(3/4) times the KL target with a clip 4^(3/8) times
    as wide, on every device count."""
    scaled = {**ONE_MINIBATCH, "learning_rate_schedule": "adaptive", "reference_num_envs": 2, "desired_kl": 1e-3}
    shared, trajectory = rollout_data
    rng = jax.random.PRNGKey(7)
    single = CartpoleTask(cartpole_config(**scaled))
    assert single.desired_kl == pytest.approx(1e-3 * 4**0.75) and single.clip_eps == pytest.approx(0.2 * 4**0.375)
    start = single.init_shared(jax.random.PRNGKey(0)).replace(normalizer=shared.normalizer)
    expected, expected_metrics = single.programs["update"](start, trajectory, rng)

    task = DistributedCartpoleTask(distributed_cartpole_config(**scaled, num_devices=num_devices))
    env_major = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), trajectory)
    per_device = jax.tree.map(lambda x: np.swapaxes(x, 1, 2), shard_env_axis(env_major, num_devices))
    placed = put_sharded(per_device, task.devices, task.axis_name)
    result, metrics = task.programs["update"](task.place_replicated(start), placed, task.place_replicated(rng))

    assert relative_error(task.fetch_replicated(result), jax.device_get(expected)) < 1e-5
    rates = [float(m["learning_rate"]) for m in (task.fetch_replicated(metrics), expected_metrics)]
    assert rates[0] == pytest.approx(rates[1], rel=1e-6)
