"""physics_impl through a task: the setting is checked, and a Warp train step (resets, randomization, pushes,
commands, two devices) equals the JAX one."""

import jax
import numpy as np
import pytest
from helpers import DistributedBallTask, distributed_ball_config
from mujoco import mjx

from ksim import mjx_contract
from ksim.config import ConfigError

needs_warp = pytest.mark.skipif(
    not mjx_contract.warp_installed(), reason="warp-lang is not installed (pip install 'ksim[warp]')"
)


def test_an_unknown_physics_impl_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"physics_impl='cuda' must be one of 'auto', 'jax', 'warp', 'mujoco'"):
        DistributedBallTask(distributed_ball_config(physics_impl="cuda"))


@needs_warp
def test_a_warp_train_step_on_two_devices_equals_the_jax_one() -> None:
    """Resets, randomization (8 model fields), pushes and commands on two devices, as the JAX implementation."""
    results = {}
    for impl in ("jax", "warp"):
        task = DistributedBallTask(distributed_ball_config(num_devices=2, physics_impl=impl))
        assert task.engine.mjx_model.impl == mjx.Impl(impl)
        stepped, metrics = task.train_step(task.init_train_state())
        results[impl] = (jax.device_get(stepped.env.current.data.qpos), task.fetch_replicated(metrics))
    (jax_qpos, jax_metrics), (warp_qpos, warp_metrics) = results["jax"], results["warp"]
    np.testing.assert_allclose(warp_qpos, jax_qpos, atol=1e-3, rtol=1e-3)
    for name in ("reward/LinearVelocityTracking", "reward/AngularVelocityTracking"):
        np.testing.assert_allclose(warp_metrics[name], jax_metrics[name], rtol=1e-3, err_msg=name)
