"""The hopper learns at a reduced budget: the README example, seeded, on one device for 200 of its 500 steps.

It learns with the default physics (C MuJoCo on CPU devices) only: MJX's control step is tested equal to it
(tests/test_native_physics.py) and the learner is the same code, so an MJX run here would prove nothing more.

The untrained (deterministic) policy stands until it topples and returns about 92; the first thing PPO finds
is a lunge forward worth about 130-140 (train steps 25-100). The threshold asks for more than both: hops that
keep the torso in the healthy range for longer. With native physics the run evaluates at 331 after 200 steps.
"""

import dataclasses

import jax
import numpy as np
import pytest

from examples.hopper import DEFAULT_CONFIG, HopperTask

NUM_STEPS = 200
THRESHOLD = 200.0
UNTRAINED_BELOW = 120.0  # measured 92; a margin for other CPUs' rounding


def hopper_task(tmp_path, **overrides) -> HopperTask:
    settings = {"num_devices": 1, "num_steps": NUM_STEPS, "eval_every_n_steps": 0, "save_every_n_steps": 0}
    return HopperTask(dataclasses.replace(DEFAULT_CONFIG, run_dir=str(tmp_path), **settings | overrides))


def mean_eval_return(task: HopperTask, shared) -> float:
    returns = task.evaluate(shared).returns
    return float(np.mean(returns))


def test_untrained_hopper_stays_below_the_threshold(tmp_path) -> None:
    task = hopper_task(tmp_path)
    untrained = mean_eval_return(task, task.init_shared(jax.random.PRNGKey(DEFAULT_CONFIG.seed)))
    print(f"untrained hopper: eval return {untrained:.1f}")
    assert untrained < UNTRAINED_BELOW


@pytest.mark.slow
def test_hopper_learns_on_one_device(tmp_path) -> None:
    task = hopper_task(tmp_path)
    state = task.run()
    trained = mean_eval_return(task, task.fetch_replicated(state.shared))
    print(f"hopper after {NUM_STEPS} train steps: eval return {trained:.1f}")
    assert trained > THRESHOLD
