"""What a user sees in the terminal: no warp-import lines without physics_impl=warp, no XLA error lines when
programs come from the compilation cache, unnamed objects named."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

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


# A process as a launched run starts (ksim before jax), with a program from a persistent cache in argv[1];
# prints how many programs came from the cache.
CACHED_PROGRAM = """
import sys
import ksim  # noqa: F401
import jax
import jax.numpy as jnp
from jax import monitoring

hits = []
monitoring.register_event_listener(lambda name, **_: hits.append(name) if name.endswith("/cache_hits") else None)
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
x = jnp.linspace(-1.0, 1.0, 4096).reshape(64, 64)
jax.jit(lambda x: jnp.tanh(x @ x.T + jnp.sin(x)).sum())(x).block_until_ready()
print(len(hits))
"""


def test_programs_from_the_compilation_cache_log_no_errors(tmp_path: Path) -> None:
    """XLA's whole C++ log (TF_CPP_MIN_LOG_LEVEL=0) of a process whose programs come from the cache has no
    error line: AVX-512 builds used to log two per program (ksim.xla_setup.cap_cpu_isa_at_avx2)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "XLA_FLAGS": ""}  # XLA_FLAGS as ksim's import sets them
    runs = [
        subprocess.run(
            [sys.executable, "-c", CACHED_PROGRAM, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=180,
            env=env,
        )
        for _ in range(2)
    ]
    assert [int(run.stdout.split()[-1]) > 0 for run in runs] == [False, True]  # the second run loads from the cache
    errors = [line for line in runs[1].stderr.splitlines() if re.match(r"[EF]\d{4} ", line)]
    assert errors == []


def test_inspector_names_unnamed_joints_by_kind_and_index() -> None:
    mj_model = mujoco.MjModel.from_xml_string(UNNAMED_FREE_JOINT)
    lines = layout_lines(mj_model, ModelLayout.create(mj_model))
    assert "(root joints: free joint #0)" in lines[0]
    assert lines[2].split()[:3] == ["hinge", "joint", "#1"]
