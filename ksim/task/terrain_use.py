"""How a task uses its terrain: the model with the heightfield, the checks of the curriculum and of the
evaluation tile, and where each env's episodes run (its tile, moved by the curriculum at episode ends).

Built once per task by `terrain_use`; without a terrain every env stays on cell (0, 0) of the plain floor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import mujoco

from ksim.commands import Command, VelocityCommand
from ksim.config import ConfigError
from ksim.engine import PhysicsEngine
from ksim.task.types import Episode, RLConfig
from ksim.terrain import Terrain, TerrainCells, TerrainCurriculum, initial_cells

Array = jax.Array


def compile_with_terrain(model: mujoco.MjModel | mujoco.MjSpec, terrain: Terrain | None) -> mujoco.MjModel:
    """The task's model, with the terrain's heightfield when it has one."""
    if terrain is None:
        return model.compile() if isinstance(model, mujoco.MjSpec) else model
    if not isinstance(model, mujoco.MjSpec):
        raise ConfigError(
            "get_terrain needs get_mujoco_model to return a mujoco.MjSpec (ksim.terrain.load_mujoco_spec), so the "
            "terrain is added before the model compiles"
        )
    compiled = terrain.compile(model)
    terrain.check_model(compiled, uses_mjx=True)
    return compiled


@dataclass(frozen=True)
class TerrainUse:
    """A task's terrain, its curriculum and its evaluation tile (level, column: None spreads the episodes over
    the terrain types); `spawn_jitter`: how far spawns may move around a tile's centre (m)."""

    terrain: Terrain | None
    curriculum: TerrainCurriculum | None
    eval_level: int
    eval_column: int | None
    spawn_jitter: float
    base_body: int
    episode_s: float  # the time limit of an episode, which the curriculum compares walked distances against

    def first_cells(self, env_keys: Array, env_offset: Array) -> TerrainCells:
        """The tiles of a shard's envs (global index `env_offset` onwards) before their first episodes."""
        num_envs = env_keys.shape[0]
        if self.terrain is None:
            return TerrainCells(level=jnp.zeros(num_envs, jnp.int32), column=jnp.zeros(num_envs, jnp.int32))
        start_level = 0 if self.curriculum is None else self.curriculum.max_start_level
        env_index = env_offset + jnp.arange(num_envs)
        return initial_cells(env_index, env_keys, len(self.terrain.grid.types), start_level)

    def next_cells(
        self, cells: TerrainCells, reset_key: Array, episodes_started: Array, ended_episode: Episode, ended: Array
    ) -> TerrainCells:
        """The curriculum's step: the tiles of envs whose episode ended move by the curriculum's rule."""
        if self.terrain is None or self.curriculum is None:
            return cells
        grid, curriculum = self.terrain.grid, self.curriculum
        base_xy = ended_episode.data.xpos[:, self.base_body, :2]
        walked = jnp.linalg.norm(base_xy - self.terrain.origin(cells), axis=-1)
        commanded = jnp.linalg.norm(ended_episode.command[:, :2], axis=-1) * self.episode_s
        keys = jax.vmap(lambda key, count: jax.random.fold_in(jax.random.fold_in(key, count), 2))(
            reset_key, episodes_started
        )
        advance = functools.partial(curriculum.next_level, tile_size=grid.tile_size, num_levels=grid.num_levels)
        level = jax.vmap(advance)(cells.level, walked, commanded, keys)
        return cells.replace(level=jnp.where(ended, level, cells.level))


def terrain_use(
    terrain: Terrain | None,
    curriculum: TerrainCurriculum | None,
    command: Command | None,
    engine: PhysicsEngine,
    config: RLConfig,
    episode_steps: int,
) -> TerrainUse:
    """ConfigError for a curriculum without a terrain or velocity command, or an eval tile off the grid."""
    episode_s = episode_steps * config.ctrl_dt
    base_body = engine.layout.base_body
    if terrain is None:
        if curriculum is not None:
            raise ConfigError("get_terrain_curriculum needs a terrain (get_terrain returns None)")
        return TerrainUse(None, None, config.eval_terrain_level, None, 0.0, base_body, episode_s)
    grid = terrain.grid
    if curriculum is not None:
        curriculum.check(grid)
        if not isinstance(command, VelocityCommand):
            raise ConfigError(
                "get_terrain_curriculum needs a velocity command (get_command returning VelocityCommand): an env "
                "moves down when it walks less than its command asked"
            )
    level = config.eval_terrain_level
    if not -1 <= level < grid.num_levels:
        raise ConfigError(f"eval_terrain_level={level} must be -1 (the middle level) or in [0, {grid.num_levels})")
    kind = config.eval_terrain_type
    if kind and kind not in grid.types:
        raise ConfigError(
            f"eval_terrain_type={kind!r} must be empty or one of the terrain's types: " + ", ".join(grid.types)
        )
    spawn_jitter = terrain.spawn_jitter(engine.mj_model, engine.default_qpos, base_body)
    eval_level = level if level >= 0 else grid.num_levels // 2
    eval_column = grid.types.index(kind) if kind else None
    return TerrainUse(terrain, curriculum, eval_level, eval_column, spawn_jitter, base_body, episode_s)
