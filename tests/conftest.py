"""Test set-up: 4 forced CPU devices (set before JAX is imported) and a shared compilation cache."""

import os
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
# Every task's default compilation cache (and every subprocess's) is the repo's .jax_cache/, not the user's:
# identical programs built by different test modules (same task, same shapes) compile once.
os.environ["XDG_CACHE_HOME"] = str(Path(__file__).resolve().parents[1] / ".jax_cache")

import ksim  # noqa: F401, I001  (first: its process settings must precede jaxlib's start, as in a launched run)
import jax
import pytest

jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


@pytest.fixture(scope="session", autouse=True)
def _four_devices() -> None:
    assert jax.local_device_count() == 4, "XLA_FLAGS was not applied before JAX was imported"
