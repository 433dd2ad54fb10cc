"""benchmarks/batch_scaling.py reads a run's lines into train steps, env steps and seconds to the target."""

from pathlib import Path

import pytest

from benchmarks.batch_scaling import Run, parse_target, table

STEP = "step {step}/800 (1%, eta 1h) | env_steps {env_steps} | env_steps_per_s 2000 | num_devices 1 | entropy 18"
EVAL = "eval step {step} | eval/return 300 | eval/fall_rate {falls} | eval/command_error {error}"


def fed(num_envs: int, evaluations: list[tuple[int, float, float]]) -> Run:
    run = Run(num_envs, Path("unused"), parse_target("command_error<=0.25,fall_rate<=0.05"))
    run.read(1.0, "startup and compilation: 30.5 s")
    for step, falls, error in evaluations:
        run.read(10.0 * step, STEP.format(step=step, env_steps=step * num_envs * 24))
        run.read(10.0 * step + 1, EVAL.format(step=step, falls=falls, error=error))
    return run


def test_the_first_evaluation_meeting_every_clause_is_the_target() -> None:
    run = fed(256, [(50, 1.0, 0.5), (100, 0.0, 0.3), (150, 0.1, 0.2), (200, 0.02, 0.24)])
    assert run.reached == (200, 2001.0)
    assert run.compile_s == 30.5 and run.env_steps_per_step == 256 * 24
    assert run.step_s == [256 * 24 / 2000] * 4


def test_the_table_gives_each_count_as_a_ratio_to_the_first() -> None:
    small = fed(256, [(100, 0.5, 0.5), (200, 0.0, 0.2)])
    large = fed(1024, [(50, 0.0, 0.2)])
    unreached = fed(2048, [(50, 1.0, 0.5)])
    rows = table([small, large, unreached], devices=None, shared=True)
    assert rows[0].startswith("| envs | train steps to target | env steps | wall time to target (shared) |")
    assert rows[2] == "| 256 | 200 (1.00x) | 1.23M (1.00x) | 33.4 min (1.00x) | 30 s | 3.07 s (1.00x) |"
    assert rows[3] == "| 1024 | 50 (0.25x) | 1.23M (1.00x) | 8.3 min (0.25x) | 30 s | 12.29 s (4.00x) |"
    assert rows[4].startswith("| 2048 | not by step 50 | - | - |")


@pytest.mark.parametrize("text", ["command_error<0.25", "fall_rate", "x<=y"])
def test_a_target_clause_that_is_not_a_bound_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="must be name<=value or name>=value"):
        parse_target(text)
