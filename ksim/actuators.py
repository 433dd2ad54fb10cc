"""Actuators: turn a policy action into the MuJoCo control vector, every physics substep.

`gain_scales` holds one env's randomized PD-gain multipliers ("kp", "kd"; see ksim.randomization).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import mjx

Array = jax.Array


def _ctrl_range(mj_model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    limited = mj_model.actuator_ctrllimited.astype(bool)
    low = np.where(limited, mj_model.actuator_ctrlrange[:, 0], -np.inf)
    high = np.where(limited, mj_model.actuator_ctrlrange[:, 1], np.inf)
    return low.astype(np.float32), high.astype(np.float32)


class Actuators(ABC):
    """Maps an action in [-1, 1]-ish units to `data.ctrl`."""

    @abstractmethod
    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array: ...


@dataclass(frozen=True)
class TorqueActuators(Actuators):
    """The action, scaled, is the motor control directly (clipped to each actuator's ctrlrange)."""

    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    action_scale: float = 1.0

    @classmethod
    def from_model(cls, mj_model: mujoco.MjModel, action_scale: float = 1.0) -> TorqueActuators:
        low, high = _ctrl_range(mj_model)
        return cls(low, high, action_scale)

    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array:
        return jnp.clip(action * self.action_scale, self.ctrl_low, self.ctrl_high)


@dataclass(frozen=True)
class PositionActuators(Actuators):
    """PD control around a default pose: target = default + action_scale * action.

    Each actuator must be a motor on a hinge or slide joint; the PD torque is divided by the motor's
    gear so `kp`/`kd` are in joint units (N m / rad, N m s / rad).
    """

    qpos_index: np.ndarray
    qvel_index: np.ndarray
    default_qpos: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    gear: np.ndarray
    ctrl_low: np.ndarray
    ctrl_high: np.ndarray
    action_scale: float

    @classmethod
    def from_model(
        cls,
        mj_model: mujoco.MjModel,
        kp: float | np.ndarray,
        kd: float | np.ndarray,
        default_qpos: np.ndarray,
        action_scale: float = 0.5,
    ) -> PositionActuators:
        joint_ids = mj_model.actuator_trnid[:, 0]
        if np.any(mj_model.actuator_trntype != mujoco.mjtTrn.mjTRN_JOINT):
            raise ValueError("PositionActuators needs every actuator to drive a joint (trntype 'joint')")
        qpos_index = mj_model.jnt_qposadr[joint_ids]
        low, high = _ctrl_range(mj_model)
        num_actuators = mj_model.nu
        return cls(
            qpos_index=qpos_index,
            qvel_index=mj_model.jnt_dofadr[joint_ids],
            default_qpos=np.asarray(default_qpos, np.float32)[qpos_index],
            kp=np.broadcast_to(np.asarray(kp, np.float32), (num_actuators,)).copy(),
            kd=np.broadcast_to(np.asarray(kd, np.float32), (num_actuators,)).copy(),
            gear=mj_model.actuator_gear[:, 0].astype(np.float32),
            ctrl_low=low,
            ctrl_high=high,
            action_scale=action_scale,
        )

    def ctrl(self, action: Array, data: mjx.Data, gain_scales: Mapping[str, Array] | None = None) -> Array:
        scales = gain_scales or {}
        kp, kd = self.kp * scales.get("kp", 1.0), self.kd * scales.get("kd", 1.0)
        target = self.default_qpos + self.action_scale * action
        torque = kp * (target - data.qpos[self.qpos_index]) - kd * data.qvel[self.qvel_index]
        return jnp.clip(torque / self.gear, self.ctrl_low, self.ctrl_high)


def delay_action(queue: Array, action: Array) -> tuple[Array, Array]:
    """(the action to apply, the queue after it): the queue holds the last k chosen actions, oldest first."""
    if queue.shape[0] == 0:
        return action, queue
    return queue[0], jnp.concatenate([queue[1:], action[None]])
