"""Rough terrain: height lookup against MuJoCo's ray, resting contact under each physics, spawns, the curriculum
rule under jit and pmap, a train step on 1 and 2 devices, and the refusals."""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from helpers import BALL_MOTOR, BALL_XML, DistributedBallTask, distributed_ball_config
from mujoco import mjx

from examples.quadruped import DEFAULT_CONFIG, FEET, QuadrupedTask
from ksim import observations as obs
from ksim.commands import Command, VelocityCommand
from ksim.config import ConfigError
from ksim.physics import create_engine
from ksim.physics.mjx_contract import collision_pairs
from ksim.task.rl import TrainState
from ksim.terrain import Terrain, TerrainCells, TerrainCurriculum, TerrainGrid, free_base_position

# An asymmetric field: 3 levels along y, 2 types along x, tiles with rough and stepped parts.
GRID = TerrainGrid(
    tile_size=1.6,
    num_levels=3,
    types=("rough", "stairs_up"),
    resolution=0.2,
    border=0.4,
    platform_size=1.0,
    max_roughness=0.05,
    max_step_height=0.1,
    step_width=0.2,
    seed=5,
)


def terrain_model(terrain: Terrain, bodies: str = "") -> mujoco.MjModel:
    spec = mujoco.MjSpec.from_string(
        f'<mujoco><worldbody><geom name="floor" type="plane" size="9 9 0.1"/>{bodies}</worldbody></mujoco>'
    )
    return terrain.compile(spec)


@pytest.fixture(scope="module")
def terrain() -> Terrain:
    return GRID.build()


def test_height_lookup_agrees_with_mj_ray(terrain: Terrain) -> None:
    model = terrain_model(terrain)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    half_x, half_y = terrain.half_extent
    rng = np.random.default_rng(0)
    x_seams = [(-half_x + (2 + 8 * k - s) * 0.2, y) for k in range(3) for s in (0, 1) for y in (-0.3, 0.71)]
    y_seams = [(x, -half_y + (2 + 8 * k - s) * 0.2) for k in range(4) for s in (0, 1) for x in (-0.3, 0.71)]
    seams = x_seams + y_seams
    edges = [(-half_x, -half_y), (half_x, half_y), (half_x, -half_y + 0.05), (-half_x + 0.05, half_y)]
    points = np.concatenate([rng.uniform([-half_x, -half_y], [half_x, half_y], (500, 2)), seams, edges])
    geom = np.zeros(1, np.int32)
    from_ray = [
        5.0 - mujoco.mj_ray(model, data, np.array([x, y, 5.0]), np.array([0.0, 0.0, -1.0]), None, 1, -1, geom)
        for x, y in points
    ]
    looked_up = jax.jit(terrain.height_at)(jnp.asarray(points, jnp.float32))
    assert np.ptp(terrain.heights) > 0.1  # the field is not flat
    np.testing.assert_allclose(looked_up, from_ray, atol=1e-5)


def test_heights_are_deterministic_from_the_seed_flat_platforms_and_flush_seams(terrain: Terrain) -> None:
    np.testing.assert_array_equal(GRID.build().raw_heights, terrain.raw_heights)
    assert not np.array_equal(TerrainGrid(**{**GRID.__dict__, "seed": 6}).build().raw_heights, terrain.raw_heights)
    centres = jnp.asarray(terrain.origins.reshape(-1, 2), jnp.float32)
    corners = centres[:, None, :] + jnp.asarray([[0.0, 0.0], [-0.45, -0.45], [0.45, 0.45], [0.45, -0.45]])
    platforms = np.asarray(terrain.height_at(corners))
    np.testing.assert_allclose(platforms - platforms[:, :1], 0.0, atol=1e-6)  # each platform is flat
    stairs_up = platforms[terrain.origins.shape[1] * np.arange(3) + 1, 0]  # column 1, levels 0..2: pits
    np.testing.assert_allclose(stairs_up, [-0.02, -0.06, -0.1], atol=1e-6)  # one step of 0.02, 0.06, 0.1 m
    # Levels along y, types along x, and every tile's outer ring at 0: neighbours meet without a step.
    assert terrain.origins[1, 0, 1] > terrain.origins[0, 0, 1] and terrain.origins[0, 1, 0] > terrain.origins[0, 0, 0]
    n, b = GRID.samples_per_tile, GRID.border_samples
    stairs = terrain.raw_heights[:, b + n : b + 2 * n]
    np.testing.assert_array_equal(stairs[b + n - 1 : b + n + 1], 0.0)  # the seam between levels 0 and 1


SPHERE = '<body name="ball" pos="{x} {y} 0.5"><freejoint/><geom type="sphere" size="0.1" mass="1"/></body>'


def settle_mujoco(model: mujoco.MjModel, steps: int) -> np.ndarray:
    data = mujoco.MjData(model)
    mujoco.mj_step(model, data, steps)
    return data.qpos.copy()


def settle_mjx(model: mujoco.MjModel, steps: int) -> np.ndarray:
    mjx_model = mjx.put_model(model)

    @jax.jit
    def run(data: mjx.Data) -> mjx.Data:
        return jax.lax.fori_loop(0, steps, lambda _, data: mjx.step(mjx_model, data), data)

    return np.asarray(run(mjx.make_data(mjx_model)).qpos)


def settle_native(model: mujoco.MjModel, steps: int) -> np.ndarray:
    """ksim's native engine (physics_impl=mujoco), control steps of 10 physics steps."""
    dt = float(model.opt.timestep)
    engine = create_engine(model, ctrl_dt=10 * dt, dt=dt, physics_impl="mujoco")
    data = engine.make_data(jnp.asarray(model.qpos0, jnp.float32), jnp.zeros(model.nv))
    step = jax.jit(lambda data: engine.step(data, lambda _: jnp.zeros(model.nu))[0])
    for _ in range(steps // 10):
        data = step(data)
    return np.asarray(data.qpos)


PHYSICS: dict[str, Callable[[mujoco.MjModel, int], np.ndarray]] = {
    "mujoco": settle_mujoco,
    "mjx": settle_mjx,
    "ksim-native": settle_native,
}


@pytest.mark.parametrize("physics", list(PHYSICS))
def test_dropped_sphere_rests_on_the_surface(terrain: Terrain, physics: str) -> None:
    x, y = terrain.origins[2, 0] + 0.6  # off the platform, on the rough part of the hardest rough tile
    model = terrain_model(terrain, SPHERE.format(x=x, y=y))
    model.opt.timestep = 0.005
    qpos = PHYSICS[physics](model, 300)
    assert np.all(np.isfinite(qpos))
    ground = float(terrain.height_at(jnp.asarray(qpos[:2], jnp.float32)))
    assert abs(ground) > 0.005  # a point where the terrain is not at z = 0
    assert qpos[2] - ground == pytest.approx(0.1, abs=0.02)  # radius 0.1 above the surface below its centre


CASES = {  # (level, walked m, commanded m) -> level after the episode; tiles 1.6 m, 3 levels
    "up": ((1, 1.0, 1.0), 2),
    "down": ((1, 0.2, 1.0), 0),
    "stay": ((1, 0.5, 0.8), 1),
    "both: up wins": ((1, 0.9, 3.0), 2),
    "clip at 0": ((0, 0.1, 1.0), 0),
}


def test_curriculum_rule_cases_under_jit_and_pmap() -> None:
    curriculum, grid = TerrainCurriculum(), GRID
    inputs = np.asarray([case for case, _ in CASES.values()] * 2, np.float32)
    expected = np.asarray([result for _, result in CASES.values()] * 2)
    keys = jax.random.split(jax.random.PRNGKey(0), len(inputs))

    def rule(level: jax.Array, walked: jax.Array, commanded: jax.Array, key: jax.Array) -> jax.Array:
        return curriculum.next_level(level, walked, commanded, key, grid.tile_size, grid.num_levels)

    level = jnp.asarray(inputs[:, 0], jnp.int32)
    jitted = jax.jit(jax.vmap(rule))(level, inputs[:, 1], inputs[:, 2], keys)
    shard = lambda x: jnp.reshape(x, (2, -1, *x.shape[1:]))  # noqa: E731
    pmapped = jax.pmap(jax.vmap(rule), devices=jax.devices()[:2])(
        shard(level), shard(inputs[:, 1]), shard(inputs[:, 2]), shard(keys)
    )
    np.testing.assert_array_equal(jitted, expected)
    np.testing.assert_array_equal(np.reshape(pmapped, -1), expected)
    # Past the top: a random level, every level reachable.
    top = jax.vmap(rule)(jnp.full(64, 2), jnp.full(64, 1.0), jnp.full(64, 1.0), jax.random.split(keys[0], 64))
    assert set(np.asarray(top).tolist()) == {0, 1, 2}


class TerrainBallTask(DistributedBallTask):
    """The test ball (a 0.2 m sphere with an arm) on GRID with the curriculum and a height scan."""

    def get_mujoco_model(self) -> mujoco.MjSpec:  # type: ignore[override]
        return mujoco.MjSpec.from_string(BALL_XML.format(root='<freejoint name="root"/>', actuator=BALL_MOTOR))

    def get_terrain(self) -> TerrainGrid | None:
        return GRID

    def get_terrain_curriculum(self) -> TerrainCurriculum | None:
        return TerrainCurriculum(max_start_level=1)

    def get_command(self) -> Command | None:
        return VelocityCommand(forward=(2.0, 2.0), lateral=(0.0, 0.0), yaw_rate=(0.0, 0.0), zero_probability=0.0)

    def get_observations(self) -> Sequence[obs.Observation]:
        assert self.terrain is not None
        return [*super().get_observations(), obs.HeightScan(self.terrain, size=(0.4, 0.4), spacing=0.2, noise=0.01)]


def ball_on_terrain(**overrides: object) -> TerrainBallTask:
    return TerrainBallTask(distributed_ball_config(sim2real=False, num_envs=8, **overrides))


def merge_devices(tree: Any) -> Any:
    """(devices, envs per device, ...) leaves as (envs, ...)."""
    return jax.tree.map(lambda x: np.reshape(x, (x.shape[0] * x.shape[1], *x.shape[2:])), tree)


def train_step(num_devices: int) -> TrainState:
    task = ball_on_terrain(num_devices=num_devices)
    state, _ = task.train_step(task.init_train_state())
    return jax.device_get(state)


@pytest.fixture(scope="module")
def one_and_two_devices() -> tuple[TrainState, TrainState]:
    return train_step(1), train_step(2)


def test_spawns_are_on_the_platform_out_of_penetration(one_and_two_devices: tuple) -> None:
    task = ball_on_terrain(num_devices=1)
    terrain, engine = task.terrain, task.engine
    assert terrain is not None
    # Every tile, at random spots of its platform: no contact closer than touching, in MuJoCo's own collision.
    levels, columns = np.meshgrid(np.arange(GRID.num_levels), np.arange(len(GRID.types)), indexing="ij")
    cells = TerrainCells(level=jnp.tile(levels.ravel(), 20), column=jnp.tile(columns.ravel(), 20))
    keys = jax.random.split(jax.random.PRNGKey(1), len(cells.level))
    offsets = jax.jit(jax.vmap(lambda cell, key: terrain.spawn_offset(cell, key, task.environment.spawn_jitter)))(
        cells, keys
    )
    data = mujoco.MjData(engine.mj_model)
    for offset in np.asarray(offsets):
        data.qpos[:] = engine.default_qpos
        data.qpos[free_base_position(engine.layout)] += offset
        mujoco.mj_forward(engine.mj_model, data)
        assert data.ncon == 0 or data.contact.dist[: data.ncon].min() > -1e-4
    # The episodes the train step started (2 control steps ago) are on their tiles' platforms.
    env = merge_devices(one_and_two_devices[0].env)
    base_xy = np.asarray(env.current.data.xpos[:, engine.layout.base_body, :2])
    assert np.asarray(env.current.episode_length).max() == 2
    assert np.all(np.abs(base_xy - np.asarray(terrain.origin(env.terrain))) < task.environment.spawn_jitter + 0.05)


def test_train_step_on_one_and_two_devices_agrees(one_and_two_devices: tuple) -> None:
    one, two = (merge_devices(state.env) for state in one_and_two_devices)
    np.testing.assert_array_equal(one.terrain.level, two.terrain.level)
    np.testing.assert_array_equal(one.terrain.column, two.terrain.column)
    assert np.asarray(one.terrain.column).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]  # balanced on each device
    assert np.asarray(one.episodes_started).min() >= 2  # episodes ended: the curriculum ran
    assert np.asarray(one.terrain.level).max() < 2  # none walked half a tile in 6 steps: none moved up
    np.testing.assert_allclose(one.current.data.qpos, two.current.data.qpos, atol=1e-4)
    params_one, params_two = (state.shared.params for state in one_and_two_devices)
    for a, b in zip(jax.tree.leaves(params_one), jax.tree.leaves(params_two), strict=True):
        np.testing.assert_allclose(np.asarray(a)[0], np.asarray(b)[0], atol=1e-5)


def test_refusals_name_the_setting_and_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"TerrainGrid.resolution=0.0 must be positive"):
        TerrainGrid(resolution=0.0).build()
    with pytest.raises(ConfigError, match=r"platform_size=0.3 must be >= the robot's spawn area"):
        type(
            "Small",
            (TerrainBallTask,),
            {"get_terrain": lambda self: TerrainGrid(**{**GRID.__dict__, "platform_size": 0.3})},
        )(distributed_ball_config(sim2real=False, num_envs=8, num_devices=1))
    with pytest.raises(ConfigError, match=r"needs a velocity command"):
        type("NoCommand", (TerrainBallTask,), {"get_command": lambda self: None})(
            distributed_ball_config(sim2real=False, num_envs=8, num_devices=1)
        )
    cylinder = BALL_XML.replace('type="sphere" size="0.2"', 'type="cylinder" size="0.2 0.1"')
    with pytest.raises(ConfigError, match=r"geom 'ball' \(cylinder\) can touch the terrain.*sphere, capsule, box"):
        type(
            "Cylinder",
            (TerrainBallTask,),
            {
                "get_mujoco_model": lambda self: mujoco.MjSpec.from_string(
                    cylinder.format(root='<freejoint name="root"/>', actuator=BALL_MOTOR)
                )
            },
        )(distributed_ball_config(sim2real=False, num_envs=8, num_devices=1, physics_impl="jax"))


def test_rough_quadruped_touches_the_terrain_with_its_feet_only() -> None:
    task = QuadrupedTask(dataclasses.replace(DEFAULT_CONFIG, terrain="rough", num_devices=1))
    model = task.engine.mj_model
    terrain = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "terrain")
    assert mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "floor") == -1  # the terrain replaced the plane
    pairs = {tuple(sorted((g1, g2))) for g1, g2, _ in collision_pairs(model)}
    feet = sorted(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, foot) for foot in FEET)
    assert pairs == {tuple(sorted((terrain, foot))) for foot in feet}
    scan = next(o for o in task.components.observations if isinstance(o, obs.HeightScan))
    assert scan.points.shape == (11 * 7, 2)
    critic_scan = next(o for o in task.components.critic_observations or () if isinstance(o, obs.HeightScan))
    assert critic_scan.points.shape == scan.points.shape  # the critic sees it too (never noised)
    with pytest.raises(ConfigError, match=r"terrain='bumpy' must be 'flat' or 'rough'"):
        QuadrupedTask(dataclasses.replace(DEFAULT_CONFIG, terrain="bumpy"))
