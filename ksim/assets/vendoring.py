"""What the robots' vendor.py scripts share: reading binary STL meshes, their convex hulls, a capsule's lowest
point. Used only to write the bundled models (and kept for provenance); nothing in ksim imports it."""

from __future__ import annotations

import struct
from pathlib import Path

import mujoco
import numpy as np
from scipy.spatial import ConvexHull


def stl_vertices(path: Path) -> np.ndarray:
    """The vertices of a binary STL file."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 80)
    record = np.dtype([("normal", "<3f4"), ("v", "<9f4"), ("attr", "<u2")])
    records = np.frombuffer(data, dtype=record, count=count, offset=84)
    return records["v"].reshape(-1, 3).astype(np.float64)


def hull_vertices(points: np.ndarray, decimals: int, grid: float | None = None) -> np.ndarray:
    """The convex hull's vertices, rounded to `decimals`; with `grid` (m) the points are first snapped to a grid of
    that spacing, so near-duplicate hull vertices merge (the drawn shape moves by at most half the spacing)."""
    if grid is not None:
        points = np.unique(np.round(points / grid) * grid, axis=0)
    hull = ConvexHull(points)
    return np.round(points[hull.vertices], decimals)


def inline_hulls(spec: mujoco.MjSpec, mesh_dir: Path, decimals: int, grid: float | None = None) -> None:
    """Replaces every mesh file of `spec` by its convex hull's vertices, inline."""
    for mesh in spec.meshes:
        vertices = hull_vertices(stl_vertices(mesh_dir / mesh.file), decimals, grid)
        mesh.file = ""
        mesh.uservert = vertices.reshape(-1).tolist()


def lowest_capsule_point(model: mujoco.MjModel, data: mujoco.MjData, geom: int) -> float:
    """The lowest world z of a capsule geom."""
    radius, half = model.geom_size[geom, 0], model.geom_size[geom, 1]
    axis = data.geom_xmat[geom].reshape(3, 3)[:, 2]
    return float(data.geom_xpos[geom, 2] - abs(axis[2]) * half - radius)


def add_standing_key(
    spec: mujoco.MjSpec, model: mujoco.MjModel, qpos: np.ndarray, feet: list[int], name: str = "home"
) -> None:
    """Adds keyframe `name`: `qpos` (the compiled `model`'s layout) with the base lowered until the lowest of the
    capsule geoms `feet` touches z = 0."""
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    mujoco.mj_kinematics(model, data)
    qpos = qpos.copy()
    qpos[2] -= min(lowest_capsule_point(model, data, g) for g in feet)
    spec.add_key(name=name, qpos=qpos.tolist())
