"""Triangle meshes of MuJoCo geoms in their own frames, and their colors: what a 3D viewer draws.

Every geom type becomes vertices (n, 3) and faces (m, 3) from `geom_size` as MuJoCo reads it: half-sizes
for boxes, radius and half-length for capsules and cylinders, radii for ellipsoids, half-extents for planes
(0: infinite, drawn `INFINITE_PLANE_HALF_SIZE` wide), the model's own vertices for meshes.
"""

from __future__ import annotations

from typing import NamedTuple

import mujoco
import numpy as np

INFINITE_PLANE_HALF_SIZE = 50.0
DEFAULT_GEOM_RGBA = (0.5, 0.5, 0.5, 1.0)  # MuJoCo's geom rgba when the model sets none
VISIBLE_BY_DEFAULT = (0, 1, 2)  # the geom groups MuJoCo's own viewer and renderer show unless told otherwise
NUM_GEOM_GROUPS = 6


class GeomMesh(NamedTuple):
    vertices: np.ndarray  # (n, 3) float32, in the geom's frame
    faces: np.ndarray  # (m, 3) uint32


def _ring(radius: float, z: float, segments: int) -> np.ndarray:
    angles = np.linspace(0.0, 2 * np.pi, segments, endpoint=False)
    return np.stack([radius * np.cos(angles), radius * np.sin(angles), np.full(segments, z)], axis=1)


def _stitch_rings(num_rings: int, segments: int) -> np.ndarray:
    """Faces joining ring k to ring k + 1 (each `segments` vertices, stored one ring after another)."""
    faces = []
    for ring in range(num_rings - 1):
        for i in range(segments):
            a, b = ring * segments + i, ring * segments + (i + 1) % segments
            faces += [(a, b, a + segments), (b, b + segments, a + segments)]
    return np.asarray(faces, dtype=np.uint32).reshape(-1, 3)


def _cap(center: int, ring_start: int, segments: int, upward: bool) -> np.ndarray:
    faces = [(center, ring_start + i, ring_start + (i + 1) % segments) for i in range(segments)]
    faces_array = np.asarray(faces, dtype=np.uint32)
    return faces_array if upward else faces_array[:, ::-1]


def capsule_mesh(radius: float, half_length: float, segments: int = 24, rings: int = 6) -> GeomMesh:
    """A capsule along z (a sphere when `half_length` is 0): two hemispheres moved apart by the cylinder."""
    upper = np.linspace(np.pi / 2, 0.0, rings + 1)[1:]  # pole excluded: caps close the ends
    lower = -upper[::-1]
    rings_xyz = [_ring(radius * np.cos(a), radius * np.sin(a) + half_length, segments) for a in upper]
    rings_xyz += [_ring(radius * np.cos(a), radius * np.sin(a) - half_length, segments) for a in lower]
    rings_xyz.reverse()  # bottom to top
    ring_vertices = np.concatenate(rings_xyz)
    poles = np.asarray([[0.0, 0.0, -radius - half_length], [0.0, 0.0, radius + half_length]])
    vertices = np.concatenate([ring_vertices, poles])
    bottom, top = len(ring_vertices), len(ring_vertices) + 1
    last_ring = (len(rings_xyz) - 1) * segments
    faces = np.concatenate(
        [
            _stitch_rings(len(rings_xyz), segments),
            _cap(bottom, 0, segments, upward=False),
            _cap(top, last_ring, segments, upward=True),
        ]
    )
    return GeomMesh(vertices.astype(np.float32), faces)


def cylinder_mesh(radius: float, half_length: float, segments: int = 24) -> GeomMesh:
    rings = np.concatenate([_ring(radius, -half_length, segments), _ring(radius, half_length, segments)])
    centers = np.asarray([[0.0, 0.0, -half_length], [0.0, 0.0, half_length]])
    vertices = np.concatenate([rings, centers])
    faces = np.concatenate(
        [
            _stitch_rings(2, segments),
            _cap(2 * segments, 0, segments, upward=False),
            _cap(2 * segments + 1, segments, segments, upward=True),
        ]
    )
    return GeomMesh(vertices.astype(np.float32), faces)


def box_mesh(half_sizes: np.ndarray) -> GeomMesh:
    corners = np.asarray([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=np.float32)
    # Two outward-facing triangles per side; corner index = 4*(x>0) + 2*(y>0) + (z>0).
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    faces = [(a, b, c) for a, b, c, _ in quads] + [(a, c, d) for a, _, c, d in quads]
    return GeomMesh(corners * np.asarray(half_sizes, dtype=np.float32), np.asarray(faces, dtype=np.uint32))


def plane_mesh(half_x: float, half_y: float) -> GeomMesh:
    half_x, half_y = half_x or INFINITE_PLANE_HALF_SIZE, half_y or INFINITE_PLANE_HALF_SIZE
    vertices = np.asarray([[-half_x, -half_y, 0], [half_x, -half_y, 0], [half_x, half_y, 0], [-half_x, half_y, 0]])
    return GeomMesh(vertices.astype(np.float32), np.asarray([(0, 1, 2), (0, 2, 3)], dtype=np.uint32))


def model_mesh(mj_model: mujoco.MjModel, mesh_id: int) -> GeomMesh:
    """A mesh asset's vertices and faces (MuJoCo stores them in the geom's frame)."""
    first_vert, num_vert = mj_model.mesh_vertadr[mesh_id], mj_model.mesh_vertnum[mesh_id]
    first_face, num_face = mj_model.mesh_faceadr[mesh_id], mj_model.mesh_facenum[mesh_id]
    vertices = mj_model.mesh_vert[first_vert : first_vert + num_vert]
    faces = mj_model.mesh_face[first_face : first_face + num_face]
    return GeomMesh(np.asarray(vertices, dtype=np.float32), np.asarray(faces, dtype=np.uint32))


def geom_mesh(mj_model: mujoco.MjModel, geom_id: int) -> GeomMesh | None:
    """The geom's surface in its own frame; None for types with no surface to draw (height fields, SDFs)."""
    kind, size = mujoco.mjtGeom(mj_model.geom_type[geom_id]), mj_model.geom_size[geom_id]
    if kind == mujoco.mjtGeom.mjGEOM_PLANE:
        return plane_mesh(float(size[0]), float(size[1]))
    if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
        return capsule_mesh(float(size[0]), 0.0)
    if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
        return capsule_mesh(float(size[0]), float(size[1]))
    if kind == mujoco.mjtGeom.mjGEOM_ELLIPSOID:
        sphere = capsule_mesh(1.0, 0.0)
        return GeomMesh(sphere.vertices * size.astype(np.float32), sphere.faces)
    if kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
        return cylinder_mesh(float(size[0]), float(size[1]))
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        return box_mesh(size)
    if kind == mujoco.mjtGeom.mjGEOM_MESH and mj_model.geom_dataid[geom_id] >= 0:
        return model_mesh(mj_model, int(mj_model.geom_dataid[geom_id]))
    return None


def texture_mean_rgb(mj_model: mujoco.MjModel, texture: int) -> np.ndarray:
    """A texture's average color in [0, 1] (a checker floor drawn in one color is still a floor)."""
    channels = int(mj_model.tex_nchannel[texture])
    size = int(mj_model.tex_width[texture] * mj_model.tex_height[texture] * channels)
    start = int(mj_model.tex_adr[texture])
    pixels = np.asarray(mj_model.tex_data[start : start + size], dtype=np.float64).reshape(-1, channels)
    return pixels[:, :3].mean(axis=0) / 255.0 if channels >= 3 else np.repeat(pixels.mean() / 255.0, 3)


def geom_rgba(mj_model: mujoco.MjModel, geom_id: int) -> np.ndarray:
    """The geom's color as MuJoCo draws it: its material's (tinted by the texture's average color) unless the
    geom sets its own rgba."""
    rgba = np.asarray(mj_model.geom_rgba[geom_id], dtype=np.float64)
    material = int(mj_model.geom_matid[geom_id])
    if material < 0 or not np.allclose(rgba, DEFAULT_GEOM_RGBA):
        return rgba
    rgba = np.asarray(mj_model.mat_rgba[material], dtype=np.float64).copy()
    texture = int(mj_model.mat_texid[material, int(mujoco.mjtTextureRole.mjTEXROLE_RGB)])
    if texture >= 0:
        rgba[:3] *= texture_mean_rgb(mj_model, texture)
    return rgba
