"""Log lines: metrics of every step since the last line are aggregated, episodes averaged per episode."""

import math

import numpy as np

from ksim.reporting import format_duration, format_line
from ksim.task.rl import RLTask


def step_metrics(finished: float, return_sum: float, loss: float) -> dict[str, np.ndarray]:
    return {
        "episodes_finished": np.float32(finished),
        "episode_return_sum": np.float32(return_sum),
        "episode_length_sum": np.float32(10 * finished),
        "terminations": np.float32(finished),
        "policy_loss": np.float32(loss),
    }


def test_window_of_steps_is_aggregated() -> None:
    scalars = RLTask.scalars([step_metrics(2, 10.0, 1.0), step_metrics(0, 0.0, 3.0), step_metrics(3, 35.0, 2.0)])
    assert scalars["episodes_finished"] == 5 and scalars["terminations"] == 5
    assert scalars["episode_return"] == 9.0  # (10 + 35) / 5 episodes, not a mean of per-step means
    assert scalars["episode_length"] == 10.0
    assert scalars["policy_loss"] == 2.0


def test_no_finished_episode_is_nan_not_zero() -> None:
    scalars = RLTask.scalars([step_metrics(0, 0.0, 1.0)])
    assert math.isnan(scalars["episode_return"]) and math.isnan(scalars["episode_length"])


def test_log_line_has_progress_and_throughput() -> None:
    line = format_line(10, 40, 4096, {"env_steps_per_s": 51234.5, "episode_return": 123.456, "num_devices": 2.0}, 75)
    assert line.startswith("step 10/40 (25%, eta 1m15s) | env_steps 4096 | env_steps_per_s 5.123e+04")
    assert "num_devices 2 " in line + " " and "episode_return 123.5" in line
    assert format_duration(3725) == "1h02m" and format_duration(float("nan")) == "?"
