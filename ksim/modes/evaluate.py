"""mode=eval: a checkpoint's deterministic episodes, their summary line, a video, per-level lines on a terrain
and the W&B run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ksim.config import ConfigError
from ksim.task.evaluation import eval_line, report_evaluation, summary_scalars
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig
from ksim.wandb_logging import start_wandb


def check(config: RLConfig) -> None:
    if not config.load_from_ckpt_path:
        raise ConfigError("mode='eval' needs load_from_ckpt_path=<checkpoint file>")


def run(task: RLTask[Any]) -> np.ndarray:
    """Evaluates the checkpoint; returns each episode's return."""
    config = task.config
    contents = task.checkpoints.load(config.load_from_ckpt_path)
    result = task.evaluate(contents["shared"])
    video = report_evaluation(task.task_name, result, task.engine.mj_model, config)
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
