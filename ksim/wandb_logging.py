"""`logger=wandb`: the run's scalars, config, learning-curve picture and evaluation videos on Weights & Biases.

W&B's own settings apply: `WANDB_MODE=offline` keeps the run in `RUN_DIR/wandb/` (upload it later with
`wandb sync`), `WANDB_API_KEY` or `wandb login` for online runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

WANDB_EXTRA = "pip install 'ksim[wandb]'"


class WandbRun:
    """One W&B run; records what `MetricsLogger` records, against env steps as TensorBoard does."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict[str, Any], job_type: str) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=project, name=name, dir=str(run_dir), config=config, job_type=job_type, reinit="create_new"
        )
        self.run.define_metric("*", step_metric="env_steps")

    def scalars(self, step: int, env_steps: int, values: dict[str, float]) -> None:
        self.run.log({**values, "env_steps": env_steps, "train_step": step})

    def image(self, key: str, path: Path) -> None:
        self.run.log({key: self._wandb.Image(str(path))})

    def video(self, key: str, path: Path) -> None:
        self.run.log({key: self._wandb.Video(str(path))})

    def finish(self) -> None:
        self.run.finish()


def start_wandb(config: Any, task_name: str, run_dir: Path, job_type: str) -> WandbRun | None:
    """The W&B run of logger=wandb (with the config, a dataclass), else None."""
    if config.logger != "wandb":
        return None
    return WandbRun(run_dir, config.wandb_project, f"{task_name}/{run_dir.name}", dataclasses.asdict(config), job_type)
