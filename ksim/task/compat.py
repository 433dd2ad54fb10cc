"""What moved out of RLTask in this version: a task that overrides one of those methods is refused when it is
built, in one line naming where the method went, instead of its override being silently skipped."""

from __future__ import annotations

from ksim.config import ConfigError

MOVED_METHODS = {
    **dict.fromkeys(("build_terrain", "build_mujoco_model"), "ksim.task.terrain_use.compile_with_terrain"),
    **dict.fromkeys(
        ("check_terrain_use", "eval_terrain_level", "eval_terrain_column", "first_cells", "next_cells"),
        "ksim.task.terrain_use (task.terrain_use)",
    ),
    **dict.fromkeys(("reset_shard", "step_shard", "refill_next_starts", "refill_if"), "task.env_pool (EnvPool)"),
    **dict.fromkeys(("update_normalizers", "update_normalizer"), "ksim.normalization.fold_batch"),
    "reduce_rollout_metrics": "ksim.task.env_pool.reduce_rollout_metrics",
    **dict.fromkeys(("rollout", "update", "program", "precompile"), "task.programs"),
    **dict.fromkeys(
        ("save", "load_contents", "checkpoint_contents", "checkpoint_metadata", "action_layout"),
        "task.checkpoints (RunCheckpoints)",
    ),
    **dict.fromkeys(("run_export", "deterministic_step"), "ksim.modes.export"),
    "run_eval": "ksim.modes.evaluate",
    **dict.fromkeys(("view_shared", "view_settings", "make_viewer", "run_view"), "ksim.modes.view"),
    **dict.fromkeys(
        ("make_run_dir", "run_training", "start_wandb", "make_logger", "after_training"), "ksim.modes.train"
    ),
    "eval_due": "ksim.task.loop.eval_due",
    "is_logging_process": "ksim.modes.train",
    "scalars": "ksim.reporting.window_scalars",
    **dict.fromkeys(("observation_dim", "critic_observation_dim"), "task.environment"),
    "max_episode_steps": "ksim.task.types.episode_steps",
}


def check_no_moved_overrides(task_type: type) -> None:
    """ConfigError if a class of `task_type` outside ksim defines a method that is no longer RLTask's."""
    for cls in task_type.__mro__:
        if cls.__module__.startswith("ksim.") or cls.__module__ in ("builtins", "abc", "typing"):
            continue
        for name in sorted(MOVED_METHODS.keys() & vars(cls).keys()):
            raise ConfigError(
                f"{cls.__name__}.{name} overrides a method RLTask no longer has (it moved to {MOVED_METHODS[name]}, "
                "docs/tasks.md 'Changed in this version'); move the change there or drop it"
            )
