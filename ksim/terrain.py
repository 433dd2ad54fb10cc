"""Rough terrain: one heightfield made of a grid of tiles, a curriculum over its rows, and height lookups.

A task's `get_terrain()` returns a `TerrainGrid` (settings); `build()` turns it into a `Terrain`: a height
array deterministic from the seed, laid out as `num_levels` rows of rising difficulty along world y and one
column per terrain type along world x, inside a flat border: a robot walking forward (+x) stays on its level
and meets every type. Every tile has a flat square at its centre (`platform_size`) where envs spawn, so a spawn
never starts in penetration whatever the tile, and every tile's outer ring is at height 0, so tiles meet flush.

`Terrain.add_to(spec)` puts the whole grid into the task's model as *one* heightfield geom (MJX checks every
heightfield x geom pair at every physics step, with no broadphase), replacing the world's plane geoms, so
every physics implementation steps the same terrain. `Terrain.height_at` looks heights up in the same array
on MuJoCo's own triangulation of each grid cell (`mjx.ray` does not hit heightfields): what the height scan,
terrain-relative terminations and spawns use.

The curriculum (`TerrainCurriculum`) keeps each env's tile (`TerrainCells`: level and column, leading env
axis) in the env state; at each episode's end the env moves up a level if it walked more than half a tile,
down if it walked less than `down_fraction` of what its velocity command asked, to a random level past the
top, never below 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct

from ksim.config import ConfigError
from ksim.engine import ModelLayout, asset_path

Array = jax.Array

TERRAIN_TYPES = ("flat", "rough", "slope_up", "slope_down", "stairs_up", "stairs_down")
# Geom types MJX collides with a heightfield (mujoco/mjx collision_driver: hfield x sphere, capsule, box, mesh).
MJX_HFIELD_PARTNERS = {
    int(mujoco.mjtGeom.mjGEOM_SPHERE): "sphere",
    int(mujoco.mjtGeom.mjGEOM_CAPSULE): "capsule",
    int(mujoco.mjtGeom.mjGEOM_BOX): "box",
    int(mujoco.mjtGeom.mjGEOM_MESH): "mesh",
}
TERRAIN_GEOM = "terrain"


def free_base_position(layout: ModelLayout) -> np.ndarray:
    """The qpos indices of the base's free-joint position (x, y, z); a terrain spawns only such robots."""
    free = [
        j for j in layout.root_joints if len(layout.joint_qpos[j]) == 7 and layout.joint_body[j] == layout.base_body
    ]
    if not free:
        base = layout.body_names[layout.base_body]
        raise ConfigError(f"a terrain needs a free base to spawn on its tiles; the base body {base!r} has none")
    return np.asarray(layout.joint_qpos[free[0]][:3], dtype=np.int32)


def height_above_ground(terrain: Terrain | None, pos: Array) -> Array:
    """Height of world points `pos` (..., 3) above the terrain (above z = 0 without one)."""
    return pos[..., 2] if terrain is None else pos[..., 2] - terrain.height_at(pos[..., :2])


def load_mujoco_spec(path: str | Path) -> mujoco.MjSpec:
    """An MJCF file as an `MjSpec` (a bare file name is looked up in ksim's assets), for tasks with a terrain."""
    return mujoco.MjSpec.from_file(str(asset_path(path)))


@dataclass(frozen=True)
class TerrainGrid:
    """The terrain's settings; defaults follow mjlab and legged_gym (8 m tiles, 10 levels, 0.1 m grid)."""

    tile_size: float = 8.0  # m, each square tile's side
    num_levels: int = 10  # rows of rising difficulty (along world y)
    types: tuple[str, ...] = TERRAIN_TYPES  # one column per entry (along world x)
    resolution: float = 0.1  # m between heightfield samples
    border: float = 4.0  # m of flat ground around the grid
    platform_size: float = 2.0  # m, the flat square at each tile's centre where envs spawn
    max_roughness: float = 0.08  # m, half-range of the random heights at the top level ("rough")
    max_slope: float = 0.4  # rise over run at the top level ("slope_*")
    max_step_height: float = 0.15  # m at the top level ("stairs_*"), from 0.02 m at level 0
    step_width: float = 0.3  # m
    seed: int = 0

    def check(self) -> None:
        """ConfigError naming the setting and the rule (before anything compiles)."""
        for name in ("tile_size", "resolution", "num_levels", "platform_size", "step_width"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TerrainGrid.{name}={getattr(self, name)} must be positive")
        for name in ("border", "max_roughness", "max_slope", "max_step_height"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TerrainGrid.{name}={getattr(self, name)} must be >= 0")
        if not self.types:
            raise ConfigError("TerrainGrid.types is empty; name one or more of " + ", ".join(TERRAIN_TYPES))
        unknown = [t for t in self.types if t not in TERRAIN_TYPES]
        if unknown:
            raise ConfigError(f"TerrainGrid.types: unknown {unknown}; the types are " + ", ".join(TERRAIN_TYPES))
        if self.platform_size > self.tile_size:
            raise ConfigError(
                f"TerrainGrid.platform_size={self.platform_size} must be <= tile_size={self.tile_size} "
                "(the spawn patch lies inside its tile)"
            )
        if self.tile_size < 2 * self.resolution:
            raise ConfigError(f"TerrainGrid.tile_size={self.tile_size} must span >= 2 samples of {self.resolution}")

    def build(self) -> Terrain:
        self.check()
        return Terrain(self, generate_heights(self))

    @property
    def samples_per_tile(self) -> int:
        return round(self.tile_size / self.resolution)

    @property
    def border_samples(self) -> int:
        return round(self.border / self.resolution)

    def difficulty(self, level: int) -> float:
        return level / (self.num_levels - 1) if self.num_levels > 1 else 1.0


def _chebyshev_from_centre(n: int, resolution: float) -> np.ndarray:
    """(n, n) distance (max norm) of each sample of a tile from the tile's centre, in m."""
    offsets = (np.arange(n) - (n - 1) / 2) * resolution
    return np.maximum(np.abs(offsets)[:, None], np.abs(offsets)[None, :])


def tile_heights(grid: TerrainGrid, kind: str, level: int, rng: np.random.Generator) -> np.ndarray:
    """One tile's (n, n) heights, shaped by `kind` at `level`'s difficulty: flat on the centre platform, 0 on
    the outer ring. `*_up` tiles are pits the robot climbs out of, `*_down` tiles hills it walks down from."""
    n, difficulty = grid.samples_per_tile, grid.difficulty(level)
    outside = np.maximum(_chebyshev_from_centre(n, grid.resolution) - grid.platform_size / 2, 0.0)
    if kind == "flat":
        return np.zeros((n, n))
    if kind == "rough":
        amplitude = grid.max_roughness * (0.25 + 0.75 * difficulty)
        return np.where(outside > 0, rng.uniform(-amplitude, amplitude, (n, n)), 0.0)
    if kind.startswith("slope"):
        rise = grid.max_slope * difficulty * outside
    else:
        step_height = 0.02 + (grid.max_step_height - 0.02) * difficulty
        rise = np.ceil(outside / grid.step_width - 1e-9) * step_height  # 1e-9: a ring at k widths is k steps
    return rise - rise.max() if kind.endswith("_up") else rise.max() - rise


def generate_heights(grid: TerrainGrid) -> np.ndarray:
    """The whole field's heights, (y samples, x samples): levels along y, types along x, a flat border."""
    n, b = grid.samples_per_tile, grid.border_samples
    heights = np.zeros((grid.num_levels * n + 2 * b, len(grid.types) * n + 2 * b))
    rng = np.random.default_rng(grid.seed)
    for column, kind in enumerate(grid.types):
        for level in range(grid.num_levels):
            rows, cols = slice(b + level * n, b + (level + 1) * n), slice(b + column * n, b + (column + 1) * n)
            heights[rows, cols] = tile_heights(grid, kind, level, rng)
    return heights


class TerrainCells(struct.PyTreeNode):
    """Each env's tile: its level (row of difficulty) and column (terrain type); leading env axis."""

    level: Array  # int32
    column: Array  # int32


@dataclass(frozen=True, eq=False)
class Terrain:
    """A built terrain: its settings and heights (y samples, x samples), centred on the world origin."""

    grid: TerrainGrid
    raw_heights: np.ndarray = field(repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.raw_heights.shape
        return int(rows), int(cols)

    @property
    def half_extent(self) -> tuple[float, float]:
        """(x, y) half sizes of the field, m: MuJoCo's hfield size[0:2]."""
        rows, cols = self.shape
        return (cols - 1) * self.grid.resolution / 2, (rows - 1) * self.grid.resolution / 2

    @property
    def lowest(self) -> float:
        return float(self.raw_heights.min())

    @property
    def elevation_range(self) -> float:
        return max(float(self.raw_heights.max()) - self.lowest, 1e-3)

    @property
    def normalized(self) -> np.ndarray:
        """The heights as MuJoCo keeps them: float32 in [0, 1] times the elevation range, above the lowest."""
        return ((self.raw_heights - self.lowest) / self.elevation_range).astype(np.float32)

    @property
    def heights(self) -> np.ndarray:
        """The heights the physics sees (MuJoCo's float32 rounding included), m."""
        return self.lowest + self.normalized.astype(np.float64) * self.elevation_range

    def add_to(self, spec: mujoco.MjSpec) -> None:
        """Adds the heightfield geom `terrain` to the world, in place of the world's plane geoms (whose contact
        bits, friction and material it takes; contype = conaffinity = 1 without a plane)."""
        planes = [g for g in spec.worldbody.geoms if g.type == mujoco.mjtGeom.mjGEOM_PLANE]
        rows, cols = self.shape
        half_x, half_y = self.half_extent
        spec.add_hfield(
            name=TERRAIN_GEOM,
            size=[half_x, half_y, self.elevation_range, 0.5],
            nrow=rows,
            ncol=cols,
            userdata=self.normalized.ravel().tolist(),
        )
        geom = spec.worldbody.add_geom(
            name=TERRAIN_GEOM,
            type=mujoco.mjtGeom.mjGEOM_HFIELD,
            hfieldname=TERRAIN_GEOM,
            pos=[0.0, 0.0, self.lowest],
        )
        if planes:
            plane = planes[0]
            geom.contype, geom.conaffinity, geom.condim = plane.contype, plane.conaffinity, plane.condim
            geom.friction, geom.material = plane.friction, plane.material
        for plane in planes:
            spec.delete(plane)

    def compile(self, spec: mujoco.MjSpec) -> mujoco.MjModel:
        self.add_to(spec)
        return spec.compile()

    @property
    def origins(self) -> np.ndarray:
        """(num_levels, num columns, 2) world xy of each tile's centre."""
        grid, (half_x, half_y) = self.grid, self.half_extent
        n, b = grid.samples_per_tile, grid.border_samples
        centre = (n - 1) / 2
        x = -half_x + (b + np.arange(len(grid.types)) * n + centre) * grid.resolution
        y = -half_y + (b + np.arange(grid.num_levels) * n + centre) * grid.resolution
        return np.stack(np.meshgrid(x, y, indexing="xy"), axis=-1)

    def origin(self, cells: TerrainCells) -> Array:
        """World xy of the centres of `cells`' tiles (any leading shape)."""
        return jnp.asarray(self.origins, jnp.float32)[cells.level, cells.column]

    def height_at(self, xy: Array) -> Array:
        """Terrain heights at world points `xy` (..., 2), on MuJoCo's triangles: each grid cell is split along
        the diagonal from sample (r, c) to (r + 1, c + 1). Points off the field take the height at its edge."""
        heights = jnp.asarray(self.heights, jnp.float32)
        rows, cols = self.shape
        half_x, half_y = self.half_extent
        u = (xy[..., 0] + half_x) / self.grid.resolution
        v = (xy[..., 1] + half_y) / self.grid.resolution
        c = jnp.clip(jnp.floor(u), 0, cols - 2).astype(jnp.int32)
        r = jnp.clip(jnp.floor(v), 0, rows - 2).astype(jnp.int32)
        fu, fv = jnp.clip(u - c, 0.0, 1.0), jnp.clip(v - r, 0.0, 1.0)
        h00, h01, h10, h11 = heights[r, c], heights[r, c + 1], heights[r + 1, c], heights[r + 1, c + 1]
        below_diagonal = h00 + fu * (h01 - h00) + fv * (h11 - h01)  # triangle (r, c), (r, c+1), (r+1, c+1)
        above_diagonal = h00 + fv * (h10 - h00) + fu * (h11 - h10)  # triangle (r, c), (r+1, c), (r+1, c+1)
        return jnp.where(fu >= fv, below_diagonal, above_diagonal)

    def spawn_offset(self, cells: TerrainCells, rng: Array, jitter: float) -> Array:
        """World (x, y, z) to add to a default pose around the origin: the tile's centre, moved uniformly by up
        to `jitter` m in x and y (inside the flat platform), at the platform's height."""
        xy = self.origin(cells) + jax.random.uniform(rng, (2,), minval=-jitter, maxval=jitter)
        return jnp.concatenate([xy, self.height_at(xy)[None]])

    def check_model(self, mj_model: mujoco.MjModel, uses_mjx: bool) -> None:
        """Refuses a robot geom that can touch the terrain and that MJX cannot collide with a heightfield."""
        terrain = mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_GEOM, TERRAIN_GEOM)
        if not uses_mjx:
            return
        contype, conaffinity = mj_model.geom_contype[terrain], mj_model.geom_conaffinity[terrain]
        for geom in range(mj_model.ngeom):
            touches = (mj_model.geom_contype[geom] & conaffinity) | (mj_model.geom_conaffinity[geom] & contype)
            if geom == terrain or mj_model.geom_bodyid[geom] == 0 or not touches:
                continue
            kind = int(mj_model.geom_type[geom])
            if kind not in MJX_HFIELD_PARTNERS:
                name = mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_GEOM, geom) or f"#{geom}"
                type_name = mujoco.mjtGeom(kind).name.removeprefix("mjGEOM_").lower()
                raise ConfigError(
                    f"geom {name!r} ({type_name}) can touch the terrain, and MJX collides a heightfield only with "
                    f"{', '.join(MJX_HFIELD_PARTNERS.values())} geoms (change its type, or its contype/conaffinity)"
                )

    def spawn_jitter(self, mj_model: mujoco.MjModel, default_qpos: np.ndarray, base_body: int) -> float:
        """How far (m, in x and y) a spawn may move from the tile's centre with the robot inside the platform;
        ConfigError if the robot's footprint at its default pose does not fit the platform."""
        data = mujoco.MjData(mj_model)
        data.qpos[:] = default_qpos
        mujoco.mj_kinematics(mj_model, data)
        robot = mj_model.geom_bodyid != 0
        offsets = np.abs(data.geom_xpos[robot, :2] - data.xpos[base_body, :2]) + mj_model.geom_rbound[robot, None]
        footprint = 2 * float(offsets.max()) if robot.any() else 0.0
        if footprint > self.grid.platform_size:
            raise ConfigError(
                f"TerrainGrid.platform_size={self.grid.platform_size} must be >= the robot's spawn area "
                f"({footprint:.2f} m across at its default pose)"
            )
        return (self.grid.platform_size - footprint) / 2


@dataclass(frozen=True)
class TerrainCurriculum:
    """Moves each env between levels at its episode's end (see the module docstring)."""

    up_fraction: float = 0.5  # of a tile: walking farther moves up
    down_fraction: float = 0.5  # of the commanded distance: walking less moves down
    max_start_level: int = 0  # first episodes start on a level drawn from 0..max_start_level

    def check(self, grid: TerrainGrid) -> None:
        for name in ("up_fraction", "down_fraction"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TerrainCurriculum.{name}={getattr(self, name)} must be positive")
        if not 0 <= self.max_start_level < grid.num_levels:
            raise ConfigError(
                f"TerrainCurriculum.max_start_level={self.max_start_level} must be in [0, num_levels={grid.num_levels})"
            )

    def next_level(
        self, level: Array, walked: Array, commanded: Array, rng: Array, tile_size: float, num_levels: int
    ) -> Array:
        """One env's level after an episode that walked `walked` m from its tile's centre while its command
        asked for `commanded` m. Moving up wins when both rules hold; past the top a random level."""
        up = walked > self.up_fraction * tile_size
        down = (walked < self.down_fraction * commanded) & ~up
        moved = level + up.astype(level.dtype) - down.astype(level.dtype)
        wrapped = jax.random.randint(rng, (), 0, num_levels, dtype=level.dtype)
        return jnp.where(moved >= num_levels, wrapped, jnp.maximum(moved, 0))


def initial_cells(env_index: Array, keys: Array, num_columns: int, max_start_level: int) -> TerrainCells:
    """First tiles: column by global env index (every column as often, on any device count), level drawn from
    each env's key (the same on any device count)."""
    level = jax.vmap(lambda key: jax.random.randint(jax.random.fold_in(key, 7), (), 0, max_start_level + 1))(keys)
    return TerrainCells(level=level.astype(jnp.int32), column=(env_index % num_columns).astype(jnp.int32))
