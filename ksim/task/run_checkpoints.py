"""What a task's checkpoints hold and say about their writer, and where a run keeps them.

The file format itself (metadata, atomic writes, pruning) is in `ksim.checkpoint`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import jax
import mujoco
import numpy as np
from omegaconf import OmegaConf

from ksim.actuators import Actuators, actuator_labels
from ksim.checkpoint import (
    MEMORYLESS,
    METADATA_FORMAT,
    check_metadata,
    load_checkpoint,
    load_metadata,
    prune_checkpoints,
    save_checkpoint,
)
from ksim.task.env import Environment
from ksim.task.reference import class_reference
from ksim.task.types import RLConfig, SharedState, TrainState
from ksim.xla_setup import installed_version

Array = jax.Array


def library_versions() -> dict[str, str]:
    """Versions of ksim and the libraries a checkpoint's numbers depend on."""
    return {
        "ksim": installed_version("ksim") or "unknown",
        "jax": jax.__version__,
        "flax": flax.__version__,
        "mujoco": mujoco.__version__,
        "mujoco-mjx": installed_version("mujoco-mjx") or "unknown",
    }


def action_layout(mj_model: mujoco.MjModel, actuators: Actuators) -> dict[str, Any]:
    """What the action vector drives: actuator names in order, the actuator type and its action scale."""
    scale = getattr(actuators, "action_scale", None)
    return {
        "names": actuator_labels(mj_model),
        "type": type(actuators).__name__,
        "scale": None if scale is None else float(scale),
    }


def user_classes(task_type: type) -> list[str]:
    """The classes of a task's type that its user wrote (not ksim's, nor Python's own)."""
    return [
        cls.__name__
        for cls in task_type.__mro__
        if not cls.__module__.startswith("ksim.") and cls.__module__ not in ("builtins", "abc", "typing")
    ]


def checkpoint_metadata(
    task_name: str,
    task_type: type,
    config: RLConfig,
    observation_layout: list[tuple[str, int]],
    actions: dict[str, Any],
    physics_impl: str,
    critic_layout: list[tuple[str, int]] | None = None,
    memory: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a checkpoint says about its writer; loading compares the task, the layouts and the policy's
    memory. `critic_layout`: the critic's own observations (None: it reads the actor's)."""
    return {
        "format": METADATA_FORMAT,
        "task": task_name,
        "task_classes": user_classes(task_type),
        "task_class": class_reference(task_type),  # what loads it again: module:Class or FILE.py:Class
        "config": OmegaConf.to_yaml(OmegaConf.structured(config)),
        "observations": [[name, size] for name, size in observation_layout],
        "critic_observations": None if critic_layout is None else [[name, size] for name, size in critic_layout],
        "policy_memory": memory or dict(MEMORYLESS),
        "actions": actions,
        "ctrl_dt": float(config.ctrl_dt),
        "physics_impl": physics_impl,
        "versions": library_versions(),
    }


def task_metadata(
    task_name: str, task_type: type, config: RLConfig, environment: Environment, memory: dict[str, Any]
) -> dict[str, Any]:
    """`checkpoint_metadata` of a task whose envs are `environment`."""
    engine = environment.engine
    return checkpoint_metadata(
        task_name,
        task_type,
        config,
        environment.observation_layout(),
        action_layout(engine.mj_model, environment.components.actuators),
        engine.physics_impl,
        environment.critic_observation_layout(),
        memory,
    )


def checkpoint_contents(shared: SharedState, rng: Array, step: int, env_steps: int) -> dict[str, Any]:
    """What a checkpoint holds: shared state (a host copy), update RNG and counters (envs restart on resume)."""
    return {"shared": shared, "rng": rng, "step": np.asarray(step), "env_steps": np.asarray(env_steps)}


def numbered_checkpoint(run_dir: Path, step: int) -> Path:
    """Where a run keeps its checkpoint of train step `step`."""
    return run_dir / "checkpoints" / f"ckpt_{step:08d}.bin"


def best_checkpoint(run_dir: Path) -> Path:
    """Where a run keeps the checkpoint of its best evaluation so far."""
    return run_dir / "checkpoints" / "ckpt_best.bin"


def best_score(run_dir: Path) -> float | None:
    """The score of the run's best evaluation so far, from its ckpt_best.bin (None before one), so that a
    run resumed in its own folder keeps it."""
    path = best_checkpoint(run_dir)
    evaluation = (load_metadata(path) or {}).get("evaluation") if path.exists() else None
    return None if evaluation is None else float(evaluation["score"])


def save_run_checkpoint(
    run_dir: Path, contents: dict[str, Any], metadata: dict[str, Any], step: int, keep_last: int
) -> Path:
    """Writes ckpt_<step>.bin and ckpt_latest.bin under run_dir/checkpoints, then keeps the last `keep_last`
    numbered ones (0: all)."""
    path = save_checkpoint(numbered_checkpoint(run_dir, step), contents, metadata)
    directory = path.parent
    save_checkpoint(directory / "ckpt_latest.bin", contents, metadata)
    prune_checkpoints(directory, keep_last)
    return path


def load_run_checkpoint(
    path: str | Path, shared_template: SharedState, metadata: dict[str, Any], allow_mismatch: bool
) -> dict[str, Any]:
    """A checkpoint's contents; ConfigError if another task or observation layout wrote it (unless
    `allow_mismatch`) or if its shapes differ from `shared_template`'s."""
    target = checkpoint_contents(shared_template, jax.random.PRNGKey(0), 0, 0)
    adapt = functools.partial(conform_average, keeps_average=shared_template.average_params is not None)
    contents = load_checkpoint(path, target, metadata, allow_mismatch, adapt)
    note = physics_impl_note(load_metadata(path), metadata)
    if note:
        print(note, flush=True)
    return contents


def conform_average(state_dict: dict[str, Any], keeps_average: bool) -> dict[str, Any]:
    """A checkpoint's state as the task keeps it: a parameter average started at the checkpoint's parameters
    where it kept none, and none where the task keeps none (policy_average_decay=0 evaluates the latest)."""
    shared = state_dict.get("shared")
    if not isinstance(shared, dict):
        return state_dict
    if keeps_average and shared.get("average_params") is None:
        shared = {**shared, "average_params": shared.get("params")}
    elif not keeps_average:
        shared = {key: value for key, value in shared.items() if key != "average_params"}
    return {**state_dict, "shared": shared}


def physics_impl_note(found: dict[str, Any] | None, expected: dict[str, Any]) -> str | None:
    """One line where a checkpoint was trained with another physics implementation (allowed: the physics is
    the same model, computed at another precision)."""
    trained = (found or {}).get("physics_impl")
    if trained is None or trained == expected.get("physics_impl"):
        return None
    return (
        f"note: this checkpoint was trained with physics_impl={trained!r} and continues with "
        f"physics_impl={expected.get('physics_impl')!r} (the same model; the physics differs in float precision)"
    )


class RunCheckpoints:
    """A task's checkpoints: what they say about the task (`metadata`, computed once, on first use), writing
    them into a run folder and loading one back after checking its writer and shapes.

    `template` gives shared state of the task's shapes; `fetch` copies replicated state to the host.
    """

    def __init__(
        self,
        metadata: Callable[[], dict[str, Any]],
        template: Callable[[], SharedState],
        fetch: Callable[[Any], Any],
        keep_last: int,
        allow_mismatch: bool,
    ) -> None:
        self._metadata = metadata
        self._template = template
        self._fetch = fetch
        self.keep_last = keep_last
        self.allow_mismatch = allow_mismatch

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        return self._metadata()

    def contents(self, state: TrainState, step: int, env_steps: int) -> dict[str, Any]:
        """What a checkpoint holds: shared state, update RNG and counters (envs restart on resume)."""
        return checkpoint_contents(self._fetch(state.shared), self._fetch(state.rng), step, env_steps)

    def save(self, run_dir: Path, state: TrainState, step: int, env_steps: int) -> Path:
        """Writes ckpt_<step>.bin and ckpt_latest.bin, then keeps the last `keep_last` numbered ones."""
        return save_run_checkpoint(run_dir, self.contents(state, step, env_steps), self.metadata, step, self.keep_last)

    def save_best(
        self, run_dir: Path, state: TrainState, step: int, env_steps: int, evaluation: dict[str, float]
    ) -> Path:
        """Writes ckpt_best.bin: this train step's checkpoint, its metadata also holding the evaluation (with its
        `score`) that made it the best."""
        metadata = {**self.metadata, "evaluation": {"step": step, **evaluation}}
        return save_checkpoint(best_checkpoint(run_dir), self.contents(state, step, env_steps), metadata)

    def load(self, path: str | Path) -> dict[str, Any]:
        """A checkpoint's contents; ConfigError if another task or observation layout wrote it (unless
        allow_mismatch) or if its shapes differ from the model's."""
        check_metadata(path, load_metadata(path), self.metadata, self.allow_mismatch)  # before the model compiles
        return load_run_checkpoint(path, self._template(), self.metadata, self.allow_mismatch)
