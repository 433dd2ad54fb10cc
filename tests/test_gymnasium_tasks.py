"""Gymnasium's MuJoCo v5 tasks in ksim (examples/gymnasium.py) against `gymnasium.make("<Task>-v5")`.

Both start from the same state and take the same actions (a third of them outside the control range); after every
control step the observation, the reward and the termination must agree. ksim keeps the state in float32 between
control steps, so Gymnasium's state is rounded to float32 after each of its steps too: the two then run the same
float64 MuJoCo computation from the same state, and differ only by float32 rounding of what ksim reports. Also: the
reset distribution (uniform or normal, its scale) against Gymnasium's resets, and the new components' refusals.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from scipy import stats

gymnasium = pytest.importorskip("gymnasium")

from examples.gymnasium import TASKS, GymnasiumTask, load_gymnasium_model, task_config  # noqa: E402
from ksim import observations as obs  # noqa: E402
from ksim import terminations as term  # noqa: E402
from ksim.config import ConfigError, preset_from_command_line  # noqa: E402
from ksim.engine import ModelLayout  # noqa: E402
from ksim.learner.memory import PolicyState  # noqa: E402
from ksim.task.env import Environment  # noqa: E402
from ksim.task.types import Episode, PolicyOutput, Transition  # noqa: E402

Array = jax.Array
STEPS = 25
RTOL, ATOL = 1e-5, 1e-6


@dataclasses.dataclass(frozen=True)
class Scripted:
    """A policy that plays the action it is handed in place of the learner's shared state."""

    def initial_policy_state(self) -> PolicyState:
        return PolicyState(jnp.zeros((0, 0)), jnp.zeros((2, 0)))

    def act(
        self,
        shared: Any,
        state: PolicyState,
        obs: Array,
        critic_obs: Array,
        first: Array,
        rng: Array,
        deterministic: bool,
    ) -> PolicyOutput:
        return PolicyOutput(action=shared, log_prob=jnp.zeros(()), state=state, obs=obs, carry=state.carry)


@dataclasses.dataclass
class Pair:
    """One task built in ksim (a tiny config, C MuJoCo) and Gymnasium's own env of it."""

    task: GymnasiumTask
    gym: Any

    @functools.cached_property
    def environment(self) -> Environment:
        return dataclasses.replace(self.task.environment, policy=Scripted())

    @functools.cached_property
    def start(self) -> Callable[[Array], Episode]:
        return jax.jit(self.environment.start_episode)

    @functools.cached_property
    def step(self) -> Callable[[Array, Episode], tuple[Episode, Transition]]:
        return jax.jit(lambda action, episode: self.environment.step_env(action, episode, deterministic=True))

    @functools.cached_property
    def at_state(self) -> Callable[[Episode, Array, Array], Episode]:
        """The episode moved to a pose, as Gymnasium's `set_state` after a reset leaves its env."""

        def move(episode: Episode, qpos: Array, qvel: Array) -> Episode:
            engine, no_action = self.environment.engine, episode.last_action
            data = engine.make_data(qpos, qvel)
            ctx = engine.context(data, data, no_action, no_action, data.ctrl)
            return episode.replace(data=data, obs=self.environment.observe(ctx))

        return jax.jit(move)


@pytest.fixture(scope="module", params=sorted(TASKS))
def pair(request: pytest.FixtureRequest) -> Pair:
    task_class = TASKS[request.param]
    config = task_config(task_class, num_envs=4, batch_size=1, num_devices=1, physics_impl="mujoco")
    return Pair(task_class(config), gymnasium.make(task_class.gymnasium_id, disable_env_checker=True))


def round_like_ksim(data: mujoco.MjData) -> None:
    """Gymnasium's state as ksim holds it between control steps: float32 (its derived fields stay as they are)."""
    for name in ("qpos", "qvel", "act", "qacc_warmstart"):
        getattr(data, name)[:] = getattr(data, name).astype(np.float32)
    data.time = float(np.float32(data.time))


def play(pair: Pair, episode: Episode, actions: np.ndarray) -> list[tuple[np.ndarray, bool]]:
    """Steps ksim's episode and Gymnasium's env, set to the episode's state, with `actions` until one terminates;
    asserts that the first observation and every step's observation, reward and termination agree. Returns each
    step's (observation, terminated)."""
    env = pair.gym.unwrapped
    pair.gym.reset(seed=0)
    env.set_state(np.asarray(episode.data.qpos).astype(np.float64), np.asarray(episode.data.qvel).astype(np.float64))
    np.testing.assert_allclose(episode.obs, env._get_obs(), rtol=RTOL, atol=ATOL)
    dt, steps = pair.task.config.ctrl_dt, []
    for index, action in enumerate(np.asarray(actions, np.float32)):
        x_before = float(episode.data.qpos[0])
        episode, transition = pair.step(jnp.asarray(action), episode)
        observation, reward, terminated, _, _ = pair.gym.step(action.astype(np.float64))
        where = f"{pair.task.gymnasium_id}, step {index}"
        np.testing.assert_allclose(episode.obs, observation, rtol=RTOL, atol=ATOL, err_msg=where)
        # The forward reward differences float32 positions over dt: rounding them costs up to |x| * 2^-24 / dt each.
        rounding = (abs(x_before) + abs(float(episode.data.qpos[0]))) * 2.0**-24 / dt
        reward_ksim = transition.trajectory.reward
        np.testing.assert_allclose(reward_ksim, reward, rtol=RTOL, atol=ATOL + rounding, err_msg=where)
        assert bool(transition.trajectory.terminated) == terminated, where
        steps.append((observation, terminated))
        if terminated:
            break
        round_like_ksim(env.data)
    return steps


def actions(pair: Pair, seed: int, steps: int = STEPS) -> np.ndarray:
    """Uniform in [-1.5, 1.5] per actuator: a third of them outside the control range [-1, 1]."""
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (steps, pair.task.engine.action_dim))


def test_steps_from_a_reset_agree_with_gymnasium(pair: Pair) -> None:
    for seed in range(2):
        steps = play(pair, pair.start(jax.random.PRNGKey(seed)), actions(pair, seed))
        if pair.task.gymnasium_id == "Ant-v5":  # it lands: the contact forces compared were not all zeros
            assert max(np.abs(observation[27:]).max() for observation, _ in steps) > 0.1


# Per task: a pose (qpos offsets from the model's reference pose, qvel by index) and whether its first step
# terminates: Hopper tilts past 0.2 rad, then leaves its +-100 state range (the root's x velocity); Walker2d rises
# above 2 m, then tilts past 1 rad; the Ant rises above 1 m; the half cheetah upside down goes on (it never
# terminates); the other cases marked False stay healthy.
CASES: dict[str, list[tuple[dict[int, float], dict[int, float], bool]]] = {
    "Hopper-v5": [({2: 0.19}, {2: 5.0}, True), ({}, {0: 150.0}, True), ({2: 0.1}, {}, False)],
    "Walker2d-v5": [({1: 0.74}, {1: 5.0}, True), ({2: -0.98}, {2: -5.0}, True)],
    "HalfCheetah-v5": [({1: 0.3, 2: 3.0}, {0: 2.0}, False)],
    "Ant-v5": [({2: 0.23}, {2: 3.0}, True), ({2: -0.1}, {}, False)],
}


def test_terminating_states_agree_with_gymnasium(pair: Pair) -> None:
    """The healthy reward is 0 at the terminating step in both (the reward comparison in `play` checks it)."""
    model = pair.task.engine.mj_model
    start = pair.start(jax.random.PRNGKey(0))
    for qpos_offsets, velocities, terminates in CASES[pair.task.gymnasium_id]:
        qpos, qvel = model.qpos0.astype(np.float32), np.zeros(model.nv, np.float32)
        for index, offset in qpos_offsets.items():
            qpos[index] += offset
        for index, velocity in velocities.items():
            qvel[index] = velocity
        episode = pair.at_state(start, jnp.asarray(qpos), jnp.asarray(qvel))
        steps = play(pair, episode, actions(pair, 1, steps=3))
        assert steps[0][1] == terminates, (pair.task.gymnasium_id, qpos_offsets, velocities)


def test_resets_draw_from_gymnasiums_distribution(pair: Pair) -> None:
    """Deviations from the reference pose, over all qpos (and qvel) values: in the scale Gymnasium's env has, and
    from the same distribution as Gymnasium's resets (two-sample Kolmogorov-Smirnov)."""
    env = pair.gym.unwrapped
    scale = env._reset_noise_scale
    episodes = jax.jit(jax.vmap(pair.environment.start_episode))(jax.random.split(jax.random.PRNGKey(3), 400))
    ksim_qpos = np.asarray(episodes.data.qpos) - env.init_qpos
    ksim_qvel = np.asarray(episodes.data.qvel) - env.init_qvel
    gym_qpos, gym_qvel = [], []
    for seed in range(200):
        env.reset(seed=seed)
        gym_qpos.append(env.data.qpos - env.init_qpos)
        gym_qvel.append(env.data.qvel - env.init_qvel)
    assert np.abs(ksim_qpos).max() <= scale * (1 + 1e-5) and np.abs(ksim_qpos).max() > 0.95 * scale
    for ours, theirs in ((ksim_qpos, np.asarray(gym_qpos)), (ksim_qvel, np.asarray(gym_qvel))):
        assert stats.ks_2samp(ours.ravel() / scale, theirs.ravel() / scale).pvalue > 1e-3
    gaussian = np.abs(ksim_qvel).max() > scale
    assert gaussian == (pair.task.gymnasium_id in ("HalfCheetah-v5", "Ant-v5"))


def test_clip_actions_charges_what_the_env_behind_clip_action_charges() -> None:
    """clip_actions=True: the control cost of the clipped action, as Gymnasium's env under ClipAction (CleanRL)."""
    task_class = TASKS["Hopper-v5"]
    config = task_config(task_class, num_envs=4, batch_size=1, num_devices=1, clip_actions=True)
    pair = Pair(
        task_class(config), gymnasium.wrappers.ClipAction(gymnasium.make("Hopper-v5", disable_env_checker=True))
    )
    play(pair, pair.start(jax.random.PRNGKey(0)), actions(pair, 2, steps=8))


def test_new_components_refuse_what_they_cannot_apply_to() -> None:
    layout = ModelLayout.create(load_gymnasium_model("ant.xml"))
    with pytest.raises(ConfigError, match=r"^JointPositionOutside.joint='root' has 7 position values"):
        term.JointPositionOutside("root", low=0.2).bind(layout)
    with pytest.raises(ConfigError, match=r"^JointPositionOutside: low=1.0 must be below high=0.5"):
        term.JointPositionOutside("hip_1", low=1.0, high=0.5).bind(layout)
    with pytest.raises(ConfigError, match=r"^GeneralizedPosition.skip=15 must be >= 0 and below the model's 15"):
        obs.GeneralizedPosition(skip=15).bind(layout)
    with pytest.raises(ConfigError, match=r"^StateOutsideRange.skip: no joint named 'rootx'"):
        term.StateOutsideRange(skip=("rootx",)).bind(layout)


def test_the_ant_refuses_physics_other_than_c_mujoco() -> None:
    with pytest.raises(ConfigError, match=r"set physics_impl='mujoco'"):
        TASKS["Ant-v5"](task_config(TASKS["Ant-v5"], num_envs=4, batch_size=1, num_devices=1, physics_impl="jax"))


def test_the_command_line_picks_the_task_and_refuses_one_that_is_not_there() -> None:
    from examples.gymnasium import PRESETS

    assert preset_from_command_line(PRESETS, ["num_envs=8", "task=Ant-v5"], "Hopper-v5", key="task").task == "Ant-v5"
    assert preset_from_command_line(PRESETS, [], "Hopper-v5", key="task").task == "Hopper-v5"
    with pytest.raises(ConfigError, match=r"^task='Cartpole' must be one of"):
        TASKS["Hopper-v5"](task_config(TASKS["Hopper-v5"], task="Cartpole", num_devices=1))
    with pytest.raises(ConfigError, match=r"^task='Ant-v5' is not HopperTask's 'Hopper-v5'"):
        TASKS["Hopper-v5"](task_config(TASKS["Hopper-v5"], task="Ant-v5", num_devices=1))
