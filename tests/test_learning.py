"""The cart-pole learns: deterministic mean return past a threshold within a bounded number of steps.

Seeded and bounded in train steps, not in time. The full return is 500 (10 s of +1 per step); the
initial policy gets about 30.
"""

import dataclasses

import numpy as np
import pytest
from helpers import DistributedCartpoleConfig, DistributedCartpoleTask

from examples.cartpole import DEFAULT_CONFIG, CartpoleTask

pytestmark = pytest.mark.slow  # each test trains for minutes

NUM_STEPS = 40
THRESHOLD = 450.0


def learned_return(task: CartpoleTask) -> float:
    state = task.run()
    returns = task.evaluate(task.fetch_replicated(state.shared), num_episodes=16).returns
    return float(np.mean(returns))


def test_cartpole_learns_on_one_device(tmp_path) -> None:
    config = dataclasses.replace(DEFAULT_CONFIG, num_steps=NUM_STEPS, run_dir=str(tmp_path))
    assert learned_return(CartpoleTask(config)) > THRESHOLD


@pytest.mark.parametrize("num_devices", [2, 4])
def test_cartpole_learns_on_several_devices(tmp_path, num_devices: int) -> None:
    settings = dataclasses.asdict(DEFAULT_CONFIG) | {"num_steps": NUM_STEPS, "run_dir": str(tmp_path)}
    config = DistributedCartpoleConfig(**settings, num_devices=num_devices)
    assert learned_return(DistributedCartpoleTask(config)) > THRESHOLD
