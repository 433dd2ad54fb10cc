"""The Gymnasium suite's bookkeeping: where it evaluates and how it judges a run's last evaluations."""

import numpy as np
import pytest

from benchmarks.gymnasium_suite import (
    RunResult,
    eval_points,
    main,
    setting_overrides,
    stability,
    stability_cell,
    summary_table,
    task_settings,
    update_line,
)
from examples.gymnasium import TASKS, TUNED_5M
from ksim.config import ConfigError
from ksim.task.evaluation import EvalResult


def evaluation(returns: list[float], falls: int) -> EvalResult:
    fell = np.arange(len(returns)) < falls
    empty = np.zeros(len(returns))
    return EvalResult(np.asarray(returns), empty + 1000, empty, fell, None, np.zeros((0, 1)))


def run_with(means: list[float], falls: list[int]) -> RunResult:
    pairs = enumerate(zip(means, falls, strict=True))
    evaluations = {(i + 1) * 1000: evaluation([mean - 10, mean + 10], fall) for i, (mean, fall) in pairs}
    return RunResult("Walker2d-v5", 0, evaluations, 1.0)


def test_eval_points_join_the_listed_counts_and_the_period_capped_at_the_budget() -> None:
    assert eval_points(1000, [300, 5000], 0) == [300, 1000]
    assert eval_points(1000, [300], 250) == [250, 300, 500, 750, 1000]


def test_stability_reads_only_the_last_five_evaluations() -> None:
    run = run_with([100, 4000, 3600, 4000, 3800, 3400], [2, 0, 1, 0, 0, 0])
    last = stability(run.evaluations)
    assert last is not None
    assert (last.lowest, last.highest) == (3400, 4000)
    assert last.spread == pytest.approx(0.15)  # the first evaluation's 100 and its falls are not among them
    assert last.worst_fall_rate == 0.5
    assert stability(run_with([1, 2, 3, 4], [0, 0, 0, 0]).evaluations) is None


def test_the_summary_reports_the_worst_seed() -> None:
    steady, swinging = run_with([1000] * 5, [0] * 5), run_with([1000, 500, 1000, 1000, 1000], [0, 2, 0, 0, 0])
    assert stability_cell([steady]) == "0% / 0.00"
    assert stability_cell([steady, swinging]) == "50% / 1.00"
    assert stability_cell([steady, run_with([1000], [0])]) == "-"
    row = summary_table([steady, swinging], [5000], episodes=2).splitlines()[-1]
    assert "| 50% / 1.00 |" in row


def test_set_overrides_are_typed_and_unknown_or_mistyped_settings_are_refused() -> None:
    assert setting_overrides(["entropy_coef=0.01", "num_envs=64"]) == {"entropy_coef": 0.01, "num_envs": 64}
    with pytest.raises(ConfigError, match="unknown setting 'entropy'"):
        setting_overrides(["entropy=0.01"])
    with pytest.raises(ConfigError, match="entropy_coef=abc is not valid"):
        setting_overrides(["entropy_coef=abc"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "0"], "--seeds=0 must be >= 1 and --first-seed=0 >= 0"),
        (["--first-seed", "-1"], "--seeds=3 must be >= 1 and --first-seed=-1 >= 0"),
        (["--set", "entropy=0.01"], "--set: unknown setting 'entropy'"),
    ],
)
def test_bad_arguments_are_refused_in_one_line_before_anything_runs(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["gymnasium_suite", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_update_lines_put_each_evaluation_beside_the_updates_before_it() -> None:
    run = run_with([1000, 2000], [0, 3])
    run.updates = {1000: {"entropy": 2.5, "approx_kl": 0.0123}, 2000: {"entropy": -1.0, "approx_kl": 0.05}}
    assert [update_line(run, steps) for steps in (1000, 2000)] == [
        "  1,000 env steps: return 1000.0 (0/2 fell) | entropy 2.5 approx_kl 0.0123",
        "  2,000 env steps: return 2000.0 (2/2 fell) | entropy -1 approx_kl 0.05",
    ]
    run.latest = {2000: evaluation([500.0, 700.0], 1)}
    assert update_line(run, 2000) == (
        "  2,000 env steps: return 2000.0 (2/2 fell) | latest parameters: return 600.0 (1/2 fell)"
        " | entropy -1 approx_kl 0.05"
    )


def test_tuned_settings_cover_every_task_are_valid_and_yield_to_set() -> None:
    assert set(TUNED_5M) == set(TASKS)
    for task_id, settings in TUNED_5M.items():
        pairs = [f"{key}={value}" for key, value in settings.items()]
        assert setting_overrides(pairs) == settings, task_id
    assert task_settings("Walker2d-v5", False, {"gamma": 0.99}) == {"gamma": 0.99}
    tuned = task_settings("Walker2d-v5", True, {"gamma": 0.99})
    assert tuned == {**TUNED_5M["Walker2d-v5"], "gamma": 0.99}


def test_a_run_keeping_an_average_also_evaluates_its_latest_parameters_as_a_run_without_it() -> None:
    from benchmarks.gymnasium_suite import train_and_evaluate

    settings = {"num_envs": 8, "batch_size": 4, "rollout_length_frames": 16, "eval_episodes": 4, "num_passes": 2}
    plain, _, _ = train_and_evaluate(TASKS["Hopper-v5"], 0, 256, [256], **settings)
    averaged, _, _ = train_and_evaluate(TASKS["Hopper-v5"], 0, 256, [256], policy_average_decay=0.5, **settings)
    assert plain.latest == {} and set(averaged.latest) == set(averaged.evaluations) == set(plain.evaluations)
    steps = max(plain.evaluations)
    np.testing.assert_array_equal(averaged.latest[steps].returns, plain.evaluations[steps].returns)
    assert not np.array_equal(averaged.evaluations[steps].returns, plain.evaluations[steps].returns)
