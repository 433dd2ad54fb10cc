"""Unitree's G1 (29 dof) as ksim runs it: the vendored model (ksim/assets/g1) with its motors' gains, limits and the
joints' armature derived from the motors' data, as mjlab derives them (each joint a second-order system of 10 Hz
and damping ratio 2 with only its drive's inertia). What the G1's tasks share; `g1_model()` is their model."""

from __future__ import annotations

import mujoco

from ksim.actuators import ElectricMotor, as_position_servos, motor_gains, with_motor_armature
from ksim.engine import ASSETS_DIR, load_mujoco_model

# Unitree's motors: rotor and gear-stage inertias (kg m^2), stage ratios, torque (N m) and speed (rad/s) limits.
MOTOR_5020 = ElectricMotor((0.139e-4, 0.017e-4, 0.169e-4), (1.0, 1.0 + 46 / 18, 1.0 + 56 / 16), 25.0, 37.0)
MOTOR_7520_14 = ElectricMotor((0.489e-4, 0.098e-4, 0.533e-4), (1.0, 4.5, 1.0 + 48 / 22), 88.0, 32.0)
MOTOR_7520_22 = ElectricMotor((0.489e-4, 0.109e-4, 0.738e-4), (1.0, 4.5, 5.0), 139.0, 20.0)
MOTOR_4010 = ElectricMotor((0.068e-4, 0.0, 0.0), (1.0, 5.0, 5.0), 5.0, 22.0)
# The ankles and the waist's pitch and roll are linkages driven by two 5020s each (at a nominal 1:1 ratio).
LINKAGE_5020 = ElectricMotor(MOTOR_5020.rotor_inertias, MOTOR_5020.gears, 25.0, 37.0, count=2)

G1_MOTORS = {
    r".*_(hip_pitch|hip_yaw)_joint|waist_yaw_joint": MOTOR_7520_14,
    r".*_(hip_roll|knee)_joint": MOTOR_7520_22,
    r".*_(shoulder_pitch|shoulder_roll|shoulder_yaw|elbow|wrist_roll)_joint": MOTOR_5020,
    r".*_(wrist_pitch|wrist_yaw)_joint": MOTOR_4010,
    r".*_ankle_(pitch|roll)_joint|waist_(pitch|roll)_joint": LINKAGE_5020,
}
NATURAL_FREQUENCY_HZ, DAMPING_RATIO = 10.0, 2.0
MOTIONS_DIR = ASSETS_DIR / "motions" / "g1_kimodo"
FEET_SITES = ("left_foot", "right_foot")


def g1_model(keyframe: str | None = None) -> mujoco.MjModel:
    """The G1 with its drives' armature on every joint and position servos of the motors' gains and limits; its
    default pose is `keyframe`'s: mjlab's `home` (standing; the first, so without one) or `knees_bent`."""
    model = with_motor_armature(load_mujoco_model("g1/g1.xml", keyframe), G1_MOTORS)
    return as_position_servos(model, motor_gains(model, G1_MOTORS, NATURAL_FREQUENCY_HZ, DAMPING_RATIO))
