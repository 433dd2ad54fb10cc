"""Checkpoints: msgpack files of host pytrees, written atomically and checked against the model."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from ksim.config import ConfigError


def save_checkpoint(path: str | Path, tree: Any) -> Path:
    """Writes `tree` (host or device arrays) to `path` via a temp file and rename, so never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = serialization.msgpack_serialize(serialization.to_state_dict(jax.device_get(tree)))
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def _shape_mismatches(expected: Any, loaded: Any, prefix: str = "") -> list[str]:
    if isinstance(expected, dict):
        if not isinstance(loaded, dict):
            return [f"{prefix or '<root>'} is missing"]
        problems = [f"{prefix}{key} is missing" for key in expected if key not in loaded]
        problems += [f"{prefix}{key} is unexpected" for key in loaded if key not in expected]
        for key in expected:
            if key in loaded:
                problems += _shape_mismatches(expected[key], loaded[key], f"{prefix}{key}/")
        return problems
    expected_shape, loaded_shape = np.shape(expected), np.shape(loaded)
    if expected_shape != loaded_shape:
        return [f"{prefix.rstrip('/')} has shape {loaded_shape} in the checkpoint but {expected_shape} in the model"]
    return []


def load_checkpoint(path: str | Path, target: Any) -> Any:
    """Reads a checkpoint into the structure of `target`, raising ConfigError if shapes differ."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"load_from_ckpt_path={str(path)!r} does not exist")
    state_dict = serialization.msgpack_restore(path.read_bytes())
    target = jax.device_get(target)
    problems = _shape_mismatches(serialization.to_state_dict(target), state_dict)
    if problems:
        listed = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise ConfigError(f"load_from_ckpt_path={str(path)!r} does not match the model: {listed}")
    return serialization.from_state_dict(target, state_dict)
