"""Log lines: metrics of every step since the last line are aggregated, episodes averaged per episode."""

import json
import math
from pathlib import Path

import imageio.v2 as imageio
import numpy as np

from ksim.plot import learning_curve_figure, series
from ksim.plot import main as plot_main
from ksim.reporting import clip_success_rates, format_duration, format_line, window_scalars


def step_metrics(finished: float, return_sum: float, loss: float) -> dict[str, np.ndarray]:
    return {
        "episodes_finished": np.float32(finished),
        "episode_return_sum": np.float32(return_sum),
        "episode_length_sum": np.float32(10 * finished),
        "terminations": np.float32(finished),
        "policy_loss": np.float32(loss),
    }


def test_window_of_steps_is_aggregated() -> None:
    scalars = window_scalars([step_metrics(2, 10.0, 1.0), step_metrics(0, 0.0, 3.0), step_metrics(3, 35.0, 2.0)])
    assert scalars["episodes_finished"] == 5 and scalars["terminations"] == 5
    assert scalars["episode_return"] == 9.0  # (10 + 35) / 5 episodes, not a mean of per-step means
    assert scalars["episode_length"] == 10.0
    assert scalars["policy_loss"] == 2.0


def test_no_finished_episode_is_nan_not_zero() -> None:
    scalars = window_scalars([step_metrics(0, 0.0, 1.0)])
    assert math.isnan(scalars["episode_return"]) and math.isnan(scalars["episode_length"])


def test_log_line_has_progress_and_throughput() -> None:
    scalars = {"env_steps_per_s": 51234.5, "episode_return": 123.456, "episodes_finished": 7.0, "num_devices": 2.0}
    line = format_line(10, 40, 4096, scalars, 75)
    assert line.startswith("step 10/40 (25%, eta 1m15s) | env_steps 4096 | env_steps_per_s 5.123e+04")
    assert "num_devices 2 " in line + " " and "episode_return 123.5 (7 ended)" in line
    assert format_duration(3725) == "1h02m" and format_duration(float("nan")) == "?"


def test_learning_curve_picture_from_logged_scalars(tmp_path: Path) -> None:
    rows = [
        {"step": i, "env_steps": 1000 * i, "episode_return": 10.0 * i, "episode_length": 5.0 * i} for i in range(1, 6)
    ]
    rows.append({"step": 5, "env_steps": 5000, "eval/return": 60.0, "eval/length": 30.0})
    (tmp_path / "scalars.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert plot_main([str(tmp_path)]) == 0
    picture = imageio.imread(tmp_path / "learning_curve.png")
    assert picture.shape[0] > 200 and picture.shape[1] > 500 and np.asarray(picture).std() > 0
    assert series(rows, "eval/return") == ([5000], [60.0])


def test_a_run_with_a_command_plots_its_tracking_errors_not_its_world_x_speed() -> None:
    train = [{"step": 1, "env_steps": 1000, "episode_return": 1.0, "episode_length": 5.0}]
    evaluation = {"eval/return": 2.0, "eval/length": 5.0, "eval/base_speed_x": 0.1, "eval/fall_rate": 0.0}
    commanded = {**evaluation, "eval/command_error": 0.2, "eval/yaw_rate_error": 0.3}
    for row, title, labels in (
        (evaluation, "Evaluation: speed and falls", ["base speed x (m/s)"]),
        (commanded, "Evaluation: tracking and falls", ["command error (m/s)", "yaw-rate error (rad/s)"]),
    ):
        panel = learning_curve_figure([*train, {"step": 1, "env_steps": 1000, **row}], "run").axes[2]
        assert panel.get_title() == title
        assert [line.get_label() for line in panel.get_lines()] == labels


def test_a_motion_tracking_run_plots_its_success_rate_and_body_errors_in_cm() -> None:
    train = {"step": 1, "env_steps": 1000, "episode_return": 1.0, "episode_length": 5.0}
    evaluation = {"eval/return": 2.0, "eval/length": 5.0, "eval/base_speed_x": 0.1, "eval/fall_rate": 0.25}
    motion = {**evaluation, "eval/success_rate": 0.75, "eval/body_error_anchor": 0.04, "eval/body_error_world": 0.09}
    figure = learning_curve_figure([train, {"step": 1, "env_steps": 1000, **motion}], "run")
    panel = figure.axes[2]
    assert panel.get_title() == "Evaluation: tracking and success"
    errors = {line.get_label(): list(line.get_ydata()) for line in panel.get_lines()}
    assert errors == {"body error, anchor frame (cm)": [4.0], "body error, world (cm)": [9.0]}
    (success,) = next(axis for axis in figure.axes if axis.get_ylabel() == "success rate").get_lines()
    assert list(success.get_ydata()) == [0.75]


def test_a_run_over_several_clips_plots_each_clips_success_rate() -> None:
    train = {"step": 1, "env_steps": 1000, "episode_return": 1.0, "episode_length": 5.0}
    evaluation = {"eval/return": 2.0, "eval/length": 5.0, "eval/base_speed_x": 0.1, "eval/success_rate": 0.5}
    clips = {"eval/walk/success_rate": 0.25, "eval/walk/episodes": 4.0, "eval/dance/success_rate": 0.75}
    rows = [train, {"step": 1, "env_steps": 1000, **evaluation, "eval/ended_by/Fall": 0.5, **clips}]
    figure = learning_curve_figure(rows, "run")
    panel = next(axis for axis in figure.axes if axis.get_title() == "Evaluation: success per clip")
    assert {line.get_label(): list(line.get_ydata()) for line in panel.get_lines()} == {"walk": [0.25], "dance": [0.75]}
    one_clip = learning_curve_figure([train, {"step": 1, "env_steps": 1000, **evaluation}], "run")
    assert "Evaluation: success per clip" not in [axis.get_title() for axis in one_clip.axes]


def test_clip_success_rates_are_read_from_the_per_clip_keys_only() -> None:
    scalars = {"eval/success_rate": 0.5, "eval/walk/success_rate": 0.25, "eval/walk/episodes": 4.0}
    scalars |= {"eval/ended_by/Fall": 0.5, "eval/dance/success_rate": 0.75, "train/dance/success_rate": 0.1}
    assert clip_success_rates(scalars) == {"walk": 0.25, "dance": 0.75}


def test_plot_of_a_folder_that_is_no_run_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert plot_main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'scalars.jsonl'} does not exist: is {tmp_path} a ksim run folder?" in capsys.readouterr().err
