"""Checkpoints: msgpack files of host pytrees plus metadata, written atomically and checked on load.

A checkpoint is one msgpack map: the state under its own keys and, under `METADATA_KEY`, a JSON string
saying what wrote it (task, config, observation and action layout, ctrl_dt, library versions).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from ksim.config import ConfigError

METADATA_KEY = "__ksim_metadata__"
METADATA_FORMAT = 1
OVERRIDE_HINT = "(set allow_checkpoint_mismatch=true to load anyway)"
NUMBERED = re.compile(r"ckpt_(\d{8})\.bin")
TEMP_PATTERN = ".ckpt_*.tmp"
# What checkpoints without a policy_memory entry (or one of its settings) had: the plain tanh MLPs.
MEMORYLESS: dict[str, Any] = {
    "observation_history": 1,
    "recurrent_size": 0,
    "estimated_observations": [],
    "activation": "tanh",
}


def _fsync_dir(directory: Path) -> None:
    """Makes a rename in `directory` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: str | Path, tree: Any, metadata: dict[str, Any] | None = None) -> Path:
    """Writes `tree` (and `metadata`) via a temp file, fsync and rename, so `path` is never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = serialization.to_state_dict(jax.device_get(tree))
    if metadata is not None:
        state = {**state, METADATA_KEY: json.dumps(metadata)}
    payload = serialization.msgpack_serialize(state)
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
    _fsync_dir(path.parent)
    return path


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Deletes all but the newest `keep_last` numbered checkpoints (0 keeps all) and stale temp files."""
    directory = Path(directory)
    for stale in directory.glob(TEMP_PATTERN):  # left by a writer that was killed mid-save
        stale.unlink(missing_ok=True)
    numbered = sorted((p for p in directory.iterdir() if NUMBERED.fullmatch(p.name)), key=lambda p: p.name)
    removed = numbered[:-keep_last] if keep_last > 0 else []
    for old in removed:
        old.unlink(missing_ok=True)
    return removed


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The state dict and metadata (None for checkpoints written before metadata) of a checkpoint file."""
    path = Path(path)
    where = f"load_from_ckpt_path={str(path)!r}"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist")
    payload = path.read_bytes()
    if not payload:
        raise ConfigError(f"{where} is an empty file, not a checkpoint")
    try:
        state = serialization.msgpack_restore(payload)
    except Exception as error:  # msgpack raises several types (ExtraData, ValueError, ...) for bad input
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{where} is truncated or not a ksim checkpoint ({reason[:80]})") from None
    if not isinstance(state, dict) or not state:
        raise ConfigError(f"{where} is not a ksim checkpoint (no state in it)")
    raw = state.pop(METADATA_KEY, None)
    if raw is None:
        return state, None
    try:
        metadata = json.loads(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} has unreadable metadata (not JSON)") from None
    return state, metadata


def _task_text(metadata: dict[str, Any]) -> str:
    """A checkpoint's task by name, and by what loads it where the metadata records that."""
    return f"{metadata['task']} ({metadata['task_class']})" if metadata.get("task_class") else metadata["task"]


def _layout_text(layout: Sequence[Any]) -> str:
    return ", ".join(f"{name}({size})" for name, size in layout) or "nothing"


def _critic_text(layout: Sequence[Any] | None) -> str:
    return "no critic group (the critic reads the actor's input)" if layout is None else _layout_text(layout)


def memory_mismatch(found: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Which policy-memory, estimator or activation setting differs (the networks differ, so no override loads
    it: an activation that differs would load without a shape error and compute another policy)."""
    found_memory = found.get("policy_memory", MEMORYLESS)
    expected_memory = expected.get("policy_memory", MEMORYLESS)
    for name in sorted(expected_memory):
        if found_memory.get(name, MEMORYLESS.get(name)) != expected_memory[name]:
            return (
                f"{name}={found_memory.get(name, MEMORYLESS.get(name))} in the checkpoint, "
                f"{expected_memory[name]} here (the setting must match the checkpoint's)"
            )
    return None


def metadata_mismatch(found: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Why a checkpoint's metadata does not fit this task (other task, observation or action layout)."""
    related = found["task"] in expected.get("task_classes", []) or expected["task"] in found.get("task_classes", [])
    if found["task"] != expected["task"] and not related:
        return f"written by {_task_text(found)}, this is {_task_text(expected)}"
    found_obs = [tuple(item) for item in found["observations"]]
    expected_obs = [tuple(item) for item in expected["observations"]]
    if found_obs != expected_obs:
        return (
            f"observations differ: the checkpoint has {_layout_text(found_obs)}, "
            f"{expected['task']} has {_layout_text(expected_obs)}"
        )
    found_critic, expected_critic = found.get("critic_observations"), expected.get("critic_observations")
    if found_critic != expected_critic:
        return (
            f"critic observations differ: the checkpoint has {_critic_text(found_critic)}, "
            f"{expected['task']} has {_critic_text(expected_critic)}"
        )
    if found["actions"]["names"] != expected["actions"]["names"]:
        return (
            f"actuators differ: the checkpoint has {', '.join(found['actions']['names'])}, "
            f"{expected['task']} has {', '.join(expected['actions']['names'])}"
        )
    return None


def check_metadata(path: str | Path, found: dict[str, Any] | None, expected: dict[str, Any], allow: bool) -> None:
    """Raises ConfigError (one line) if the checkpoint was written for something else, unless `allow`
    (a policy memory that differs is refused even then: the networks differ)."""
    where = f"load_from_ckpt_path={str(path)!r}"
    memory_problem = memory_mismatch(found, expected) if isinstance(found, dict) else None
    if memory_problem:
        raise ConfigError(f"{where}: {memory_problem}")
    if allow:
        return
    if found is None:
        raise ConfigError(f"{where} has no metadata (written by an older ksim) {OVERRIDE_HINT}")
    missing = [key for key in ("task", "observations", "actions") if not isinstance(found, dict) or key not in found]
    if missing:
        raise ConfigError(
            f"{where} has metadata without {', '.join(missing)} (not a task's checkpoint) {OVERRIDE_HINT}"
        )
    problem = metadata_mismatch(found, expected)
    if problem:
        raise ConfigError(f"{where}: {problem} {OVERRIDE_HINT}")


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


def with_unset_fields(expected: Any, loaded: Any) -> Any:
    """`loaded` with the fields that `expected` leaves unset (None) and `loaded` lacks: a checkpoint written
    before an optional field existed (e.g. SharedState.return_normalizer) loads where the field is off."""
    if not isinstance(expected, dict) or not isinstance(loaded, dict):
        return loaded
    filled = {
        key: with_unset_fields(expected[key], value) if key in expected else value for key, value in loaded.items()
    }
    return filled | {key: None for key, value in expected.items() if value is None and key not in loaded}


def load_checkpoint(
    path: str | Path,
    target: Any,
    expected_metadata: dict[str, Any] | None = None,
    allow_mismatch: bool = False,
    adapt: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Any:
    """Reads a checkpoint into the structure of `target`; ConfigError if it was written for something else.

    With `expected_metadata`, the checkpoint's metadata must match it (unless `allow_mismatch`); shapes must
    always match. `adapt` may fill in or leave out optional parts of the state dict before the shapes are checked.
    """
    state_dict, metadata = read_checkpoint(path)
    if expected_metadata is not None:
        check_metadata(path, metadata, expected_metadata, allow_mismatch)
    if adapt is not None:
        state_dict = adapt(state_dict)
    target = jax.device_get(target)
    expected = serialization.to_state_dict(target)
    state_dict = with_unset_fields(expected, state_dict)
    problems = _shape_mismatches(expected, state_dict)
    if problems:
        listed = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise ConfigError(f"load_from_ckpt_path={str(path)!r} does not match the model: {listed}")
    return serialization.from_state_dict(target, state_dict)


def load_metadata(path: str | Path) -> dict[str, Any] | None:
    """Just the metadata of a checkpoint (None if it has none)."""
    return read_checkpoint(path)[1]
