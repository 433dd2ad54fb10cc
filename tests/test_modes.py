"""Modes take a built task: a new one is a module (here, a namespace) and a line in MODES, nothing in the task."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim import modes
from ksim.config import ConfigError


@dataclasses.dataclass
class LayoutSettings:
    largest_first: bool = False


def test_a_new_mode_runs_from_launch_without_touching_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []

    def run(task: Any, settings: LayoutSettings) -> list[tuple[str, int]]:
        layout = task.environment.observation_layout()
        return sorted(layout, key=lambda item: -item[1]) if settings.largest_first else layout

    def check(config: Any, settings: LayoutSettings) -> None:
        seen.append((config.mode, settings.largest_first))

    layout_mode = types.SimpleNamespace(Settings=LayoutSettings, check=check, run=run)
    monkeypatch.setitem(modes.MODES, "layout", layout_mode)
    result = CartpoleTask.launch(cartpole_config(), ["mode=layout", "largest_first=false"])
    assert seen == [("layout", False)]  # checked, with its own setting, before the task was built
    assert [name for name, _ in result] == [
        name for name, _ in CartpoleTask(cartpole_config()).environment.observation_layout()
    ]
    assert sum(size for _, size in result) == 3


def test_a_mode_refuses_its_settings_before_the_task_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    built: list[object] = []

    class Counting(CartpoleTask):
        def __init__(self, config: Any) -> None:
            built.append(config)
            super().__init__(config)

    with pytest.raises(SystemExit) as stop:
        Counting.launch(cartpole_config(), ["mode=eval"])
    assert stop.value.code == 2 and not built
    assert capsys.readouterr().err.strip() == "error: mode='eval' needs load_from_ckpt_path=<checkpoint file>"
    with pytest.raises(ConfigError, match="mode='fly' must be one of 'train', 'eval', 'export', 'view'"):
        Counting(cartpole_config(mode="fly")).run()


def test_training_needs_no_viewer_extra_and_view_says_what_is_missing(tmp_path: Path) -> None:
    # viser comes with ksim[viewer]; a plain install (a GPU box, CI images) must still train, eval and export.
    code = (
        "import importlib.machinery as machinery, sys, dataclasses\n"
        "class WithoutViser(machinery.PathFinder):\n"  # finds what the path holds, except viser
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        return None if name.split('.')[0] == 'viser' else super().find_spec(name, path, target)\n"
        "sys.meta_path = [WithoutViser if f is machinery.PathFinder else f for f in sys.meta_path]\n"
        "from examples.cartpole import CartpoleTask, DEFAULT_CONFIG\n"
        "config = dataclasses.replace(DEFAULT_CONFIG, num_envs=8, batch_size=4, num_steps=1, run_dir=sys.argv[1])\n"
        "CartpoleTask.launch(config, [])\n"
        "CartpoleTask.launch(config, ['mode=view'])\n"
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "XLA_FLAGS": "", "PJRT_NPROC": ""}
    result = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert (run_dir / "scalars.jsonl").exists()  # the training ran to its end
    assert result.stderr.strip().splitlines()[-1] == (
        "error: mode='view' needs the viser package: pip install 'ksim[viewer]'"
    )
