"""ksim/tools/gait_stats.py says whether a walking policy's feet lift, take turns and stay down when told to stand."""

import sys

import numpy as np
import pytest

from ksim.tools.gait_stats import FeetTrace, gait_stats, main, walking_windows

WINDOW, SETTLE, GROUND = 10, 5, 0.3  # GROUND: the foot frame's height while the foot touches


def swing(steps: int, offset: int, height: float) -> np.ndarray:
    """A foot's lift: `height` for the first half of every WINDOW steps, shifted by `offset` steps, else 0."""
    return np.where((np.arange(steps) + offset) % WINDOW < WINDOW // 2, height, 0.0)


def trace_of(left: np.ndarray, right: np.ndarray, command: np.ndarray) -> FeetTrace:
    """A foot touches while its lift is 0; its frame is GROUND higher than its lift."""
    lift = np.stack([left, right], -1)[:, None, :]
    steps = len(left)
    return FeetTrace(
        lift == 0, lift + GROUND, np.broadcast_to(command, (steps, 3))[:, None, :], np.ones((steps, 1), bool)
    )


def test_feet_that_take_turns_lift_in_every_window_and_are_never_up_together() -> None:
    steps = 5 + 4 * WINDOW  # settled from step 5: four whole windows of walking
    stats = gait_stats(
        trace_of(swing(steps, 0, 0.05), swing(steps, WINDOW // 2, 0.05), np.array([0.5, 0.0, 0.0])),
        0.3,
        SETTLE,
        WINDOW,
    )
    assert stats.walking_windows == 4
    assert stats.up_in_windows == (1.0, 1.0) and stats.up == pytest.approx((0.5, 0.5))
    assert stats.lift_p95 == pytest.approx((0.05, 0.05))
    assert stats.all_up == 0.0 and stats.flight_windows == 0.0 and stats.turns == 1.0
    assert np.isnan(stats.stand_up)  # never told to stand


def test_a_shuffling_foot_never_lifts_and_a_hop_lifts_both_at_once() -> None:
    steps = 5 + 4 * WINDOW
    command = np.array([0.5, 0.0, 0.0])
    shuffle = gait_stats(trace_of(swing(steps, 0, 0.05), np.zeros(steps), command), 0.3, SETTLE, WINDOW)
    assert shuffle.up_in_windows == (1.0, 0.0) and shuffle.turns == 0.0 and shuffle.lift_p95[1] == 0.0
    hop = gait_stats(trace_of(swing(steps, 0, 0.05), swing(steps, 0, 0.05), command), 0.3, SETTLE, WINDOW)
    assert hop.all_up == pytest.approx(0.5) and hop.flight_windows == 1.0 and hop.up_in_windows == (1.0, 1.0)


def test_stepping_in_place_when_told_to_stand_is_counted_after_the_command_settles() -> None:
    steps = 40
    left = swing(steps, 0, 0.05)
    left[:SETTLE] = 0.1  # the step right after the stop does not count
    stats = gait_stats(trace_of(left, np.zeros(steps), np.zeros(3)), 0.3, SETTLE, WINDOW)
    assert stats.stand_up == pytest.approx(np.mean(left[SETTLE:] > 0))
    assert stats.walking_windows == 0 and np.isnan(stats.turns) and np.isnan(stats.all_up)


def test_walking_windows_are_back_to_back_and_skip_steps_that_are_not_walking() -> None:
    walking = np.ones((30, 1), bool)
    walking[12] = False
    assert walking_windows(walking, 10) == [(0, 0), (13, 0)]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--settle-s=0", "--settle-s=0 must be > 0"),
        ("--window-s=-1", "--window-s=-1 must be > 0"),
        ("--walking-speed=-0.3", "--walking-speed=-0.3 must be >= 0"),
        ("--episodes=0", "--episodes=0 must be >= 1"),
    ],
)
def test_a_bad_option_is_refused_in_one_line_before_anything_is_built(
    option: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["gait_stats", "no_such_module:Task", "ckpt.bin", "--feet=left_foot", option])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and error_lines[0].endswith(message)
