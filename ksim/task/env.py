"""One environment: an episode's state, how it starts (resets, randomization, command, event timers) and
one control step of it (noise, action delay, events, physics, rewards, terminations).

`EnvMixin` is part of `RLTask`. Everything here works on a single env; the rollout vmaps it over a
shard's envs, so every per-env field has a leading env axis there and pmap shards it with the envs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from mujoco import mjx

from ksim.actuators import delay_action
from ksim.commands import advance_command, start_command
from ksim.events import run_events, start_event_timers
from ksim.observations import add_noise, noise_scales
from ksim.randomization import Randomized, sample_randomizations
from ksim.terminations import physics_diverged

if TYPE_CHECKING:
    from ksim.actuators import Actuators
    from ksim.commands import Command
    from ksim.engine import PhysicsEngine, StepContext
    from ksim.events import Event
    from ksim.observations import Observation
    from ksim.randomization import Randomization
    from ksim.resets import Reset
    from ksim.rewards import Reward
    from ksim.task.rl import RLConfig, SharedState
    from ksim.terminations import Termination

Array = jax.Array


class Episode(struct.PyTreeNode):
    """One env's running episode (or a batch with a leading env axis)."""

    data: mjx.Data
    obs: Array  # without observation noise (the policy's input gets it in step_env)
    last_action: Array
    episode_return: Array
    episode_length: Array
    rng: Array
    randomized: Randomized  # this episode's model fields and PD-gain scales (empty dicts: none)
    command: Array  # (command size,)
    command_timer: Array  # control steps until the command is redrawn
    event_timers: Array  # (num events,) control steps until each event
    action_queue: Array  # (action_delay_steps, action_dim) chosen actions not yet applied, oldest first


class Trajectory(struct.PyTreeNode):
    """A rollout, time-major: leaves are (rollout_length, num_envs, ...)."""

    obs: Array
    next_obs: Array  # before any automatic reset, for bootstrapping
    action: Array
    reward: Array
    terminated: Array
    truncated: Array


class Transition(struct.PyTreeNode):
    trajectory: Trajectory
    episode_return: Array  # running return, final at `done`
    episode_length: Array
    reward_terms: dict[str, Array]


class EnvMixin:
    """Starting and stepping one env of an `RLTask` (which provides the attributes declared below)."""

    if TYPE_CHECKING:
        config: RLConfig
        engine: PhysicsEngine
        observations: tuple[Observation, ...]
        rewards: tuple[Reward, ...]
        reward_names: list[str]
        terminations: tuple[Termination, ...]
        resets: tuple[Reset, ...]
        randomizations: tuple[Randomization, ...]
        command: Command | None
        events: tuple[Event, ...]
        actuators: Actuators

        @property
        def max_episode_steps(self) -> int: ...
        def observation_layout(self) -> list[tuple[str, int]]: ...
        def sample_action(self, shared: SharedState, obs: Array, rng: Array, deterministic: bool = False) -> Array: ...

    def observe(self, ctx: StepContext) -> Array:
        return jnp.concatenate([jnp.ravel(obs.observe(ctx)) for obs in self.observations])

    @functools.cached_property
    def noise_scales(self) -> tuple[np.ndarray, np.ndarray]:
        return noise_scales(self.observations, [size for _, size in self.observation_layout()])

    @functools.cached_property
    def _start_shapes(self) -> tuple[Episode, list[jax.ShapeDtypeStruct]]:
        """One trace of an episode start: the shapes of its state and of each observation component."""

        def start(rng: Array) -> tuple[Episode, list[Array]]:
            episode = self.start_episode(rng)
            data, no_action = episode.data, episode.last_action
            ctx = self.engine.context(data, data, no_action, no_action, data.ctrl, episode.command)
            return episode, [jnp.ravel(obs.observe(ctx)) for obs in self.observations]

        return jax.eval_shape(start, jax.random.PRNGKey(0))

    @property
    def episode_shape(self) -> Episode:
        """One env's `Episode` as shapes and dtypes (`jax.ShapeDtypeStruct` leaves)."""
        return self._start_shapes[0]

    @property
    def observation_sizes(self) -> list[int]:
        """The size of each observation component, in the order they fill the observation vector."""
        return [int(shape.size) for shape in self._start_shapes[1]]

    def noisy_observations(self, deterministic: bool) -> bool:
        """Noise goes into training rollouts; into evaluation only with eval_observation_noise."""
        has_noise = any(obs.noise > 0 for obs in self.observations)
        return has_noise and (not deterministic or self.config.eval_observation_noise)

    def start_episode(self, rng: Array) -> Episode:
        """A new episode of one env: default pose perturbed by the task's resets, model randomized, a command."""
        engine, ctrl_dt = self.engine, self.config.ctrl_dt
        randomize_key, command_key, event_key = jax.random.split(jax.random.fold_in(rng, 1), 3)
        rng, *reset_keys = jax.random.split(rng, len(self.resets) + 1)
        qpos = jnp.asarray(engine.default_qpos, dtype=jnp.float32)
        qvel = jnp.zeros(engine.mj_model.nv)
        for reset, key in zip(self.resets, reset_keys, strict=True):
            qpos, qvel = reset.apply(qpos, qvel, engine.layout, key)
        drawn = sample_randomizations(self.randomizations, engine.mjx_model, engine.layout, randomize_key)
        gain_scales, fields = self.actuators.apply_gain_scales(drawn.gain_scales, drawn.model_fields, engine.mjx_model)
        randomized = Randomized(model_fields=fields, gain_scales=gain_scales)
        data = engine.make_data(qpos, qvel, randomized.model_fields)
        no_action = jnp.zeros(engine.action_dim)
        command, command_timer = start_command(self.command, command_key, ctrl_dt)
        obs = self.observe(engine.context(data, data, no_action, no_action, data.ctrl, command))
        return Episode(
            data=data,
            obs=obs,
            last_action=no_action,
            episode_return=jnp.zeros(()),
            episode_length=jnp.zeros((), jnp.int32),
            rng=rng,
            randomized=randomized,
            command=command,
            command_timer=command_timer,
            event_timers=start_event_timers(self.events, event_key, ctrl_dt),
            action_queue=jnp.zeros((self.config.action_delay_steps, engine.action_dim)),
        )

    def step_env(
        self, shared: SharedState, episode: Episode, deterministic: bool = False
    ) -> tuple[Episode, Transition]:
        """One control step of one env's episode (no reset: the rollout swaps in the next start)."""
        engine, ctrl_dt = self.engine, self.config.ctrl_dt
        rng, action_key = jax.random.split(episode.rng)
        noise_key, event_key, command_key = jax.random.split(jax.random.fold_in(action_key, 1), 3)
        obs = (
            add_noise(episode.obs, self.noise_scales, noise_key)
            if self.noisy_observations(deterministic)
            else episode.obs
        )
        action = self.sample_action(shared, obs, action_key, deterministic)
        applied, action_queue = delay_action(episode.action_queue, action)
        data, event_timers = run_events(
            self.events, episode.data, episode.event_timers, engine.layout, event_key, ctrl_dt
        )
        gain_scales, fields = episode.randomized.gain_scales, episode.randomized.model_fields
        if self.events:  # events (pushes) change velocities; the physics step expects them reflected
            data = engine.velocities_changed(data, fields)
        data, ctrl = engine.step(data, lambda data: self.actuators.ctrl(applied, data, gain_scales), fields)
        ctx = engine.context(data, episode.data, action, episode.last_action, ctrl, episode.command)
        diverged = physics_diverged(ctx)
        command, command_timer = advance_command(
            self.command, episode.command, episode.command_timer, command_key, ctrl_dt
        )
        next_obs = jnp.where(diverged, 0.0, self.observe(ctx.replace(command=command)))
        reward_terms = {name: reward(ctx) for name, reward in zip(self.reward_names, self.rewards, strict=True)}
        reward = jnp.where(diverged, 0.0, sum(reward_terms.values(), jnp.zeros(())))
        terminated = functools.reduce(jnp.logical_or, (t.terminated(ctx) for t in self.terminations), diverged)
        episode_length = episode.episode_length + 1
        truncated = (episode_length >= self.max_episode_steps) & ~terminated
        episode_return = episode.episode_return + reward
        stepped = episode.replace(
            data=data,
            obs=next_obs,
            last_action=action,
            episode_return=episode_return,
            episode_length=episode_length,
            rng=rng,
            command=command,
            command_timer=command_timer,
            event_timers=event_timers,
            action_queue=action_queue,
        )
        trajectory = Trajectory(obs, next_obs, action, reward, terminated, truncated)
        return stepped, Transition(trajectory, episode_return, episode_length, reward_terms)
