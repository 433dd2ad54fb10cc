"""mode=view: the policy acting live in the web viewer (ksim.viewer), the checkpoint's or else the initial one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import xax

from ksim.task.rl import RLTask
from ksim.task.run_checkpoints import action_layout
from ksim.task.types import RLConfig, SharedState
from ksim.viewer.sim import ViewerSim
from ksim.viewer_settings import GEOM_GROUPS_HELP, ViewSettings, check_geom_groups, check_view_port, command_ranges

if TYPE_CHECKING:  # viser is the viewer extra's: train, eval and export run without it
    from ksim.viewer.server import Viewer


@dataclass
class Settings:
    view_port: int = xax.field(8080, help="The port the viewer's web page is served on.")
    geom_groups: list[int] = xax.field(lambda: [0, 1, 2], help=GEOM_GROUPS_HELP)


def check(config: RLConfig, settings: Settings) -> None:
    check_geom_groups(settings.geom_groups)
    check_view_port(settings.view_port)


def view_shared(task: RLTask[Any]) -> SharedState:
    """The policy shown: the checkpoint's (refused as mode=eval refuses it), else the initial one."""
    if task.config.load_from_ckpt_path:
        return task.checkpoints.load(task.config.load_from_ckpt_path)["shared"].deployed()
    return jax.device_get(task.init_shared(jax.random.split(jax.random.PRNGKey(task.config.seed), 3)[0]))


def view_settings(task: RLTask[Any], settings: Settings) -> ViewSettings:
    config = task.config
    layout = tuple(task.environment.observation_layout())
    actions = tuple(action_layout(task.engine.mj_model, task.actuators)["names"])
    ranges = command_ranges(task.components.command)
    port, groups = settings.view_port, tuple(settings.geom_groups)
    return ViewSettings(port, config.ctrl_dt, groups, layout, actions, ranges)


def make_viewer(task: RLTask[Any], settings: Settings | None = None) -> Viewer:
    """The viewer of the task's policy, its first step compiled; serving from here on."""
    from ksim.viewer.server import Viewer

    terrain = task.terrain_use
    sim = ViewerSim(task.environment, view_shared(task), task.config.seed, terrain.eval_level, terrain.eval_column)
    viewer = Viewer(
        sim, task.engine.mj_model, task.engine.layout.base_body, view_settings(task, settings or Settings())
    )
    viewer.step()
    return viewer


def run(task: RLTask[Any], settings: Settings | None = None) -> None:
    viewer = make_viewer(task, settings)
    print(f"viewer: {viewer.url} (Ctrl+C to stop)", flush=True)
    try:
        viewer.run()
    except KeyboardInterrupt:
        pass
    finally:
        viewer.close()
