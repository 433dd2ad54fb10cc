"""What a user sees in the terminal: no warp-import lines without physics_impl=warp, unnamed objects named."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import mujoco
import pytest

from ksim.engine import ModelLayout
from ksim.inspect import layout_lines

UNNAMED_FREE_JOINT = """
<mujoco>
  <worldbody>
    <body pos="0 0 1"><freejoint/><geom type="sphere" size="0.1"/>
      <body pos="0 0 0.2"><joint type="hinge"/><geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.02"/></body>
    </body>
  </worldbody>
</mujoco>"""


@pytest.mark.skipif(importlib.util.find_spec("warp") is not None, reason="warp-lang is installed: MJX imports it")
def test_importing_ksim_prints_nothing_about_warp() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import ksim.engine"], capture_output=True, text=True, check=True, timeout=120
    )
    assert "warp" not in result.stdout + result.stderr


def test_inspector_names_unnamed_joints_by_kind_and_index() -> None:
    mj_model = mujoco.MjModel.from_xml_string(UNNAMED_FREE_JOINT)
    lines = layout_lines(mj_model, ModelLayout.create(mj_model))
    assert "(root joints: free joint #0)" in lines[0]
    assert lines[2].split()[:3] == ["hinge", "joint", "#1"]
