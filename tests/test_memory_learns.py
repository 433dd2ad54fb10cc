"""The memory task (tests/helpers.py) learns with a recurrent policy, on 1 and 2 devices, and not without one.

The target is shown for the first 2 of 12 control steps; a step pays up to 1. A memoryless policy cannot
expect more than 2 + 10 / 4 = 4.5 per episode; the GRU policy reaches about 11 (deterministic, 60 train steps).
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import MEMORY_EPISODE_STEPS, DistributedMemoryTask, MemoryTask, distributed_memory_config, memory_config

from ksim.task.rl import RLTask

pytestmark = pytest.mark.slow
LEARNED = 0.7 * MEMORY_EPISODE_STEPS  # 8.4 of 12
MEMORYLESS_BOUND = 0.45 * MEMORY_EPISODE_STEPS  # 5.4 of 12: above what any memoryless policy can expect


def final_return(task: RLTask) -> float:
    """The mean return of the episodes of the last of config.num_steps train steps (stochastic policy)."""
    state = task.init_train_state()
    for _ in range(task.config.num_steps):
        state, metrics = task.train_step(state)
    metrics = task.fetch_replicated(jax.device_get(metrics)) if isinstance(task, DistributedMemoryTask) else metrics
    return float(metrics["episode_return_sum"] / metrics["episodes_finished"])


def test_recurrent_policy_learns_and_mode_eval_runs_it(tmp_path: Path) -> None:
    MemoryTask(memory_config(recurrent_size=16, run_dir=str(tmp_path))).run()
    ckpt = str(tmp_path / "checkpoints" / "ckpt_latest.bin")
    returns = MemoryTask(memory_config(recurrent_size=16, mode="eval", load_from_ckpt_path=ckpt)).run()
    assert returns.shape == (64,)
    assert np.mean(returns) > LEARNED


def test_recurrent_policy_learns_on_two_devices() -> None:
    task = DistributedMemoryTask(distributed_memory_config(recurrent_size=16, num_devices=2))
    assert final_return(task) > LEARNED


def test_memoryless_policy_does_not_learn_it() -> None:
    assert final_return(MemoryTask(memory_config())) < MEMORYLESS_BOUND
