"""The Brax comparison's bookkeeping for several rounds (the runs themselves need minutes: `make bench-brax`)."""

import sys
from pathlib import Path

import pytest

from benchmarks.vs_brax import turns as turns_module
from benchmarks.vs_brax.__main__ import Worker, median_report, print_rounds, take_turns


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


# The workers' clock counts the log's lines (both workers write them), a tenth of a second each: time passes
# only as work is done, by either worker, whatever the machine's speed.
FAKE_WORKER = """
import json, os, sys
sys.path.insert(0, {folder!r})
from turns import Turns

name, log, turns_to_take = sys.argv[1], sys.argv[2], int(sys.argv[3])
turns = Turns(now=lambda: 0.1 * (len(open(log).read().split()) // 2 if os.path.exists(log) else 0))
turns.wait()
start = turns.clock()
for _ in range(turns_to_take):
    with open(log, "a") as file:
        file.write(name + " start\\n")
    with open(log, "a") as file:
        file.write(name + " end\\n")
    if name == "broken":
        raise ValueError("a worker that fails")
    turns.wait()
print(json.dumps({{"name": name, "own_seconds": turns.clock() - start}}))
"""


def fake_workers(tmp_path: Path, turns: dict[str, int]) -> tuple[dict[str, Worker], Path]:
    script, log = tmp_path / "fake_worker.py", tmp_path / "turns.log"
    script.write_text(FAKE_WORKER.format(folder=str(Path(turns_module.__file__).parent)))
    commands = {name: [sys.executable, str(script), name, str(log), str(count)] for name, count in turns.items()}
    return {name: Worker(name, command, devices=1) for name, command in commands.items()}, log


def test_both_workers_run_at_once_but_take_turns_a_b_b_a(tmp_path: Path) -> None:
    workers, log = fake_workers(tmp_path, {"ksim": 4, "brax": 2})
    reports = take_turns(workers, first="ksim")
    lines = log.read_text().split()
    names, events = lines[0::2], lines[1::2]
    assert events == ["start", "end"] * 6  # never both at work
    assert names[0::2] == names[1::2] == ["ksim", "brax", "brax", "ksim", "ksim", "ksim"]  # then ksim alone
    # Each worker's clock stops while it waits: its own turns' lines only (8 and 4), not the other's.
    assert reports["ksim"]["own_seconds"] == pytest.approx(0.8) and reports["brax"]["own_seconds"] == pytest.approx(0.4)


def test_a_worker_that_fails_stops_both_with_its_error(tmp_path: Path) -> None:
    workers, _ = fake_workers(tmp_path, {"ksim": 3, "broken": 3})
    with pytest.raises(RuntimeError, match=r"broken failed:(.|\n)*a worker that fails"):
        take_turns(workers, first="ksim")
    assert all(worker.process.poll() is not None for worker in workers.values())


def test_the_hopper_still_matches_what_the_brax_env_mirrors() -> None:
    """Compared as values: a component field added with a default that keeps the MDP is not a change."""
    from types import SimpleNamespace

    from benchmarks.vs_brax.ksim_worker import component_changes
    from examples.hopper import HopperTask
    from ksim import rewards as rew

    hooks = ("get_observations", "get_rewards", "get_terminations", "get_resets")
    hopper = SimpleNamespace()  # the hooks read nothing of the task: no model to build
    for hook in hooks:
        setattr(hopper, hook, getattr(HopperTask, hook).__get__(hopper))
    assert component_changes(hopper) == []
    hopper.get_rewards = lambda: [rew.StayAlive(scale=2.0)]
    (change,) = component_changes(hopper)
    assert change.startswith("[StayAlive(scale=2.0)] != [StayAlive(scale=1.0), ForwardProgress(")
