"""`python -m ksim.inspect` on the bundled models, its timing, and its refusals of bad input."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ksim import inspect as ksim_inspect
from ksim.engine import ASSETS_DIR

BUNDLED = sorted(path.name for path in ASSETS_DIR.glob("*.xml"))


@pytest.mark.parametrize("name", BUNDLED)
def test_inspect_runs_on_every_bundled_model(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert ksim_inspect.main([name, "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^base body: '\w+', root: (free|articulated|fixed)", out, re.MULTILINE)
    assert "MJX: runs this model" in out


def test_inspect_times_a_control_step_and_finds_the_cart_poles_joints(capsys: pytest.CaptureFixture[str]) -> None:
    assert ksim_inspect.main(["cartpole.xml", "--envs", "8"]) == 0
    out = capsys.readouterr().out
    assert "base body: 'cart', root: articulated (root joints: none)" in out  # the rail's slider is actuated
    assert re.search(r"\n  slider +slide +unlimited\n  hinge +hinge +unlimited\n", out)
    assert re.search(r"\n  slide +motor +joint slider, gear 10, ctrl \[-1, 1\]\n", out)
    cost = re.search(
        r"cost: one control step of 8 envs \(2 physics steps each\) takes [\d.]+ ms: ([\d,]+) env-steps/s", out
    )
    assert cost is not None and int(cost.group(1).replace(",", "")) > 0
    native = re.search(r"cost with physics_impl='mujoco': [\d.]+ ms: ([\d,]+) env-steps/s, [\d.]+x MJX's", out)
    assert native is not None and int(native.group(1).replace(",", "")) > 0
    assert "advice: none, the model is cheap for MJX" in out


def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody><body><geom type='nonsense'/></body></worldbody></mujoco>")
    for args, message in (
        ([str(tmp_path / "missing.xml")], "error: MJCF model"),
        ([str(broken)], "error: XML Error"),
        (["cartpole.xml", "--base-body", "pole_tip", "--no-timing"], "error: base_body: no body named 'pole_tip'"),
        (["cartpole.xml", "--envs", "0"], "error: --envs=0 must be positive"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "ksim.inspect", *args], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, (args, result.stderr)
        errors = [line for line in result.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
