"""The modes a built task runs in (`mode=` on the command line): train, eval, export and view.

Each mode is a module of this package with its own settings (`Settings`, a dataclass: what only that mode reads,
such as eval's video_path or export's export_path), `check(config, settings)`, the mode's rules (run before the task
is built), and `run(task, settings)`. `launch` gives each `key=value` to the task's config or to the chosen mode's
settings; adding a mode means adding a module and a line in `MODES`, nothing in `ksim.task`.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import ksim.modes.evaluate as evaluate
import ksim.modes.export as export
import ksim.modes.train as train
import ksim.modes.view as view
from ksim.config import ConfigError, help_text, parse_overrides, require_choice
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig


class Mode(Protocol):
    Settings: type[Any]

    def check(self, config: RLConfig, settings: Any) -> None:
        """ConfigError naming the setting and the rule, before the task is built."""

    def run(self, task: Any, settings: Any) -> Any:
        """Runs the mode on a built task; returns what the mode produced."""


MODES: dict[str, Mode] = {"train": train, "eval": evaluate, "export": export, "view": view}


def check(config: RLConfig, settings: Any = None) -> Any:
    """The mode exists and its settings (its defaults when None) follow its rules; returns the settings."""
    require_choice(config, "mode", tuple(MODES))
    mode = MODES[config.mode]
    settings = mode.Settings() if settings is None else settings
    if not isinstance(settings, mode.Settings):
        raise ConfigError(f"mode={config.mode!r} takes its own Settings, not {type(settings).__name__}")
    mode.check(config, settings)
    return settings


def run(task: RLTask[Any], settings: Any = None) -> Any:
    """Runs the task's configured mode with its settings (the mode's defaults when None)."""
    settings = check(task.config, settings)
    return MODES[task.config.mode].run(task, settings)


def setting_names(mode: Mode) -> set[str]:
    return {field.name for field in dataclasses.fields(mode.Settings)}


def split_arguments(config: RLConfig, args: Sequence[str]) -> tuple[RLConfig, Any]:
    """The task's config with its `key=value` overrides, and the chosen mode's settings with theirs; a setting of
    another mode is refused naming that mode."""
    owners: dict[str, list[str]] = {}
    for mode_name, mode in MODES.items():
        for name in setting_names(mode):
            owners.setdefault(name, []).append(f"mode={mode_name}")
    keyed = [(arg.split("=", 1)[0], arg) for arg in args]
    config = parse_overrides(config, [arg for key, arg in keyed if key not in owners])
    require_choice(config, "mode", tuple(MODES))
    own = setting_names(MODES[config.mode])
    for key, _ in keyed:
        if key in owners and key not in own:
            raise ConfigError(f"{key} is a setting of {' and '.join(owners[key])}, not of mode={config.mode}")
    settings = parse_overrides(MODES[config.mode].Settings(), [arg for key, arg in keyed if key in own])
    return config, settings


def full_help(config: RLConfig) -> str:
    """The task's settings, then each mode's own."""
    sections = [help_text(config)]
    for name, mode in MODES.items():
        if setting_names(mode):
            sections.append(help_text(mode.Settings(), f"Settings of mode={name} (override with key=value):"))
    return "\n\n".join(sections)


def launch(task_class: type[RLTask[Any]], config: RLConfig, argv: Sequence[str] | None = None) -> Any:
    """`python -m examples.x key=value ...`: parse overrides, check them, build the task, run its mode; a bad
    setting is one line on stderr and exit status 2."""
    # At exit, after the handlers registered before it: the interpreter's final collection over JAX's and
    # MuJoCo's object graphs takes ~0.4 s and frees nothing the exiting process needs freed.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(full_help(config))
        raise SystemExit(0)
    try:
        config, settings = split_arguments(config, args)
        settings = check(config, settings)
        return MODES[config.mode].run(task_class(config), settings)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
