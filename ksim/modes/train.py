"""mode=train: the run folder, its logger and W&B run, the training loop (ksim.task.loop) and the learning curve."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
from omegaconf import OmegaConf

from ksim.plot import plot_learning_curve
from ksim.reporting import SCALARS_FILE, MetricsLogger
from ksim.task.loop import Resume, run_training
from ksim.task.rl import RLTask
from ksim.task.types import RLConfig, TrainState
from ksim.wandb_logging import start_wandb


@dataclass
class Settings:
    """Training has no settings of its own beyond the task's."""


def check(config: RLConfig, settings: Settings) -> None:
    """Training has no rules of its own beyond the task's."""


def make_run_dir(task_name: str, config: RLConfig) -> Path:
    """The run folder (run_dir, else runs/<task>/<timestamp>) with the run's config.yaml."""
    run_dir = Path(config.run_dir or f"runs/{task_name}/{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    return run_dir


def run(task: RLTask[Any], settings: Settings | None = None) -> TrainState:
    """Trains (resuming from load_from_ckpt_path if set); process 0 logs, saves and draws the learning curve."""
    config = task.config
    resume = (
        Resume.from_contents(task.checkpoints.load(config.load_from_ckpt_path)) if config.load_from_ckpt_path else None
    )
    run_dir = make_run_dir(task.task_name, config) if jax.process_index() == 0 else None
    wandb_run = start_wandb(config, task.task_name, run_dir, "train") if run_dir else None
    if run_dir is None:
        logger = MetricsLogger(None)
    else:
        logger = MetricsLogger(run_dir / "tensorboard", run_dir / SCALARS_FILE, [wandb_run] if wandb_run else [])
    state, steps_run = run_training(task, run_dir, logger, resume)
    if run_dir and steps_run:
        curve = plot_learning_curve(run_dir, task.task_name)
        print(f"wrote {curve}", flush=True)
        if wandb_run is not None:
            wandb_run.image("learning_curve", curve)
    if wandb_run is not None:
        wandb_run.finish()
    return state
