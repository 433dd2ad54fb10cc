"""mode=eval: a checkpoint's deterministic episodes, their summary line, a video, per-level lines on a terrain
and the W&B run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xax

from ksim.config import ConfigError, require_positive
from ksim.task.evaluation import EvalResult, eval_line, summary_scalars
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig
from ksim.viewer_settings import GEOM_GROUPS_HELP, check_geom_groups
from ksim.wandb_logging import start_wandb


@dataclass
class Settings:
    video_path: str = xax.field("", help="Write the first episode to this .mp4 or .gif.")
    video_width: int = xax.field(640, help="Video frame width in pixels (at most the model's offscreen width).")
    video_height: int = xax.field(480, help="Video frame height in pixels (at most the model's offscreen height).")
    geom_groups: list[int] = xax.field(lambda: [0, 1, 2], help=GEOM_GROUPS_HELP)


def check(config: RLConfig, settings: Settings) -> None:
    if not config.load_from_ckpt_path:
        raise ConfigError("mode='eval' needs load_from_ckpt_path=<checkpoint file>")
    if settings.video_path and not settings.video_path.endswith((".mp4", ".gif")):
        raise ConfigError(f"video_path={settings.video_path!r} must end in .mp4 or .gif")
    require_positive(settings, "video_width", "video_height")
    check_geom_groups(settings.geom_groups)


def write_first_episode(task: RLTask[Any], result: EvalResult, settings: Settings) -> Path:
    """Env 0's first episode (and its reference, where the command has one) as a video at video_path."""
    from ksim.render import write_video

    mj_model = task.engine.mj_model
    size = (settings.video_width, settings.video_height)
    qpos, reference = result.poses(mj_model.nq)
    return write_video(mj_model, qpos, task.config.ctrl_dt, settings.video_path, size, settings.geom_groups, reference)


def run(task: RLTask[Any], settings: Settings | None = None) -> np.ndarray:
    """Evaluates the checkpoint; returns each episode's return."""
    config, settings = task.config, settings or Settings()
    contents = task.checkpoints.load(config.load_from_ckpt_path)
    result = task.evaluate(contents["shared"])
    print(eval_line(task.task_name, result), flush=True)
    video = write_first_episode(task, result, settings) if settings.video_path else None
    if video is not None:
        print(f"wrote {video}", flush=True)
    if task.terrain is not None:  # the same episodes on every level: fall rate and speed per level
        for level in range(task.terrain.grid.num_levels):
            on_level = task.evaluate(contents["shared"], level=level)
            print(f"terrain level {level}: {eval_line(task.task_name, on_level)}", flush=True)
    # The checkpoint's run folder (RUN/checkpoints/ckpt_*.bin) keeps the evaluation's W&B run.
    wandb_run = start_wandb(config, task.task_name, Path(config.load_from_ckpt_path).resolve().parent.parent, "eval")
    if wandb_run is not None:
        wandb_run.scalars(int(contents["step"]), int(contents["env_steps"]), summary_scalars(result))
        if video is not None:
            wandb_run.video("eval/video", video)
        wandb_run.finish()
    return result.returns
