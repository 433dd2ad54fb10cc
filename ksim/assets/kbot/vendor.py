"""Writes ksim/assets/kbot/kbot.xml from K-Bot's public model (../shared/robots/kbot, MIT); kept for provenance.

    .venv/bin/python ksim/assets/kbot/vendor.py ../shared/robots/kbot

What changes: the solver runs 3 iterations (6 line-search), not 100 (50); each visual STL mesh (23 files,
16 MB) becomes its convex hull's vertices, inline (MuJoCo draws the hull), so the robot still shows in the
viewer and videos while the asset stays small; the collision geoms (four foot capsules), joints, motors,
sensors and inertias are untouched. Added: a floor, a light, a `track` camera following the base, and the
`home` keyframe with upstream's standing pose, the base lowered until the feet touch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mujoco
import numpy as np

from ksim.assets.vendoring import add_standing_key, inline_hulls

# Upstream's standing pose, degrees (the robot's README): every other joint 0.
STANDING_DEG = {
    "dof_left_hip_pitch_04": 20.0,
    "dof_right_hip_pitch_04": -20.0,
    "dof_left_knee_04": 50.0,
    "dof_right_knee_04": -50.0,
    "dof_left_ankle_02": -30.0,
    "dof_right_ankle_02": 30.0,
    "dof_left_shoulder_roll_03": 10.0,
    "dof_right_shoulder_roll_03": -10.0,
    "dof_left_elbow_02": -90.0,
    "dof_right_elbow_02": 90.0,
}
HULL_DECIMALS = 4
# Cheap solver settings (only four capsules collide): MuJoCo's defaults (100 and 50) cost a third of the
# training throughput for no visible difference in the gait; ksim.sim2sim --iterations 100 checks a policy.
SOLVER_ITERATIONS, LINE_SEARCH_ITERATIONS = 3, 6


def vendor(source: Path) -> str:
    spec = mujoco.MjSpec.from_string((source / "robot.mjcf").read_text())
    inline_hulls(spec, source, HULL_DECIMALS)
    spec.option.iterations, spec.option.ls_iterations = SOLVER_ITERATIONS, LINE_SEARCH_ITERATIONS
    spec.worldbody.add_geom(
        name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.8, 0.8, 0.8, 1], material=""
    )
    spec.worldbody.add_light(pos=[0, 0, 3], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    base = spec.body("base")
    base.add_camera(
        name="track", mode=mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM, pos=[0, -2.5, 0.3], xyaxes=[1, 0, 0, 0, 0.12, 1]
    )
    model = spec.compile()
    qpos = model.qpos0.copy()
    for joint, degrees in STANDING_DEG.items():
        qpos[model.joint(joint).qposadr[0]] = np.deg2rad(degrees)
    feet = [i for i in range(model.ngeom) if model.geom_contype[i] or model.geom_conaffinity[i]]
    add_standing_key(spec, model, qpos, [i for i in feet if model.geom_type[i] == mujoco.mjtGeom.mjGEOM_CAPSULE])
    return spec.to_xml()


if __name__ == "__main__":
    out = Path(__file__).with_name("kbot.xml")
    out.write_text(vendor(Path(sys.argv[1])))
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
