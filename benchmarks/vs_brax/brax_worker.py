"""Brax side of benchmarks/vs_brax, run in Brax's own virtual environment (it never imports ksim).

The env mirrors examples/hopper.py:HopperTask on the same MJCF: observations, rewards, termination and
reset noise are written out here with the formulas of ksim's components (see MIRRORED in __main__.py).

    python brax_worker.py MODEL_XML SETTINGS_JSON   # prints one JSON line; takes turns (turns.py) with ksim's
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
from brax.envs.base import PipelineEnv, State
from brax.io import mjcf
from brax.training.agents.ppo import networks as ppo_networks
from brax.training.agents.ppo import train as ppo
from flax import linen
from mujoco import mjx
from turns import Turns  # this script's folder, on sys.path as the script's own

Array = jax.Array
BASE_BODY = 1  # torso, the first body under the world


def rotate(quat: Array, vec: Array) -> Array:
    w, xyz = quat[0], quat[1:]
    t = 2.0 * jnp.cross(xyz, vec)
    return vec + w * t + jnp.cross(xyz, t)


def rotate_inverse(quat: Array, vec: Array) -> Array:
    w, xyz = quat[0], quat[1:]
    t = 2.0 * jnp.cross(xyz, vec)
    return vec - w * t + jnp.cross(xyz, t)


class KsimHopper(PipelineEnv):
    """HopperTask's MDP on Brax's MJX pipeline: 4 physics steps of 5 ms per 20 ms control step."""

    def __init__(self, xml_path: str, settings: dict[str, Any]) -> None:
        mj_model = mujoco.MjModel.from_xml_path(xml_path)
        mj_model.opt.timestep = settings["dt"]
        n_frames = round(settings["ctrl_dt"] / settings["dt"])
        super().__init__(mjcf.load_model(mj_model), backend="mjx", n_frames=n_frames)
        self._settings = settings
        root_joints = mj_model.body_jntadr[BASE_BODY] + jnp.arange(mj_model.body_jntnum[BASE_BODY])
        others = [j for j in range(mj_model.njnt) if j not in set(root_joints.tolist())]
        self._qpos_index = jnp.asarray(mj_model.jnt_qposadr[others])
        self._qvel_index = jnp.asarray(mj_model.jnt_dofadr[others])
        self._body_rootid = int(mj_model.body_rootid[BASE_BODY])
        self._ctrl_range = jnp.asarray(mj_model.actuator_ctrlrange.T, jnp.float32)

    def reset(self, rng: Array) -> State:
        pos_key, vel_key = jax.random.split(rng)
        scale = self._settings["reset_noise"]
        size = self._qpos_index.shape[0]
        qpos = self.sys.qpos0.at[self._qpos_index].add(
            jax.random.uniform(pos_key, (size,), minval=-scale, maxval=scale)
        )
        noise = jax.random.uniform(vel_key, (size,), minval=-scale, maxval=scale)
        qvel = jnp.zeros(self.sys.nv).at[self._qvel_index].add(noise)
        pipeline_state = self.pipeline_init(qpos, qvel)
        zero = jnp.zeros(())
        return State(pipeline_state, self._observe(pipeline_state), zero, zero, {})

    def step(self, state: State, action: Array) -> State:
        ctrl = jnp.clip(action, self._ctrl_range[0], self._ctrl_range[1])
        prev = state.pipeline_state
        data = self.pipeline_step(prev, ctrl)
        # Like ksim's engine: body poses and velocities brought up to the state after the last substep.
        data = mjx.com_vel(self.sys, mjx.com_pos(self.sys, mjx.kinematics(self.sys, data)))
        diverged = ~(jnp.all(jnp.isfinite(data.qpos)) & jnp.all(jnp.isfinite(data.qvel)))
        progress = (data.xpos[BASE_BODY, 0] - prev.xpos[BASE_BODY, 0]) / self.dt
        reward = 1.0 + progress + self._settings["ctrl_cost_scale"] * jnp.sum(jnp.square(ctrl))
        forward = rotate(data.xquat[BASE_BODY], jnp.array([1.0, 0.0, 0.0]))
        pitch = jnp.arctan2(-forward[2], forward[0])
        height = data.xpos[BASE_BODY, 2]
        done = diverged | (height < self._settings["min_height"]) | (jnp.abs(pitch) > self._settings["max_pitch"])
        obs = jnp.where(diverged, 0.0, self._observe(data))
        return state.replace(
            pipeline_state=data,
            obs=obs,
            reward=jnp.where(diverged, 0.0, reward),
            done=done.astype(jnp.float32),
        )

    def _observe(self, data: Any) -> Array:
        quat = data.xquat[BASE_BODY]
        angular, linear_at_com = data.cvel[BASE_BODY, :3], data.cvel[BASE_BODY, 3:]
        offset = data.xpos[BASE_BODY] - data.subtree_com[self._body_rootid]
        linear = linear_at_com - jnp.cross(offset, angular)
        return jnp.concatenate(
            [
                data.xpos[BASE_BODY, 2:3],
                rotate_inverse(quat, jnp.array([0.0, 0.0, -1.0])),
                data.qpos[self._qpos_index],
                jnp.clip(linear, -10.0, 10.0),
                jnp.clip(rotate_inverse(quat, angular) * 0.1, -10.0, 10.0),
                jnp.clip(data.qvel[self._qvel_index] * 0.1, -10.0, 10.0),
            ]
        )


def evaluate(env: KsimHopper, policy: Any, settings: dict[str, Any]) -> float:
    """Mean return of deterministic episodes (up to episode_steps) from fresh starts."""
    steps = settings["episode_steps"]

    @jax.jit
    def run(key: Array) -> Array:
        state = jax.vmap(env.reset)(jax.random.split(key, settings["eval_episodes"]))

        def body(carry: tuple[State, Array, Array], key: Array) -> tuple[tuple[State, Array, Array], None]:
            state, total, alive = carry
            action, _ = policy(state.obs, key)
            state = jax.vmap(env.step)(state, action)
            return (state, total + alive * state.reward, alive * (1.0 - state.done)), None

        ones = jnp.ones(settings["eval_episodes"])
        (_, total, _), _ = jax.lax.scan(body, (state, 0.0 * ones, ones), jax.random.split(key, steps))
        return total

    return float(jnp.mean(run(jax.random.PRNGKey(settings["seed"] + 1))))


def main() -> None:
    settings = json.loads(sys.argv[2])
    turns = Turns()
    turns.wait()  # until the parent starts the timed part
    start = turns.clock()
    env = KsimHopper(sys.argv[1], settings)
    epochs = settings["timing_chunks"]
    steps_per_train_step = settings["num_envs"] * settings["rollout_length"]
    num_minibatches = settings["num_envs"] // settings["batch_size"]
    marks: list[tuple[float, float, dict[str, Any]]] = []  # (turns' clock, CPU seconds, metrics) per epoch

    def progress(step: int, metrics: dict[str, Any]) -> None:
        marks.append((turns.clock(), time.process_time(), dict(metrics)))
        turns.wait()  # Brax times its epochs itself, without this wait

    network_factory = functools.partial(
        ppo_networks.make_ppo_networks,
        policy_hidden_layer_sizes=tuple(settings["hidden"]),
        value_hidden_layer_sizes=tuple(settings["hidden"]),
        activation=linen.tanh,
        distribution_type="normal",  # ksim's policy: a Gaussian with state-independent log std
        noise_std_type="log",
        init_noise_std=math.exp(settings["init_log_std"]),
    )
    make_policy, params, _ = ppo.train(
        environment=env,
        num_timesteps=settings["train_steps"] * steps_per_train_step,
        num_envs=settings["num_envs"],
        episode_length=settings["episode_steps"],
        learning_rate=settings["learning_rate"],
        entropy_cost=settings["entropy_coef"],
        discounting=settings["gamma"],
        gae_lambda=settings["gae_lambda"],
        unroll_length=settings["rollout_length"],
        batch_size=settings["batch_size"],
        num_minibatches=num_minibatches,
        num_updates_per_batch=settings["num_passes"],
        normalize_observations=True,
        clipping_epsilon=settings["clip_eps"],
        clipping_epsilon_value=settings["clip_eps"],
        max_grad_norm=settings["max_grad_norm"],
        network_factory=network_factory,
        seed=settings["seed"],
        num_evals=epochs + 1,  # one progress call per epoch; no evaluation episodes in the timing
        run_evals=False,
        progress_fn=progress,
    )
    steps_per_epoch = settings["train_steps"] // epochs * steps_per_train_step
    steady = statistics.median(float(m["training/sps"]) for _, _, m in marks[1:])
    compile_s = marks[-1][0] - start - len(marks) * steps_per_epoch / steady  # Brax compiles some of it lazily
    cpu_per_epoch = statistics.median(b[1] - a[1] for a, b in itertools.pairwise(marks))
    result = {
        "steady_sps": steady,
        "compile_s": compile_s,
        "steps_per_cpu_s": steps_per_epoch / cpu_per_epoch,
        "return": evaluate(env, make_policy(params, deterministic=True), settings),
        "env_steps": settings["train_steps"] * steps_per_train_step,
        "jax": jax.__version__,
        "devices": jax.local_device_count(),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
