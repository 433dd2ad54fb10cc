"""Naming a task's class so that another process loads it again: "module:Class" or "path/to/file.py:Class".

A task defined in a module run with `python -m package.module` is named by that module. One defined in a script
run as `python my_robot.py` lives in `__main__`, which no other process can import, so it is named by its file:
relative to the folder of the file that records it (policy.json, a checkpoint) where the two share a folder
below the filesystem's root, absolute otherwise. Every tool that takes a task (`ksim.sim2sim --task`, the analysis
tools, a checkpoint's record of its writer) reads both forms with `load_attribute`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ksim.errors import ConfigError

FILE_MODULE_PREFIX = "ksim_task_file_"  # the module name a file loaded by path is registered under
_loaded_files: dict[Path, ModuleType] = {}


def script_file(module: ModuleType) -> Path | None:
    """The file of a module that no other process can import by its name (a script's `__main__`, a file loaded
    by path); None for an importable module."""
    name = module.__name__
    by_path = name.startswith(FILE_MODULE_PREFIX)
    if (name == "__main__" and getattr(module, "__spec__", None) is None) or by_path:
        file = getattr(module, "__file__", None)
        return Path(file).resolve() if file else None
    return None


def class_reference(cls: type, relative_to: str | Path | None = None) -> str:
    """ "module:Class", or "FILE.py:Class" for a class defined in a script; FILE is relative to the folder
    `relative_to` where the two share a folder below the root."""
    module = sys.modules.get(cls.__module__)
    file = script_file(module) if module is not None else None
    if file is None:
        name = cls.__module__
        if name == "__main__" and module is not None:  # a `python -m` run: the module as it was run
            name = module.__spec__.name  # type: ignore[union-attr]
        return f"{name}:{cls.__qualname__}"
    if relative_to is not None:
        folder = Path(relative_to).resolve()
        if Path(os.path.commonpath([folder, file])) != Path(file.anchor):
            return f"{Path(os.path.relpath(file, folder)).as_posix()}:{cls.__qualname__}"
    return f"{file.as_posix()}:{cls.__qualname__}"


def is_file_reference(reference: str) -> bool:
    location, _, _ = reference.rpartition(":")
    return location.endswith(".py") or "/" in location or "\\" in location


def same_location(reference: str, other: str) -> bool:
    """Whether two references name attributes of the same module or file."""
    return reference.rpartition(":")[0] == other.rpartition(":")[0]


def relocated(reference: str, new_location: str) -> str:
    """`reference`'s attribute at the module or file of `new_location` (another reference)."""
    return f"{new_location.rpartition(':')[0]}:{reference.rpartition(':')[2]}"


def load_module(location: str, base: str | Path | None = None, hint: str = "") -> ModuleType:
    """The module at `location`: a file (relative to the folder `base`, else to the working directory) or a
    module name; ConfigError naming what was looked for and `hint` (how to point at it) otherwise."""
    if location.endswith(".py") or "/" in location or "\\" in location:
        return _load_file(Path(base or ".") / location, hint)
    try:
        return importlib.import_module(location)
    except ImportError as error:
        where = f"run from the folder that holds {location.split('.')[0]!r}"
        raise ConfigError(f"cannot import module {location!r} ({error}); {where}{_or(hint)}") from None


def load_attribute(reference: str, base: str | Path | None = None, hint: str = "") -> Any:
    """What `reference` ("module:Name" or "FILE.py:Name") names; ConfigError in one line if it cannot."""
    return _module_and_attribute(reference, base, hint)[1]


def _module_and_attribute(reference: str, base: str | Path | None, hint: str) -> tuple[ModuleType, Any]:
    location, _, name = reference.rpartition(":")
    if not location or not name:
        raise ConfigError(f"{reference!r} must be module:Class or FILE.py:Class (e.g. examples.kbot:KBotTask)")
    module = load_module(location, base, hint)
    value: Any = module
    for part in name.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"{reference!r}: {getattr(module, '__file__', location)} defines no {name!r}{_or(hint)}")
        value = getattr(value, part)
    return module, value


def _or(hint: str) -> str:
    return f"; point at it with {hint}" if hint else ""


def _load_file(path: Path, hint: str) -> ModuleType:
    """A Python file as a module, once per file (two loads would make two of each class); its folder goes on
    sys.path first, as when the file runs as a script, so that it imports what lies beside it."""
    path = path.resolve()
    if path in _loaded_files:
        return _loaded_files[path]
    if not path.is_file():
        raise ConfigError(f"the task's file {path} does not exist{_or(hint)}")
    name = f"{FILE_MODULE_PREFIX}{len(_loaded_files)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path} is a .py file"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing look the module up while it executes
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _loaded_files[path] = module
    return module


def task_and_default_config(reference: str, hint: str = "") -> tuple[type, Any]:
    """The task class `reference` names and the DEFAULT_CONFIG of the module or file it names (what the analysis
    tools start from)."""
    module, task_type = _module_and_attribute(reference, None, hint)
    if not hasattr(module, "DEFAULT_CONFIG"):
        where = getattr(module, "__file__", None) or module.__name__
        raise ConfigError(f"{reference!r}: {where} has no DEFAULT_CONFIG to build the task from")
    return task_type, module.DEFAULT_CONFIG
