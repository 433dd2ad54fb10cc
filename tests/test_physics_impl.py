"""physics_impl through a task: the setting is checked, and a Warp train step (resets, randomization, pushes,
commands, two devices) equals the JAX one, and one whose reward reads contacts is refused in one line."""

from collections.abc import Sequence

import jax
import numpy as np
import pytest
from helpers import DistributedBallTask, distributed_ball_config
from mujoco import mjx

from ksim import rewards as rew
from ksim.config import ConfigError
from ksim.physics import mjx_contract

needs_warp = pytest.mark.skipif(
    not mjx_contract.warp_installed(), reason="warp-lang is not installed (pip install 'ksim[warp]')"
)


def test_an_unknown_physics_impl_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"physics_impl='cuda' must be one of 'auto', 'jax', 'warp', 'mujoco'"):
        DistributedBallTask(distributed_ball_config(physics_impl="cuda"))


class ContactFreeBallTask(DistributedBallTask):
    """The ball task without FeetAirTime, its one term that reads contacts, which Warp does not give per env."""

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [reward for reward in super().get_rewards() if not isinstance(reward, rew.FeetAirTime)]


@needs_warp
def test_a_warp_train_step_on_two_devices_equals_the_jax_one() -> None:
    """Resets, randomization (8 model fields), pushes and commands on two devices, as the JAX implementation."""
    results = {}
    for impl in ("jax", "warp"):
        task = ContactFreeBallTask(distributed_ball_config(num_devices=2, physics_impl=impl))
        assert task.engine.mjx_model.impl == mjx.Impl(impl)
        stepped, metrics = task.train_step(task.init_train_state())
        results[impl] = (jax.device_get(stepped.env.current.data.qpos), task.fetch_replicated(metrics))
    (jax_qpos, jax_metrics), (warp_qpos, warp_metrics) = results["jax"], results["warp"]
    np.testing.assert_allclose(warp_qpos, jax_qpos, atol=1e-3, rtol=1e-3)
    for name in ("reward/LinearVelocityTracking", "reward/AngularVelocityTracking"):
        np.testing.assert_allclose(warp_metrics[name], jax_metrics[name], rtol=1e-3, err_msg=name)
    with_contacts = DistributedBallTask(distributed_ball_config(num_devices=2, physics_impl="warp"))
    with pytest.raises(ConfigError, match=r"^a component reads contacts, which physics_impl='warp' does not give"):
        with_contacts.train_step(with_contacts.init_train_state())
