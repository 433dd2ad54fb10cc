"""One environment: an episode's state, how it starts (resets, randomization, command, event timers) and
one control step of it (noise, action delay, events, physics, rewards, terminations).

`Environment` takes the engine, the components and the policy it needs as arguments (an `RLTask` builds
one). Everything here works on a single env; the rollout vmaps it over a shard's envs, so every per-env
field has a leading env axis there and pmap shards it with the envs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ksim.actuators import Actuators, delay_action
from ksim.commands import Command, advance_command, start_command
from ksim.engine import PhysicsEngine, StepContext
from ksim.events import Event, run_events, start_event_timers
from ksim.observations import Observation, add_noise, noise_scales
from ksim.randomization import Randomization, Randomized, sample_randomizations
from ksim.reporting import unique_names
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.task.types import Episode, Trajectory, Transition
from ksim.terminations import Termination, physics_diverged
from ksim.terrain import Terrain, TerrainCells, free_base_position

Array = jax.Array
# The policy: (shared state, one env's observation, a key, deterministic) -> action. The shared state is the
# learner's (parameters, normaliser); this module passes it through without looking inside.
Policy = Callable[[Any, Array, Array, bool], Array]


@dataclass(frozen=True)
class Components:
    """What a task puts into its envs: observations, rewards, terminations, resets, randomizations,
    command, events and actuators."""

    observations: tuple[Observation, ...]
    rewards: tuple[Reward, ...]
    terminations: tuple[Termination, ...]
    resets: tuple[Reset, ...]
    randomizations: tuple[Randomization, ...]
    command: Command | None
    events: tuple[Event, ...]
    actuators: Actuators

    @functools.cached_property
    def reward_names(self) -> list[str]:
        return unique_names([reward.name for reward in self.rewards])


@dataclass(frozen=True)
class EnvSettings:
    """The per-env settings of a task's config."""

    ctrl_dt: float
    max_episode_steps: int
    action_delay_steps: int = 0
    eval_observation_noise: bool = False


@dataclass(frozen=True)
class Environment:
    """Starting and stepping one env: the engine, the components, the settings and the policy it acts with."""

    engine: PhysicsEngine
    components: Components
    settings: EnvSettings
    policy: Policy
    terrain: Terrain | None = None
    spawn_jitter: float = 0.0  # m in x and y around a tile's centre (terrain only)

    def observe(self, ctx: StepContext) -> Array:
        return jnp.concatenate([jnp.ravel(obs.observe(ctx)) for obs in self.components.observations])

    @functools.cached_property
    def noise_scales(self) -> tuple[np.ndarray, np.ndarray]:
        return noise_scales(self.components.observations, self.observation_sizes)

    @functools.cached_property
    def _start_shapes(self) -> tuple[Episode, list[jax.ShapeDtypeStruct]]:
        """One trace of an episode start: the shapes of its state and of each observation component."""

        def start(rng: Array) -> tuple[Episode, list[Array]]:
            episode = self.start_episode(rng)
            data, no_action = episode.data, episode.last_action
            ctx = self.engine.context(data, data, no_action, no_action, data.ctrl, episode.command)
            return episode, [jnp.ravel(obs.observe(ctx)) for obs in self.components.observations]

        return jax.eval_shape(start, jax.random.PRNGKey(0))

    @property
    def episode_shape(self) -> Episode:
        """One env's `Episode` as shapes and dtypes (`jax.ShapeDtypeStruct` leaves)."""
        return self._start_shapes[0]

    @property
    def observation_sizes(self) -> list[int]:
        """The size of each observation component, in the order they fill the observation vector."""
        return [int(shape.size) for shape in self._start_shapes[1]]

    def observation_layout(self) -> list[tuple[str, int]]:
        """(name, size) of each observation component, in the order they fill the observation vector."""
        names = unique_names([obs.name for obs in self.components.observations])
        return list(zip(names, self.observation_sizes, strict=True))

    def noisy_observations(self, deterministic: bool) -> bool:
        """Noise goes into training rollouts; into evaluation only with eval_observation_noise."""
        has_noise = any(obs.noise > 0 for obs in self.components.observations)
        return has_noise and (not deterministic or self.settings.eval_observation_noise)

    def start_episode(self, rng: Array, cell: TerrainCells | None = None) -> Episode:
        """A new episode of one env: default pose perturbed by the task's resets, model randomized, a command;
        with a terrain, the pose moved onto the centre platform of `cell`'s tile."""
        engine, parts, ctrl_dt = self.engine, self.components, self.settings.ctrl_dt
        randomize_key, command_key, event_key = jax.random.split(jax.random.fold_in(rng, 1), 3)
        rng, *reset_keys = jax.random.split(rng, len(parts.resets) + 1)
        qpos = jnp.asarray(engine.default_qpos, dtype=jnp.float32)
        if self.terrain is not None and cell is not None:
            spawn = self.terrain.spawn_offset(cell, jax.random.fold_in(rng, 2), self.spawn_jitter)
            qpos = qpos.at[free_base_position(engine.layout)].add(spawn)
        qvel = jnp.zeros(engine.mj_model.nv)
        for reset, key in zip(parts.resets, reset_keys, strict=True):
            qpos, qvel = reset.apply(qpos, qvel, engine.layout, key)
        drawn = sample_randomizations(parts.randomizations, engine.mjx_model, engine.layout, randomize_key)
        gain_scales, fields = parts.actuators.apply_gain_scales(drawn.gain_scales, drawn.model_fields, engine.mjx_model)
        randomized = Randomized(model_fields=fields, gain_scales=gain_scales)
        data = engine.make_data(qpos, qvel, randomized.model_fields)
        no_action = jnp.zeros(engine.action_dim)
        command, command_timer = start_command(parts.command, command_key, ctrl_dt)
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
            event_timers=start_event_timers(parts.events, event_key, ctrl_dt),
            action_queue=jnp.zeros((self.settings.action_delay_steps, engine.action_dim)),
        )

    def step_env(self, shared: Any, episode: Episode, deterministic: bool = False) -> tuple[Episode, Transition]:
        """One control step of one env's episode (no reset: the rollout swaps in the next start)."""
        engine, parts, ctrl_dt = self.engine, self.components, self.settings.ctrl_dt
        rng, action_key = jax.random.split(episode.rng)
        noise_key, event_key, command_key = jax.random.split(jax.random.fold_in(action_key, 1), 3)
        obs = (
            add_noise(episode.obs, self.noise_scales, noise_key)
            if self.noisy_observations(deterministic)
            else episode.obs
        )
        action = self.policy(shared, obs, action_key, deterministic)
        applied, action_queue = delay_action(episode.action_queue, action)
        data, event_timers = run_events(
            parts.events, episode.data, episode.event_timers, engine.layout, event_key, ctrl_dt
        )
        gain_scales, fields = episode.randomized.gain_scales, episode.randomized.model_fields
        if parts.events:  # events (pushes) change velocities; the physics step expects them reflected
            data = engine.velocities_changed(data, fields)
        data, ctrl = engine.step(data, lambda data: parts.actuators.ctrl(applied, data, gain_scales), fields)
        ctx = engine.context(data, episode.data, action, episode.last_action, ctrl, episode.command)
        diverged = physics_diverged(ctx)
        command, command_timer = advance_command(
            parts.command, episode.command, episode.command_timer, command_key, ctrl_dt
        )
        next_obs = jnp.where(diverged, 0.0, self.observe(ctx.replace(command=command)))
        reward_terms = {name: reward(ctx) for name, reward in zip(parts.reward_names, parts.rewards, strict=True)}
        reward = jnp.where(diverged, 0.0, sum(reward_terms.values(), jnp.zeros(())))
        terminated = functools.reduce(jnp.logical_or, (t.terminated(ctx) for t in parts.terminations), diverged)
        episode_length = episode.episode_length + 1
        truncated = (episode_length >= self.settings.max_episode_steps) & ~terminated
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
