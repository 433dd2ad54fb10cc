"""Offscreen rendering of a recorded episode with `mujoco.Renderer` (needs an OpenGL backend: MUJOCO_GL)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from ksim.geom_mesh import VISIBLE_BY_DEFAULT

REFERENCE_RGBA = (0.3, 0.8, 0.45, 0.35)


def scene_option(geom_groups: Sequence[int]) -> mujoco.MjvOption:
    """MuJoCo's drawing options with exactly `geom_groups` shown."""
    option = mujoco.MjvOption()
    option.geomgroup[:] = [group in geom_groups for group in range(len(option.geomgroup))]
    return option


def render_frames(
    mj_model: mujoco.MjModel,
    qpos: np.ndarray,
    width: int = 640,
    height: int = 480,
    geom_groups: Sequence[int] = VISIBLE_BY_DEFAULT,
    reference: np.ndarray | None = None,
) -> list[np.ndarray]:
    """One RGB frame per recorded qpos, from the model's `track` camera when it has one (else one that follows its
    first body); with `reference` (a qpos per frame), a translucent copy of the robot in that pose beside it."""
    data, ghost = mujoco.MjData(mj_model), mujoco.MjData(mj_model)
    option = scene_option(geom_groups)
    camera = "track" if mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_CAMERA, "track") >= 0 else following(mj_model)
    frames = []
    with mujoco.Renderer(mj_model, height=height, width=width) as renderer:
        for index, pose in enumerate(qpos):
            data.qpos[:] = pose
            mujoco.mj_forward(mj_model, data)
            renderer.update_scene(data, camera=camera, scene_option=option)
            if reference is not None:
                ghost.qpos[:] = reference[index]
                add_ghost(mj_model, ghost, option, renderer.scene)
            frames.append(renderer.render().copy())
    return frames


def following(mj_model: mujoco.MjModel) -> mujoco.MjvCamera:
    """A camera that follows the model's first body from the side and a little above, as far off as MuJoCo's own
    free camera starts."""
    camera = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(mj_model, camera)
    camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
    camera.trackbodyid = 1 if mj_model.nbody > 1 else 0
    camera.azimuth, camera.elevation = 135.0, -15.0
    return camera


def add_ghost(mj_model: mujoco.MjModel, data: mujoco.MjData, option: mujoco.MjvOption, scene: mujoco.MjvScene) -> None:
    """The robot's geoms in `data`'s pose added to `scene`, green and translucent."""
    mujoco.mj_kinematics(mj_model, data)
    first = scene.ngeom
    mujoco.mjv_addGeoms(mj_model, data, option, mujoco.MjvPerturb(), int(mujoco.mjtCatBit.mjCAT_DYNAMIC), scene)
    for index in range(first, scene.ngeom):
        scene.geoms[index].rgba[:] = REFERENCE_RGBA


def write_video(
    mj_model: mujoco.MjModel,
    qpos: np.ndarray,
    ctrl_dt: float,
    path: str | Path,
    size: tuple[int, int] = (640, 480),
    geom_groups: Sequence[int] = VISIBLE_BY_DEFAULT,
    reference: np.ndarray | None = None,
) -> Path:
    """Writes an .mp4 (through imageio-ffmpeg) or .gif of the episode at real-time speed; `size` is (width, height);
    `reference`: a pose per frame drawn as a translucent copy of the robot (a motion's reference)."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames: list[Any] = render_frames(mj_model, np.asarray(qpos), *size, geom_groups, reference)
    fps = 1.0 / ctrl_dt
    if path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return path
