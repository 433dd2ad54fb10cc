"""PositionServoActuators: MJCF position servos driven around the model's keyframe pose."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from ksim.actuators import JointGains, PositionActuators, PositionServoActuators, as_position_servos
from ksim.config import ConfigError
from ksim.deploy.robot_side import describe_actuation
from ksim.physics import create_engine
from ksim.runtime import ActuatorArrays, ActuatorCommand

# A planar two-legged robot on position servos, its keyframe a crouch (knees bent) that action 0 must hold.
LEGS = "".join(
    f"""
      <body name="{side}_thigh" pos="{x} 0 -0.05">
        <joint name="{side}_hip" type="hinge" axis="0 1 0" range="-1.5 1.5"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.04" mass="1"/>
        <body name="{side}_shin" pos="0 0 -0.3">
          <joint name="{side}_knee" type="hinge" axis="0 1 0" range="-2.5 0"/>
          <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.035" mass="0.5"/>
          <geom name="{side}_foot" type="sphere" pos="0 0 -0.3" size="0.04" mass="0.1" contype="1" conaffinity="1"/>
        </body>
      </body>"""
    for side, x in (("front", 0.15), ("back", -0.15))
)
SERVO_ROBOT = f"""
<mujoco>
  <compiler angle="radian"/>
  <option timestep="0.005" iterations="4" ls_iterations="8"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" contype="1" conaffinity="1"/>
    <body name="torso" pos="0 0 0.6">
      <joint name="rootx" type="slide" axis="1 0 0"/>
      <joint name="rootz" type="slide" axis="0 0 1"/>
      <joint name="rooty" type="hinge" axis="0 1 0"/>
      <geom type="box" size="0.25 0.05 0.05" mass="4"/>{LEGS}
    </body>
  </worldbody>
  <actuator>{{actuators}}</actuator>
  <keyframe>
    <key name="crouch" qpos="0 0.02 0  0.5 -1.0  0.5 -1.0"/>
    <key name="straight" qpos="0 0 0  0 0  0 0"/>
  </keyframe>
</mujoco>"""
JOINTS = ("front_hip", "front_knee", "back_hip", "back_knee")
SERVOS = "".join(f'<position joint="{j}" kp="120" kv="4" ctrlrange="-2.5 2.5" ctrllimited="true"/>' for j in JOINTS)
MOTORS = "".join(f'<motor name="{j}_motor" joint="{j}" gear="30"/>' for j in JOINTS)


def servo_robot(actuators: str = SERVOS) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(SERVO_ROBOT.format(actuators=actuators))


def test_action_zero_holds_the_keyframe_pose_and_the_robot_stands() -> None:
    mj_model = servo_robot()
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    actuators = PositionServoActuators.from_model(mj_model, action_scale=0.5)
    keyframe = engine.default_qpos
    np.testing.assert_allclose(actuators.ctrl(jnp.zeros(4), None), keyframe[3:])  # type: ignore[arg-type]

    def control_steps(data: object) -> object:
        def one(data: object, _: None) -> tuple[object, None]:
            return engine.step(data, lambda d: actuators.ctrl(jnp.zeros(4), d))[0], None  # type: ignore[arg-type]

        return jax.lax.scan(one, data, None, length=100)[0]  # 2 s

    start = engine.make_data(jnp.asarray(keyframe), jnp.zeros(mj_model.nv))
    end = jax.jit(control_steps)(start)
    np.testing.assert_allclose(end.qpos[3:], keyframe[3:], atol=0.1)  # the joints hold the crouch (under load)
    assert float(end.xpos[1, 2]) > 0.4  # the torso stays up: the robot stands on its feet
    assert abs(float(end.qpos[2])) < 0.1  # and upright


def test_the_default_pose_is_a_named_keyframe_when_asked() -> None:
    actuators = PositionServoActuators.from_model(servo_robot(), action_scale=0.25, keyframe="straight")
    np.testing.assert_allclose(actuators.ctrl(jnp.ones(4), None), 0.25)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^keyframe='stand': the model has no such keyframe; its keyframes are"):
        PositionServoActuators.from_model(servo_robot(), keyframe="stand")


def test_gain_scales_move_into_the_servos_model_fields() -> None:
    mj_model = servo_robot()
    engine = create_engine(mj_model, ctrl_dt=0.02, dt=0.005, physics_impl="jax")
    actuators = PositionServoActuators.from_model(mj_model)
    kp, kd = jnp.asarray([1.1, 0.9, 1.0, 1.2]), jnp.asarray([0.8, 1.0, 1.0, 1.3])
    scales, fields = actuators.apply_gain_scales({"kp": kp, "kd": kd}, {}, engine.mjx_model)
    assert scales == {}
    np.testing.assert_allclose(fields["actuator_gainprm"][:, 0], 120 * kp, rtol=1e-6)
    np.testing.assert_allclose(fields["actuator_biasprm"][:, 1], -120 * kp, rtol=1e-6)
    np.testing.assert_allclose(fields["actuator_biasprm"][:, 2], -4 * kd, rtol=1e-6)


def test_a_model_with_motors_is_refused_naming_them() -> None:
    with pytest.raises(ConfigError) as refused:
        PositionServoActuators.from_model(servo_robot(MOTORS))
    assert str(refused.value).startswith(
        "PositionServoActuators needs every actuator to be a <position> servo on a hinge or slide joint: "
        "'front_hip_motor' is a motor; 'front_knee_motor' is a motor;"
    )
    assert str(refused.value).endswith("(for <motor> actuators use TorqueActuators or PositionActuators)")


def test_the_exported_servos_torque_is_what_mujoco_applies_within_the_force_limits() -> None:
    """A robot-side runtime computes a servo's torque as MuJoCo does, clipped where the model limits the force."""
    limited = "".join(
        f'<position joint="{j}" kp="120" kv="4" ctrlrange="-2.5 2.5" ctrllimited="true"'
        + (' forcerange="-20 30" forcelimited="true"/>' if "knee" in j else "/>")
        for j in JOINTS
    )
    for actuators_xml, limits in ((limited, True), (SERVOS, False)):
        mj_model = servo_robot(actuators_xml)
        actuators = PositionServoActuators.from_model(mj_model, action_scale=0.5)
        spec = describe_actuation(mj_model, actuators)
        if limits:
            big = float(np.finfo(np.float32).max)
            assert spec.force_low == [-big, -20.0, -big, -20.0] and spec.force_high == [big, 30.0, big, 30.0]
        else:
            assert spec.force_low is None and spec.force_high is None
        data = mujoco.MjData(mj_model)
        mujoco.mj_resetDataKeyframe(mj_model, data, 0)
        data.qvel[3:] = [0.5, -2.0, 1.0, 3.0]
        q, qd = data.qpos[3:].astype(np.float32), data.qvel[3:].astype(np.float32)
        # 0.5 rad off (60 N m from kp alone); then targets beyond the control range, which the servo clips
        for action in (np.array([1.0, -1.0, -1.0, 1.0], np.float32), np.array([8.0, -8.0, 8.0, 8.0], np.float32)):
            targets = np.asarray(spec.default_position, np.float32) + 0.5 * action
            command = ActuatorCommand("servo", action, targets, ActuatorArrays.of(spec))
            data.ctrl[:] = command.ctrl(q, qd)
            mujoco.mj_forward(mj_model, data)
            np.testing.assert_allclose(command.torque(q, qd), data.qfrc_actuator[3:], rtol=1e-5, atol=1e-3)
            assert (np.abs(command.torque(q, qd)[[1, 3]]) <= 30.0).all() == limits


def test_motors_made_servos_apply_the_pd_loops_torque_at_every_substep() -> None:
    """as_position_servos: MuJoCo's servo torque is PositionActuators' (gear 30, motor ctrlrange and torque limits
    both clipping), so a control step's substeps need no PD loop outside the physics."""
    motors = servo_robot("".join(f'<motor name="{j}_motor" joint="{j}" gear="30" ctrlrange="-2 2"/>' for j in JOINTS))
    gains = JointGains(
        kp=np.array([120.0, 80.0, 120.0, 80.0], np.float32),
        kd=np.array([4.0, 2.0, 4.0, 2.0], np.float32),
        torque_limit=np.array([50.0, 90.0, 50.0, 90.0], np.float32),  # the knees' 90 is past the motors' 2 x 30
    )
    servos = as_position_servos(motors, gains)
    pd = PositionActuators.from_model(motors, gains.kp, gains.kd, motors.key_qpos[0], 0.5, gains.torque_limit)
    servo = PositionServoActuators.from_model(servos, action_scale=0.5)
    moving, held = mujoco.MjData(motors), mujoco.MjData(servos)
    mujoco.mj_resetDataKeyframe(motors, moving, 0)
    rng = np.random.default_rng(0)
    saturated = 0
    for _ in range(40):
        action = rng.normal(0.0, 1.5, 4).astype(np.float32)
        for _ in range(4):
            moving.ctrl[:] = np.asarray(pd.ctrl(jnp.asarray(action), moving))
            mujoco.mj_forward(motors, moving)
            held.qpos[:], held.qvel[:] = moving.qpos, moving.qvel
            held.ctrl[:] = np.asarray(servo.ctrl(jnp.asarray(action), held))
            mujoco.mj_forward(servos, held)
            np.testing.assert_allclose(held.qfrc_actuator, moving.qfrc_actuator, rtol=1e-4, atol=1e-3)
            saturated += int(np.sum(np.isclose(np.abs(moving.qfrc_actuator[3:]), [50.0, 60.0, 50.0, 60.0])))
            mujoco.mj_step(motors, moving)
    assert saturated > 0  # the limits were reached, and clipped alike


def test_only_motors_on_joints_are_made_servos() -> None:
    gains = JointGains(*(np.ones(4, np.float32) for _ in range(3)))
    with pytest.raises(ConfigError) as refused:
        as_position_servos(servo_robot(), gains)
    assert str(refused.value) == (
        "as_position_servos: actuator '#0' is a position servo (each actuator must be a <motor> on a hinge or "
        "slide joint)"
    )


def test_servos_without_a_control_range_export_as_strict_json() -> None:
    """JSON has no infinity (a robot's strict parser refuses `Infinity`): an unbounded side is float32's extreme."""
    unlimited = servo_robot("".join(f'<position joint="{j}" kp="120" kv="4"/>' for j in JOINTS))
    spec = describe_actuation(unlimited, PositionServoActuators.from_model(unlimited))
    big = float(np.finfo(np.float32).max)
    assert spec.ctrl_low == [-big] * 4 and spec.ctrl_high == [big] * 4
    assert json.loads(json.dumps(dataclasses.asdict(spec), allow_nan=False))["ctrl_high"] == [big] * 4
