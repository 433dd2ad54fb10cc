"""What a task's checkpoints hold and say about their writer: save, load (checked), export.

`CheckpointMixin` is part of `RLTask`; the file format itself (metadata, atomic writes, pruning) is in
`ksim.checkpoint`.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import flax
import jax
import mujoco
import numpy as np
from omegaconf import OmegaConf

from ksim.checkpoint import METADATA_FORMAT, load_checkpoint, prune_checkpoints, save_checkpoint
from ksim.reporting import unique_names

if TYPE_CHECKING:
    from ksim.actuators import Actuators
    from ksim.commands import Command
    from ksim.engine import PhysicsEngine
    from ksim.observations import Observation
    from ksim.task.rl import RLConfig, RLTask, SharedState, TrainState

Array = jax.Array


def library_versions() -> dict[str, str]:
    """Versions of ksim and the libraries a checkpoint's numbers depend on."""
    try:
        ksim_version = importlib.metadata.version("ksim")
    except importlib.metadata.PackageNotFoundError:
        ksim_version = "unknown"
    return {"ksim": ksim_version, "jax": jax.__version__, "flax": flax.__version__, "mujoco": mujoco.__version__}


class CheckpointMixin:
    """Checkpoint contents and metadata of an `RLTask` (which provides the attributes declared below)."""

    if TYPE_CHECKING:
        config: RLConfig
        engine: PhysicsEngine
        observations: tuple[Observation, ...]
        actuators: Actuators
        command: Command | None

        @property
        def observation_sizes(self) -> list[int]: ...
        @property
        def task_name(self) -> str: ...
        def fetch_replicated(self, tree: Any) -> Any: ...
        def init_shared(self, rng: Array) -> SharedState: ...

    def observation_layout(self) -> list[tuple[str, int]]:
        """(name, size) of each observation component, in the order they fill the observation vector."""
        return list(self._observation_layout)

    @functools.cached_property
    def _observation_layout(self) -> tuple[tuple[str, int], ...]:
        names = unique_names([obs.name for obs in self.observations])
        return tuple(zip(names, self.observation_sizes, strict=True))

    def action_layout(self) -> dict[str, Any]:
        """What the action vector drives: actuator names in order, the actuator type and its action scale."""
        mj_model = self.engine.mj_model
        names = [
            mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_ACTUATOR, i) or f"actuator_{i}" for i in range(mj_model.nu)
        ]
        scale = getattr(self.actuators, "action_scale", None)
        return {
            "names": names,
            "type": type(self.actuators).__name__,
            "scale": None if scale is None else float(scale),
        }

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What a checkpoint says about its writer; loading compares the task and the layouts."""
        return {
            "format": METADATA_FORMAT,
            "task": self.task_name,
            "task_classes": [
                cls.__name__
                for cls in type(self).__mro__
                if issubclass(cls, CheckpointMixin) and not cls.__module__.startswith("ksim.")
            ],
            "config": OmegaConf.to_yaml(OmegaConf.structured(self.config)),
            "observations": [[name, size] for name, size in self.observation_layout()],
            "actions": self.action_layout(),
            "ctrl_dt": float(self.config.ctrl_dt),
            "versions": library_versions(),
        }

    @functools.cached_property
    def _checkpoint_metadata(self) -> dict[str, Any]:
        return self.checkpoint_metadata()

    def save(self, run_dir: Path, state: TrainState, step: int, env_steps: int) -> Path:
        """Writes ckpt_<step>.bin and ckpt_latest.bin, then keeps the last keep_last_n_checkpoints numbered."""
        contents = self.checkpoint_contents(state, step, env_steps)
        directory = run_dir / "checkpoints"
        path = save_checkpoint(directory / f"ckpt_{step:08d}.bin", contents, self._checkpoint_metadata)
        save_checkpoint(directory / "ckpt_latest.bin", contents, self._checkpoint_metadata)
        prune_checkpoints(directory, self.config.keep_last_n_checkpoints)
        return path

    def checkpoint_contents(self, state: TrainState, step: int, env_steps: int) -> dict[str, Any]:
        """What a checkpoint holds: shared state, update RNG and counters (envs restart on resume)."""
        return {
            "shared": self.fetch_replicated(state.shared),
            "rng": self.fetch_replicated(state.rng),
            "step": np.asarray(step),
            "env_steps": np.asarray(env_steps),
        }

    def load_contents(self, path: str | Path) -> dict[str, Any]:
        """A checkpoint's contents; ConfigError if another task or observation layout wrote it (see
        allow_checkpoint_mismatch) or if its shapes differ from the model's."""
        target = {
            "shared": self.init_shared(jax.random.PRNGKey(0)),
            "rng": jax.random.PRNGKey(0),
            "step": np.asarray(0),
            "env_steps": np.asarray(0),
        }
        return load_checkpoint(path, target, self._checkpoint_metadata, self.config.allow_checkpoint_mismatch)

    def run_export(self) -> Path:
        """Writes the checkpoint's deterministic policy to export_path (ONNX) and a JSON beside it."""
        from ksim.export import export_policy

        contents = self.load_contents(self.config.load_from_ckpt_path)
        onnx_path, json_path = export_policy(
            cast("RLTask[Any]", self), contents["shared"], self.config.export_path, self.config.load_from_ckpt_path
        )
        print(f"wrote {onnx_path} and {json_path}", flush=True)
        return onnx_path
