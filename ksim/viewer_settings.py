"""What `mode=view` is told by the task and its checks on the config, apart from the viewer (no Viser import)."""

from __future__ import annotations

import errno
import importlib.util
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from ksim.commands import Command, HeldCommand, VelocityCommand
from ksim.config import ConfigError
from ksim.geom_mesh import NUM_GEOM_GROUPS

VIEWER_EXTRA = "pip install 'ksim[viewer]'"
# the modes that draw the model (eval's video, view) take `geom_groups`
GEOM_GROUPS_HELP = "MuJoCo geom groups (0-5) drawn, or shown at first (MuJoCo's own default: 0, 1 and 2)."


@dataclass(frozen=True)
class ViewSettings:
    port: int
    ctrl_dt: float
    geom_groups: tuple[int, ...]  # geom groups shown at first
    observation_layout: tuple[tuple[str, int], ...]
    action_names: tuple[str, ...]
    command_ranges: tuple[tuple[str, float, float], ...]  # (label, low, high) per command value; () without


def command_ranges(command: Command | None) -> tuple[tuple[str, float, float], ...]:
    """The viewer's slider per command value: a velocity command's own ranges, else -1 to 1; none for a command
    that is not held (a motion plays by itself)."""
    if not isinstance(command, HeldCommand):
        return ()
    if isinstance(command, VelocityCommand):
        return (
            ("forward (m/s)", *command.forward),
            ("lateral (m/s)", *command.lateral),
            ("yaw rate (rad/s)", *command.yaw_rate),
        )
    return tuple((f"{command.name}[{i}]", -1.0, 1.0) for i in range(command.size))


def check_geom_groups(groups: Sequence[int]) -> None:
    for group in groups:
        if not 0 <= group < NUM_GEOM_GROUPS:
            raise ConfigError(
                f"geom_groups={list(groups)} may hold only MuJoCo's geom groups 0 to {NUM_GEOM_GROUPS - 1}"
            )


def check_view_port(port: int) -> None:
    """ConfigError unless the viewer can run and listen on `view_port` (checked before anything compiles)."""
    if importlib.util.find_spec("viser") is None:
        raise ConfigError(f"mode='view' needs the viser package: {VIEWER_EXTRA}")
    if not 1 <= port <= 65535:
        raise ConfigError(f"view_port={port} must be a TCP port, 1 to 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except PermissionError:
            raise ConfigError(
                f"view_port={port} is not allowed for this user (ports below 1024 need root); "
                "choose another with view_port=<1024-65535>"
            ) from None
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise ConfigError(
                f"view_port={port} is in use by another program; choose another with view_port=<1024-65535>"
            ) from None
