"""Judging episodes that ran outside JAX (sim-to-sim) with the task's own terminations, rewards and eval measures.

An episode recorded by a plain MuJoCo loop (its states, the policy's actions, the controls and the commands) is
replayed through `judge_step` and `step_measures`, the functions the training environment and `mode=eval` use,
so a fall is a fall by the task's rule and the return is the task's. What depends only on positions and
velocities (terminations, tracking errors, most rewards) is exact; a reward that reads forces or acceleration
sensors sees those of `mj_forward` at the recorded state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ksim.task.env import Environment, judge_step
from ksim.task.evaluation import EvalResult, StepMeasures, mean_drift, step_measures, tracks_velocity
from ksim.tracking import MotionCommand

Array = jax.Array


@dataclass(frozen=True)
class RecordedEpisode:
    """One episode of a loop outside JAX (ksim.sim2sim's), T control steps."""

    qpos: np.ndarray  # (T + 1, nq): the start, then the state after each step
    qvel: np.ndarray  # (T + 1, nv)
    action: np.ndarray  # (T, nu): the policy's action at each step
    ctrl: np.ndarray  # (T, nu): the control of each step's last substep
    command: np.ndarray  # (T, command size): the command the policy saw when it chose the action (a motion: (T, 0))
    motion_frame: np.ndarray | None = None  # (T,): a motion's frame at each step; the judge makes its command values


Start = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # an episode's (qpos, qvel, first command, command state)


def draw_starts(environment: Environment, seed: int, count: int) -> list[Start]:
    """`count` episode starts as the task's evaluation draws them (its resets, its first command and that command's
    state: a motion's first frame)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), count)
    start = functools.partial(environment.start_episode, from_beginning=True)
    episodes = jax.jit(jax.vmap(start))(keys)
    arrays = (episodes.data.qpos, episodes.data.qvel, episodes.command, episodes.command_state)
    qpos, qvel, command, state = (np.asarray(x) for x in arrays)
    return [(qpos[i], qvel[i], command[i], int(state[i])) for i in range(count)]


def make_judge(environment: Environment) -> Callable[..., tuple[Array, Array, StepMeasures, Array]]:
    """(qpos, qvel, action, ctrl, command) of one episode -> per step (reward, terminated, locomotion measures,
    which of the task's terminations end the step)."""
    engine, parts, ctrl_dt = environment.engine, environment.components, environment.settings.ctrl_dt

    def judge(
        qpos: Array, qvel: Array, action: Array, ctrl: Array, command: Array
    ) -> tuple[Array, Array, StepMeasures, Array]:
        times = jnp.arange(qpos.shape[0], dtype=jnp.float32) * ctrl_dt
        datas = jax.vmap(lambda q, v, t: engine.make_data(q, v).replace(time=t))(qpos, qvel, times)
        previous_actions = jnp.concatenate([jnp.zeros_like(action[:1]), action[:-1]])
        start_states = {key: c.initial_state(engine.layout) for key, c in parts.stateful}

        def body(states: dict[str, Any], t: Array) -> tuple[dict[str, Any], tuple[Array, Array, StepMeasures, Array]]:
            data, prev = (jax.tree.map(lambda leaf, i=i: leaf[i], datas) for i in (t + 1, t))
            ctx = engine.context(data, prev, action[t], previous_actions[t], ctrl[t], command[t])
            terminated, flags, _, reward, states = judge_step(parts, ctx, states)
            return states, (reward, terminated, step_measures(parts.command, ctx), flags)

        _, per_step = jax.lax.scan(body, start_states, jnp.arange(action.shape[0]))
        return per_step

    return jax.jit(judge)


def judge_episodes(environment: Environment, episodes: Sequence[RecordedEpisode]) -> EvalResult:
    """The episodes as `mode=eval` reports them: each ends at its first termination (a fall) or its last step."""
    judge = make_judge(environment)
    motion = environment.components.command
    motion = motion if isinstance(motion, MotionCommand) else None
    returns, lengths, fell, measures, own, ended_by = [], [], [], [], [], []
    for episode in episodes:
        command = episode.command
        if motion is not None and episode.motion_frame is not None:
            command = np.asarray(jax.vmap(motion.value_at)(jnp.asarray(episode.motion_frame)))
        arrays = (episode.qpos, episode.qvel, episode.action, episode.ctrl, command)
        reward, terminated, per_step, flags = jax.device_get(judge(*(jnp.asarray(a, jnp.float32) for a in arrays)))
        ended = np.flatnonzero(terminated)
        length = int(ended[0]) + 1 if ended.size else len(reward)
        ended_by.append(flags[length - 1] if ended.size else np.zeros(flags.shape[-1], bool))
        returns.append(reward[:length].sum())
        lengths.append(length)
        fell.append(bool(ended.size))
        *locomotion, command_measures = per_step
        measures.append([np.asarray(m)[:length] for m in locomotion])
        own.append({name: float(np.mean(values[:length])) for name, values in command_measures.items()})
    tracking = tracks_velocity(environment.components.command)
    speed_x, error, yaw_error, standing, drift = (
        [per_episode[i] for per_episode in measures] for i in range(len(StepMeasures._fields) - 1)
    )
    standing_steps = np.asarray([m.sum() for m in standing])
    drift_speed = mean_drift(np.stack([m.sum(axis=0) for m in drift]), standing_steps) if tracking else None
    return EvalResult(
        np.asarray(returns),
        np.asarray(lengths),
        np.asarray([m.mean() for m in speed_x]),
        np.asarray(fell),
        np.asarray([m.mean() for m in error]) if tracking else None,
        episodes[0].qpos if episodes else np.zeros((0, 0)),
        None,
        np.asarray([m.mean() for m in yaw_error]) if tracking else None,
        drift_speed,
        {name: np.asarray([m[name] for m in own]) for name in own[0]} if own and own[0] else None,
        *motion_clips(motion, episodes),
        dict(zip(environment.components.termination_names, np.asarray(ended_by).T, strict=True)) if episodes else None,
    )


def motion_clips(
    motion: MotionCommand | None, episodes: Sequence[RecordedEpisode]
) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """(the clip each episode played, the clips' names); (None, ()) without a motion."""
    if motion is None or any(episode.motion_frame is None for episode in episodes):
        return None, ()
    first_frames = jnp.asarray([int(episode.motion_frame[0]) for episode in episodes])  # type: ignore[index]
    return np.asarray(jax.vmap(motion.clip_of)(first_frames)), motion.clip_names
