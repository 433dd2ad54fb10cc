"""Test set-up: 4 forced CPU devices (set before JAX is imported) and a shared compilation cache."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax
import pytest

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)

# Identical programs built by different test modules (same task, same shapes) compile once.
jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.dirname(__file__), "..", ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


@pytest.fixture(scope="session", autouse=True)
def _four_devices() -> None:
    assert jax.local_device_count() == 4, "XLA_FLAGS was not applied before JAX was imported"
