"""The modes a built task runs in (`mode=` on the command line): train, eval, export and view.

Each mode is a module of this package with `check(config)`, the rules of the mode's own settings (run before
the task is built), and `run(task)`. `launch` picks one from `MODES`; adding a mode means adding a module and
a line here, nothing in `ksim.task`.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import ksim.modes.evaluate as evaluate
import ksim.modes.export as export
import ksim.modes.train as train
import ksim.modes.view as view
from ksim.config import ConfigError, parse_command_line, require_choice
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig


class Mode(Protocol):
    def check(self, config: RLConfig) -> None:
        """ConfigError naming the setting and the rule, before the task is built."""

    def run(self, task: Any) -> Any:
        """Runs the mode on a built task; returns what the mode produced."""


MODES: dict[str, Mode] = {"train": train, "eval": evaluate, "export": export, "view": view}


def check(config: RLConfig) -> None:
    """The mode exists and its settings follow its rules."""
    require_choice(config, "mode", tuple(MODES))
    MODES[config.mode].check(config)


def run(task: RLTask[Any]) -> Any:
    """Runs the task's configured mode."""
    check(task.config)
    return MODES[task.config.mode].run(task)


def launch(task_class: type[RLTask[Any]], config: RLConfig, argv: Sequence[str] | None = None) -> Any:
    """`python -m examples.x key=value ...`: parse overrides, check them, build the task, run its mode; a bad
    setting is one line on stderr and exit status 2."""
    # At exit, after the handlers registered before it: the interpreter's final collection over JAX's and
    # MuJoCo's object graphs takes ~0.4 s and frees nothing the exiting process needs freed.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    try:
        config = parse_command_line(config, argv)
        check(config)
        return MODES[config.mode].run(task_class(config))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
