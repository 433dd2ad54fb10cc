"""ksim's package and its JAX-free modules import on a machine without JAX (a robot's computer: numpy, mujoco,
onnxruntime), which a subprocess mimics by refusing every import of JAX, jaxlib, Flax and Optax."""

from __future__ import annotations

import subprocess
import sys

# ksim modules that must import without JAX (the package itself first).
JAX_FREE_MODULES = ("ksim", "ksim.xla_setup", "ksim.errors", "ksim.policy_spec", "ksim.runtime", "ksim.motion")

# Makes JAX, jaxlib, Flax and Optax absent: their imports fail, and their distributions have no metadata.
WITHOUT_JAX = """
import importlib.abc
import importlib.metadata
import sys

ABSENT = ("jax", "jaxlib", "flax", "optax")


class NoJax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoJax())
installed_version = importlib.metadata.version


def version(distribution):
    if distribution.lower() in ABSENT:
        raise importlib.metadata.PackageNotFoundError(distribution)
    return installed_version(distribution)


importlib.metadata.version = version

try:
    import jax  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the finder let jax import")

for module in sys.argv[1:]:
    importlib.import_module(module)

loaded = sorted(name for name in sys.modules if name.split(".")[0] in ABSENT)
print("loaded:", loaded)
"""


def test_ksim_and_its_jax_free_modules_import_without_jax() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_JAX, *JAX_FREE_MODULES], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "loaded: []"


def test_importing_ksim_loads_no_jax() -> None:
    """Even with JAX installed, `import ksim` leaves it (and mujoco.mjx, which imports it) unloaded."""
    code = "import sys, ksim; print(sorted(m for m in ('jax', 'jaxlib', 'mujoco.mjx') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
