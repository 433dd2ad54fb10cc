"""The Brax comparison's bookkeeping for several rounds (the runs themselves need minutes: `make bench-brax`)."""

import pytest

from benchmarks.vs_brax.__main__ import median_report, print_rounds


def report(steady: float, compile_s: float) -> dict[str, float | str]:
    return {"steady_sps": steady, "compile_s": compile_s, "steps_per_cpu_s": steady / 2, "return": 5.0, "jax": "x"}


def test_rounds_are_summarised_by_the_median_of_each_timing() -> None:
    merged = median_report([report(100.0, 30.0), report(300.0, 10.0), report(200.0, 50.0)])
    assert merged["steady_sps"] == 200.0 and merged["compile_s"] == 30.0 and merged["steps_per_cpu_s"] == 100.0
    assert merged["return"] == 5.0 and merged["jax"] == "x"  # not timings: the first round's


def test_each_rounds_ratios_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    runs = {
        ("ksim", 1): [report(110.0, 30.0), report(120.0, 40.0)],
        ("brax", 1): [report(100.0, 60.0), report(100.0, 80.0)],
    }
    print_rounds(runs, [1])  # type: ignore[arg-type]
    assert capsys.readouterr().out.strip() == "1 device(s), ksim/brax per round: steady 1.10, 1.20; compile 0.50, 0.50"
