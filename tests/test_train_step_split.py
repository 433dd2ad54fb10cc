"""benchmarks/train_step_split.py: a train step's time split into physics, rollout and update, variants side by side."""

import dataclasses
import sys
import types
from typing import Any

import jax.numpy as jnp
import pytest

from benchmarks.train_step_split import Timings, main, prepare, split, table


@dataclasses.dataclass(frozen=True)
class _Config:
    num_envs: int = 4
    rollout_length_frames: int = 5
    num_devices: int = 0
    dt: float = 0.005


class _Clock:
    seconds = 0.0


class _Task:
    """Just what the benchmark calls: a train step whose physics calls take 0.25 of a second of the clock."""

    built: list["_Task"] = []

    def __init__(self, config: _Config) -> None:
        self.config, self.engine, self.steps = config, types.SimpleNamespace(host_clock=_Clock()), 0
        self.programs = {"rollout": lambda shared, env: jnp.zeros(())}
        _Task.built.append(self)

    def init_train_state(self) -> Any:
        return types.SimpleNamespace(shared=None, env=None)

    def train_step(self, state: Any) -> tuple[Any, Any]:
        self.steps += 1
        self.engine.host_clock.seconds += 0.25
        return state, jnp.zeros(())


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> str:
    module = types.ModuleType("fake_split_module")
    module.FakeTask = _Task  # type: ignore[attr-defined]
    module.DEFAULT_CONFIG = _Config()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_split_module", module)
    _Task.built.clear()
    return "fake_split_module:FakeTask"


def test_the_split_takes_medians_and_the_ratio_is_to_the_first_variant() -> None:
    slow = Timings(env_steps=3072, train=[0.40, 0.39, 0.38], rollout=[0.36, 0.35, 0.34], physics=[0.33, 0.32, 0.31])
    fast = Timings(env_steps=3072, train=[0.20, 0.19, 0.21], rollout=[0.16, 0.15, 0.17])
    rows = [split(slow), split(fast)]
    assert rows[0].train_s == 0.39 and rows[0].physics_s == 0.32 and rows[0].update_s == pytest.approx(0.04)
    assert rows[1].env_steps_per_s == pytest.approx(3072 / 0.20) and rows[1].physics_s is None
    lines = table(["slow", "fast"], rows).splitlines()
    assert lines[2] == "| slow | 0.390 | 7,877 | 1.00x | 0.350 | 0.320 | 0.040 |"
    assert lines[3] == "| fast | 0.200 | 15,360 | 1.95x | 0.160 | - | 0.040 |"


def test_a_variant_is_built_on_one_device_with_its_settings(fake_module: str) -> None:
    task, _, timings = prepare(f"{fake_module} dt=0.01")
    assert task.config == _Config(dt=0.01, num_devices=1) and task.steps == 1  # the compiling train step
    assert timings.env_steps == 20 and timings.train == []
    with pytest.raises(ValueError, match="unknown setting 'substeps'"):
        prepare(f"{fake_module} substeps=3")


def test_the_variants_alternate_and_each_gets_a_row(
    fake_module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["train_step_split", fake_module, f"{fake_module} dt=0.01", "--repeats", "3"])
    main()
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| {fake_module}", f"| {fake_module} dt=0.01"]
    assert all(row.split(" | ")[5] == "0.250" for row in rows)  # the physics clock's share of each train step
    assert [task.steps for task in _Task.built] == [4, 4]


def test_a_bad_variant_or_repeat_count_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["no_module_colon"], ["examples.kbot:KBotTask", "--repeats", "0"]):
        monkeypatch.setattr(sys, "argv", ["train_step_split", *argv])
        with pytest.raises(SystemExit) as exit_info:
            main()
        assert exit_info.value.code == 2
