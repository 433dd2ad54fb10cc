"""Writes ksim/assets/g1/g1.xml from mjlab's Unitree G1 (../shared/robots/g1, Apache-2.0); kept for provenance.

    .venv/bin/python ksim/assets/g1/vendor.py ../shared/robots/g1

What changes: each visual STL mesh (35 files, 19 MB) becomes its convex hull's vertices (on a 4 mm grid), inline,
so the robot still shows in the viewer and videos while the asset stays small (84 KB); only the feet's capsules
touch anything (condim 3, friction 0.6, priority 1, as mjlab's feet-only collisions; the other collision geoms stay,
in group 3, touching nothing); the solver runs 4 iterations (8 line-search) instead of 100 (50). Added, since the
XML has none: a `<motor>` on each of the 29 joints (gear 1; the task gives them gains and limits from the motors'
data, see examples/g1_robot.py), an IMU (gyro, accelerometer, orientation) at each of the two IMU sites, a floor, a
light, and two keyframes from mjlab, each with the base lowered until the feet touch: `home` (its standing pose,
the first, so the default) and `knees_bent` (the pose its G1 tasks start from). Joints, inertias and sites are
untouched.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import mujoco
import numpy as np

from ksim.assets.vendoring import add_standing_key, inline_hulls

# mjlab's keyframes (HOME_KEYFRAME, KNEES_BENT_KEYFRAME), radians, by joint-name pattern; every other joint 0.
KEYFRAMES = {
    "home": {
        r".*_hip_pitch_joint": -0.1,
        r".*_knee_joint": 0.3,
        r".*_ankle_pitch_joint": -0.2,
        r".*_shoulder_pitch_joint": 0.2,
        r".*_elbow_joint": 1.28,
        r"left_shoulder_roll_joint": 0.2,
        r"right_shoulder_roll_joint": -0.2,
    },
    "knees_bent": {
        r".*_hip_pitch_joint": -0.312,
        r".*_knee_joint": 0.669,
        r".*_ankle_pitch_joint": -0.363,
        r".*_shoulder_pitch_joint": 0.2,
        r".*_elbow_joint": 0.6,
        r"left_shoulder_roll_joint": 0.2,
        r"right_shoulder_roll_joint": -0.2,
    },
}
FOOT_GEOM = re.compile(r"(left|right)_foot\d_collision")
HULL_DECIMALS = 4
HULL_GRID = 0.004  # m
SOLVER_ITERATIONS, LINE_SEARCH_ITERATIONS = 4, 8
IMUS = {"imu_in_pelvis": "pelvis", "imu_in_torso": "torso"}


def feet_only(spec: mujoco.MjSpec) -> None:
    for geom in spec.geoms:
        if not geom.contype and not geom.conaffinity:
            continue  # a visual mesh
        if FOOT_GEOM.fullmatch(geom.name):
            geom.condim, geom.priority = 3, 1
            geom.friction = [0.6, geom.friction[1], geom.friction[2]]
            geom.contype, geom.conaffinity = 0, 1
        else:
            geom.contype, geom.conaffinity = 0, 0


def add_motors_and_imus(spec: mujoco.MjSpec) -> None:
    for joint in spec.joints:
        if joint.type == mujoco.mjtJoint.mjJNT_HINGE:
            spec.add_actuator(
                name=joint.name.removesuffix("_joint"), target=joint.name, trntype=mujoco.mjtTrn.mjTRN_JOINT
            )
    for site, prefix in IMUS.items():
        for kind, name in (
            (mujoco.mjtSensor.mjSENS_GYRO, "gyro"),
            (mujoco.mjtSensor.mjSENS_ACCELEROMETER, "accelerometer"),
            (mujoco.mjtSensor.mjSENS_FRAMEQUAT, "orientation"),
        ):
            spec.add_sensor(name=f"{prefix}_{name}", type=kind, objtype=mujoco.mjtObj.mjOBJ_SITE, objname=site)


def vendor(source: Path) -> str:
    spec = mujoco.MjSpec.from_file(str(source / "g1.xml"))
    inline_hulls(spec, source / "assets", HULL_DECIMALS, HULL_GRID)
    spec.meshdir = ""
    spec.option.iterations, spec.option.ls_iterations = SOLVER_ITERATIONS, LINE_SEARCH_ITERATIONS
    feet_only(spec)
    add_motors_and_imus(spec)
    spec.worldbody.add_geom(
        name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.8, 0.8, 0.8, 1], contype=1
    )
    spec.worldbody.add_light(pos=[0, 0, 3], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    model = spec.compile()
    feet = [g for g in range(model.ngeom) if FOOT_GEOM.fullmatch(model.geom(g).name)]
    for name, pose in KEYFRAMES.items():
        add_standing_key(spec, model, posed(model, pose), feet, name)
    return spec.to_xml()


def posed(model: mujoco.MjModel, pose: dict[str, float]) -> np.ndarray:
    """qpos0 with each joint whose name matches a pattern of `pose` at its angle."""
    qpos = model.qpos0.copy()
    for joint in range(1, model.njnt):
        for pattern, angle in pose.items():
            if re.fullmatch(pattern, model.joint(joint).name):
                qpos[model.jnt_qposadr[joint]] = angle
    return qpos


if __name__ == "__main__":
    out = Path(__file__).with_name("g1.xml")
    out.write_text(vendor(Path(sys.argv[1])))
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
