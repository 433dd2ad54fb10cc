"""ksim/tools/tracking_breakdown.py splits a tracking error into transients, a steady bias and oscillation."""

import dataclasses
import sys
import types

import numpy as np
import pytest

from ksim.tools.tracking_breakdown import (
    Trace,
    band_errors,
    breakdown,
    build_task,
    centred_mean,
    main,
    steps_since_change,
)


def test_steps_since_change_restart_at_every_new_command() -> None:
    command = np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]], float)[:, None, :]
    assert steps_since_change(command)[:, 0].tolist() == [0, 1, 0, 1, 2]


def test_a_policy_at_80_percent_with_a_sway_is_split_into_gain_bias_and_oscillation() -> None:
    steps, settle = 200, 20
    commands = np.array([[1.0, 0.0, 0.5], [0.0, -0.5, -1.0]])  # one command per half of the episode
    command = np.repeat(commands, steps // 2, axis=0)[:, None, :]
    sway = np.where(np.arange(steps) % 2 == 0, 0.1, -0.1)  # +-0.1 on every axis, mean zero over each half
    achieved = 0.8 * command + sway[:, None, None]
    achieved[:settle] = 0.0  # a transient: standing still right after the start
    result = breakdown(Trace(achieved, command, np.ones((steps, 1), bool)), settle)
    assert result.stretches == 2
    assert result.gain == pytest.approx((0.8, 0.8, 0.8))
    assert result.bias == pytest.approx(np.mean([0.2, 0.1]))  # |0.2 * command xy| per stretch
    assert result.oscillation == pytest.approx(0.1 * np.sqrt(2))
    assert result.yaw_bias == pytest.approx(np.mean([0.1, 0.2]))
    assert result.yaw_oscillation == pytest.approx(0.1)
    assert result.command_error > result.settled_command_error  # the transient counts only in the first
    error = np.linalg.norm(achieved[:, 0, :2] - command[:, 0, :2], axis=-1)
    first_seconds = np.r_[0:settle, steps // 2 : steps // 2 + settle]
    assert result.transient_part == pytest.approx(error[first_seconds].sum() / steps)
    assert result.start_part == pytest.approx(settle * 1.0 / steps)  # standing still, told 1 m/s forward
    assert np.isnan(result.window_error)  # no window asked for


def test_a_window_of_one_sway_period_leaves_only_the_bias() -> None:
    steps, settle = 200, 20
    command = np.repeat(np.array([[1.0, 0.0, 0.0], [0.0, -0.5, 0.0]]), steps // 2, axis=0)[:, None, :]
    sway = np.where(np.arange(steps) % 2 == 0, 0.1, -0.1)[:, None, None]
    achieved = 0.8 * command + sway
    result = breakdown(Trace(achieved, command, np.ones((steps, 1), bool)), settle, window_steps=2)
    assert result.window_error == pytest.approx(np.mean([0.2, 0.1]))  # equal settled steps on each command
    assert result.settled_command_error > result.window_error


def test_the_error_is_split_by_forward_command_into_parts_that_add_up_to_it() -> None:
    steps, settle = 120, 10
    commands = np.array([[0.0, 0.0, 0.0], [-0.4, 0.0, 0.0], [1.0, 0.2, 0.0]])  # stand, backward, fast
    command = np.repeat(commands, steps // 3, axis=0)[:, None, :]
    achieved = command.copy()
    achieved[:40, 0, 0] = 0.05  # drifts 0.05 m/s when told to stand
    achieved[40:80, 0, 0] = -0.1  # 0.3 m/s short walking backwards
    trace = Trace(achieved, command, np.ones((steps, 1), bool))
    bands = {band.name: band for band in band_errors(trace, settle, [-0.2, 0.4, 0.8])}
    assert list(bands) == ["stand", "forward -inf..-0.2 m/s", "forward -0.2..0.4 m/s", "forward 0.4..0.8 m/s",
                           "forward 0.8..inf m/s"]  # fmt: skip
    assert bands["stand"].share == pytest.approx(1 / 3) and bands["stand"].settled_error == pytest.approx(0.05)
    assert bands["forward -inf..-0.2 m/s"].settled_error == pytest.approx(0.3)
    assert bands["forward 0.8..inf m/s"].part == pytest.approx(0.0)
    assert bands["forward -0.2..0.4 m/s"].share == 0.0 and np.isnan(bands["forward -0.2..0.4 m/s"].settled_error)
    assert sum(band.part for band in bands.values()) == pytest.approx(breakdown(trace, settle).command_error)


def test_the_nominal_task_has_no_randomizations_or_events(monkeypatch: pytest.MonkeyPatch) -> None:
    class RandomizedTask(_Task):
        def get_randomizations(self) -> list[str]:
            return ["friction"]

        def get_events(self) -> list[str]:
            return ["push"]

    module = types.ModuleType("fake_randomized_module")
    module.RandomizedTask = RandomizedTask  # type: ignore[attr-defined]
    module.DEFAULT_CONFIG = _Config()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_randomized_module", module)
    as_trained = build_task("fake_randomized_module:RandomizedTask", "ckpt.bin")
    assert as_trained.get_randomizations() == ["friction"] and as_trained.get_events() == ["push"]
    as_modelled = build_task("fake_randomized_module:RandomizedTask", "ckpt.bin", as_modelled=True)
    assert isinstance(as_modelled, RandomizedTask)
    assert as_modelled.get_randomizations() == [] and as_modelled.get_events() == []


def test_centred_mean_averages_around_each_step_and_leaves_the_ends_empty() -> None:
    means = centred_mean(np.arange(6, dtype=float)[:, None], 3)[:, 0]
    assert np.isnan(means[[0, 5]]).all()
    assert means[1:5].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_steps_after_an_episode_ended_are_left_out() -> None:
    command = np.ones((40, 1, 3))
    achieved = command.copy()
    achieved[30:] = 100.0  # what the env does after it fell does not count
    running = (np.arange(40) < 30)[:, None]
    result = breakdown(Trace(achieved, command, running), settle_steps=5)
    assert result.command_error == pytest.approx(0.0)
    assert result.gain == pytest.approx((1.0, 1.0, 1.0))


def test_a_task_name_that_cannot_be_built_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="must be module:Class"):
        build_task("examples.kbot", "ckpt.bin")
    with pytest.raises(ValueError, match="defines no 'Nope'"):
        build_task("examples.kbot:Nope", "ckpt.bin")


@dataclasses.dataclass
class _Config:
    gait_period_s: float = 0.8
    load_from_ckpt_path: str = ""


class _Task:
    def __init__(self, config: _Config) -> None:
        self.config = config


def test_the_runs_settings_reach_the_task_and_a_bad_one_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("fake_task_module")
    module.FakeTask = _Task  # type: ignore[attr-defined]
    module.DEFAULT_CONFIG = _Config()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_task_module", module)
    task = build_task("fake_task_module:FakeTask", "ckpt.bin", ["gait_period_s=0.6"])
    assert task.config == _Config(gait_period_s=0.6, load_from_ckpt_path="ckpt.bin")
    with pytest.raises(ValueError, match="unknown setting 'gait'"):
        build_task("fake_task_module:FakeTask", "ckpt.bin", ["gait=0.6"])
    with pytest.raises(ValueError, match="gait_period_s=fast is not valid"):
        build_task("fake_task_module:FakeTask", "ckpt.bin", ["gait_period_s=fast"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--episodes=0", "--episodes=0 must be >= 1"),
        ("--settle-s=0", "--settle-s=0 must be > 0"),
        ("--window-s=-0.6", "--window-s=-0.6 must be >= 0"),
        ("--forward-bands=0.4,-0.2", "--forward-bands=0.4,-0.2: give increasing numbers, comma-separated (m/s)"),
        ("--forward-bands=slow", "--forward-bands=slow: give increasing numbers, comma-separated (m/s)"),
    ],
)
def test_a_bad_option_is_refused_in_one_line_before_anything_is_built(
    option: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["tracking_breakdown", "no_such_module:Task", "ckpt.bin", option])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and error_lines[0].endswith(message)
