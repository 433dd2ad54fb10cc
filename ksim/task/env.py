"""One environment: an episode's state, how it starts (resets, randomization, command, event timers) and
one control step of it (noise, action delay, events, physics, rewards, terminations).

`Environment` takes the engine, the components and the policy it needs as arguments (an `RLTask` builds
one). Everything here works on a single env; the rollout vmaps it over a shard's envs, so every per-env
field has a leading env axis there and pmap shards it with the envs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from ksim.actuators import Actuators, delay_action
from ksim.binding import bind_all
from ksim.commands import Command, advance_command, check_command_users, command_ended, start_command
from ksim.engine import ModelLayout, PhysicsEngine, StepContext
from ksim.events import Event, run_events, start_event_timers
from ksim.learner.memory import PolicyState
from ksim.observations import Observation, add_noise, check_noise, noise_scales
from ksim.randomization import (
    Randomization,
    Randomized,
    check_randomizations,
    check_scaled_fields,
    sample_randomizations,
)
from ksim.reporting import unique_names
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.stateful import Stateful
from ksim.task.types import Episode, PolicyOutput, Trajectory, Transition
from ksim.terminations import Termination, physics_diverged
from ksim.terrain import Terrain, TerrainCells, free_base_position

Array = jax.Array


class Policy(Protocol):
    """What acts in an env. The shared state is the learner's (parameters, normalisers); this module passes
    it and the per-env policy state through without looking inside."""

    def initial_policy_state(self) -> PolicyState:
        """One env's policy state at the start of every episode."""
        ...

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
        """One env's action from its (noised) observation frame; `first`: the episode's first step."""
        ...


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
    critic_observations: tuple[Observation, ...] | None = None  # None: the critic reads the actor's input

    @functools.cached_property
    def reward_names(self) -> list[str]:
        return unique_names([reward.name for reward in self.rewards])

    @functools.cached_property
    def termination_names(self) -> list[str]:
        return unique_names([termination.name for termination in self.terminations])

    @functools.cached_property
    def stateful(self) -> list[tuple[str, Stateful]]:
        """The stateful rewards and terminations, each with its key in `Episode.component_state`."""
        components = [c for c in (*self.rewards, *self.terminations) if isinstance(c, Stateful)]
        return list(zip(unique_names([type(c).__name__ for c in components]), components, strict=True))

    def with_state(self, component: object, ctx: StepContext, states: dict[str, Any]) -> StepContext:
        """`ctx` with `component`'s own state in `ctx.state` (unchanged for a stateless component)."""
        for key, stateful in self.stateful:
            if stateful is component:
                return ctx.replace(state=states[key])
        return ctx


def bind_components(
    layout: ModelLayout,
    mj_model: mujoco.MjModel,
    observations: Sequence[Observation],
    critic_observations: Sequence[Observation] | None,
    rewards: Sequence[Reward],
    terminations: Sequence[Termination],
    resets: Sequence[Reset],
    randomizations: Sequence[Randomization],
    command: Command | None,
    events: Sequence[Event],
    actuators: Actuators,
) -> Components:
    """A task's components, each bound to the model's layout (its names resolved once); ConfigError for one
    that cannot apply (an unknown name, a command nobody reads, noise on the wrong axes, a randomization the
    actuators cannot take or a model field of zeros it would scale)."""
    actor_group = bind_all(layout, observations)
    critic_group = None if critic_observations is None else bind_all(layout, critic_observations)
    bound_rewards, bound_terminations = bind_all(layout, rewards), bind_all(layout, terminations)
    bound_resets, bound_randomizations = bind_all(layout, resets), bind_all(layout, randomizations)
    bound_command = None if command is None else command.bind(layout)
    bound = Components(
        actor_group,
        bound_rewards,
        bound_terminations,
        bound_resets,
        bound_randomizations,
        bound_command,
        bind_all(layout, events),
        actuators,
        critic_group,
    )
    observers = (*bound.observations, *(bound.critic_observations or ()))
    check_command_users(bound.command, (*observers, *bound.rewards))
    check_noise(bound.observations)
    check_randomizations(bound.randomizations, actuators)
    check_scaled_fields(bound.randomizations, mj_model)
    return bound


@dataclass(frozen=True)
class EnvSettings:
    """The per-env settings of a task's config."""

    ctrl_dt: float
    max_episode_steps: int
    action_delay_steps: int = 0
    eval_observation_noise: bool = False
    gamma: float = 0.99  # discounts Episode.discounted_return
    eval_events: bool = True


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

    def observe_critic(self, ctx: StepContext) -> Array:
        """The critic's own observations (never noised); empty without a critic group."""
        group = self.components.critic_observations
        if group is None:
            return jnp.zeros(0)
        return jnp.concatenate([jnp.ravel(obs.observe(ctx)) for obs in group])

    @functools.cached_property
    def noise_scales(self) -> tuple[np.ndarray, np.ndarray]:
        return noise_scales(self.components.observations, self.observation_sizes)

    @functools.cached_property
    def _start_shapes(self) -> tuple[Episode, list[jax.ShapeDtypeStruct]]:
        """One trace of an episode start: the shapes of its state and of each observation component."""

        def start(rng: Array) -> tuple[Episode, list[Array]]:
            # No policy state here: its shape depends on the observations' (the policy's memory holds frames).
            episode = self.start_episode(rng, policy_state=PolicyState(jnp.zeros((0, 0)), jnp.zeros((2, 0))))
            data, no_action = episode.data, episode.last_action
            ctx = self.engine.context(data, data, no_action, no_action, data.ctrl, episode.command)
            critic_group = self.components.critic_observations or ()
            return episode, [jnp.ravel(obs.observe(ctx)) for obs in (*self.components.observations, *critic_group)]

        return jax.eval_shape(start, jax.random.PRNGKey(0))

    @property
    def episode_shape(self) -> Episode:
        """One env's `Episode` as shapes and dtypes (`jax.ShapeDtypeStruct` leaves)."""
        return self._start_shapes[0].replace(policy_state=jax.eval_shape(self.policy.initial_policy_state))

    @property
    def observation_sizes(self) -> list[int]:
        """The size of each observation component, in the order they fill the observation vector."""
        return [int(shape.size) for shape in self._start_shapes[1][: len(self.components.observations)]]

    def observation_layout(self) -> list[tuple[str, int]]:
        """(name, size) of each observation component, in the order they fill the observation vector."""
        names = unique_names([obs.name for obs in self.components.observations])
        return list(zip(names, self.observation_sizes, strict=True))

    def critic_observation_layout(self) -> list[tuple[str, int]] | None:
        """(name, size) of each of the critic's own observations; None: the critic reads the actor's input."""
        group = self.components.critic_observations
        if group is None:
            return None
        sizes = [int(shape.size) for shape in self._start_shapes[1][len(self.components.observations) :]]
        return list(zip(unique_names([obs.name for obs in group]), sizes, strict=True))

    @functools.cached_property
    def observation_dim(self) -> int:
        """The size of one observation frame (the policy sees observation_history of them)."""
        return sum(self.observation_sizes)

    @functools.cached_property
    def critic_observation_dim(self) -> int:
        """The size of the critic's own observations (0: it reads the actor's input)."""
        return sum(size for _, size in self.critic_observation_layout() or [])

    def noisy_observations(self, deterministic: bool) -> bool:
        """Noise goes into training rollouts; into evaluation only with eval_observation_noise."""
        has_noise = any(obs.noise > 0 for obs in self.components.observations)
        return has_noise and (not deterministic or self.settings.eval_observation_noise)

    def active_events(self, deterministic: bool) -> tuple[Event, ...]:
        """The events (pushes) of training rollouts; of evaluation unless eval_events is off."""
        return self.components.events if not deterministic or self.settings.eval_events else ()

    def start_episode(
        self,
        rng: Array,
        cell: TerrainCells | None = None,
        policy_state: PolicyState | None = None,
        start_failures: Array | None = None,
        from_beginning: bool = False,
    ) -> Episode:
        """A new episode of one env: a command, the pose it starts from (the model's default, or the command's:
        a motion's frame) perturbed by the task's resets, model randomized, the policy's initial state (unless
        `policy_state` is given); with a terrain, the pose moved onto the centre platform of `cell`'s tile.
        `start_failures`: the shard's recent failures per start bin of the command (None: none yet);
        `from_beginning`: an evaluation's start (a motion from its first frame)."""
        engine, parts, ctrl_dt = self.engine, self.components, self.settings.ctrl_dt
        randomize_key, command_key, event_key = jax.random.split(jax.random.fold_in(rng, 1), 3)
        rng, *reset_keys = jax.random.split(rng, len(parts.resets) + 1)
        qpos = jnp.asarray(engine.default_qpos, dtype=jnp.float32)
        if self.terrain is not None and cell is not None:
            spawn = self.terrain.spawn_offset(cell, jax.random.fold_in(rng, 2), self.spawn_jitter)
            qpos = qpos.at[free_base_position(engine.layout)].add(spawn)
        qvel = jnp.zeros(engine.mj_model.nv)
        bins = 0 if parts.command is None else parts.command.start_bins
        failures = jnp.zeros(bins) if start_failures is None else start_failures
        command, command_state = start_command(parts.command, command_key, ctrl_dt, failures, from_beginning)
        if parts.command is not None:
            qpos, qvel = parts.command.start_pose(command_state, qpos, qvel)
        for reset, key in zip(parts.resets, reset_keys, strict=True):
            qpos, qvel = reset.apply(qpos, qvel, engine.layout, key)
        drawn = sample_randomizations(parts.randomizations, engine.field_defaults, engine.layout, randomize_key)
        gain_scales, fields = parts.actuators.apply_gain_scales(
            drawn.gain_scales, drawn.model_fields, engine.field_defaults
        )
        randomized = Randomized(model_fields=fields, gain_scales=gain_scales)
        data = engine.make_data(qpos, qvel, randomized.model_fields)
        no_action = jnp.zeros(engine.action_dim)
        ctx = engine.context(data, data, no_action, no_action, data.ctrl, command)
        component_state = {key: c.initial_state(engine.layout) for key, c in parts.stateful}
        return Episode(
            data=data,
            obs=self.observe(ctx),
            critic_obs=self.observe_critic(ctx),
            policy_state=self.policy.initial_policy_state() if policy_state is None else policy_state,
            last_action=no_action,
            episode_return=jnp.zeros(()),
            episode_length=jnp.zeros((), jnp.int32),
            discounted_return=jnp.zeros(()),
            rng=rng,
            randomized=randomized,
            command=command,
            command_state=command_state,
            event_timers=start_event_timers(parts.events, event_key, ctrl_dt),
            action_queue=jnp.zeros((self.settings.action_delay_steps, engine.action_dim)),
            component_state=component_state,
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
        first = episode.episode_length == 0
        chosen = self.policy.act(
            shared, episode.policy_state, obs, episode.critic_obs, first, action_key, deterministic
        )
        action = chosen.action
        applied, action_queue = delay_action(episode.action_queue, action)
        gain_scales, fields = episode.randomized.gain_scales, episode.randomized.model_fields
        data, event_timers = episode.data, episode.event_timers
        if events := self.active_events(deterministic):
            data, event_timers = run_events(events, data, event_timers, engine.layout, event_key, ctrl_dt)
            data = engine.velocities_changed(data, fields)  # pushes change velocities: the step expects them reflected
        data, ctrl = engine.step(data, lambda data: parts.actuators.ctrl(applied, data, gain_scales), fields)
        ctx = engine.context(data, episode.data, action, episode.last_action, ctrl, episode.command)
        diverged = physics_diverged(ctx)
        command, command_state = advance_command(
            parts.command, episode.command, episode.command_state, command_key, ctrl_dt
        )
        next_obs = jnp.where(diverged, 0.0, self.observe(ctx.replace(command=command)))
        next_critic_obs = jnp.where(diverged, 0.0, self.observe_critic(ctx.replace(command=command)))
        terminated, _, reward_terms, reward, component_state = judge_step(parts, ctx, episode.component_state)
        episode_length = episode.episode_length + 1
        out_of_time = episode_length >= self.settings.max_episode_steps
        truncated = (out_of_time | command_ended(parts.command, command_state)) & ~terminated
        episode_return = episode.episode_return + reward
        discounted_return = episode.discounted_return * self.settings.gamma + reward
        stepped = episode.replace(
            data=data,
            obs=next_obs,
            critic_obs=next_critic_obs,
            policy_state=chosen.state,
            last_action=action,
            episode_return=episode_return,
            episode_length=episode_length,
            discounted_return=discounted_return,
            rng=rng,
            command=command,
            command_state=command_state,
            event_timers=event_timers,
            action_queue=action_queue,
            component_state=component_state,
        )
        trajectory = Trajectory(
            obs=chosen.obs,
            next_obs=next_obs,
            action=action,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            log_prob=chosen.log_prob,
            critic_obs=episode.critic_obs,
            next_critic_obs=next_critic_obs,
            carry=chosen.carry,
            discounted_return=discounted_return,
        )
        return stepped, Transition(trajectory, episode_return, episode_length, reward_terms)


def termination_flags(parts: Components, ctx: StepContext, states: dict[str, Any]) -> Array:
    """Which of the task's terminations end this control step, in `parts.termination_names`' order (T,)."""
    flags = [t.terminated(parts.with_state(t, ctx, states)) for t in parts.terminations]
    return jnp.stack(flags) if flags else jnp.zeros(0, bool)


def judge_step(
    parts: Components, ctx: StepContext, states: dict[str, Any]
) -> tuple[Array, Array, dict[str, Array], Array, dict[str, Any]]:
    """What the task's terminations and rewards make of one control step: (terminated, which terminations fired
    (`termination_flags`), reward terms, reward, the stateful components' next state); a step whose physics
    diverged terminates and earns nothing."""
    diverged = physics_diverged(ctx)
    flags = termination_flags(parts, ctx, states)
    terminated = diverged | jnp.any(flags)
    ended = ctx.replace(terminated=terminated)  # a termination penalty reads it
    reward_terms = {
        name: reward(parts.with_state(reward, ended, states))
        for name, reward in zip(parts.reward_names, parts.rewards, strict=True)
    }
    reward = jnp.where(diverged, 0.0, sum(reward_terms.values(), jnp.zeros(())))
    component_state = {key: c.next_state(ctx.replace(state=states[key])) for key, c in parts.stateful}
    return terminated, flags, reward_terms, reward, component_state
