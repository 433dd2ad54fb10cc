"""RLTask: MJX environments, rollouts with automatic resets, and the per-shard programs.

The per-shard logic (`reset_shard`, `rollout_shard`, `update_shard`, `train_step_shard`) consists of pure
functions of explicit state pytrees. `RLTask` compiles them with `jax.jit`; `DistributedRLTask` compiles
the same functions with `jax.pmap` and fills in the cross-device hooks (`cross_device_mean`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import optax
from omegaconf import OmegaConf

from ksim.actuators import Actuators
from ksim.binding import bind_all
from ksim.checkpoint import check_metadata, load_metadata
from ksim.commands import Command, VelocityCommand, check_command_users
from ksim.config import (
    ConfigError,
    parse_command_line,
    require_choice,
    require_divisible,
    require_non_negative,
    require_positive,
)
from ksim.engine import PhysicsEngine, substeps_divide
from ksim.events import Event
from ksim.normalization import Normalizer
from ksim.observations import Observation, check_noise
from ksim.physics import PHYSICS_IMPLS, create_engine
from ksim.randomization import Randomization, check_randomizations
from ksim.reporting import SCALARS_FILE, MetricsLogger
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.task.checkpointing import (
    action_layout,
    checkpoint_contents,
    checkpoint_metadata,
    load_run_checkpoint,
    save_run_checkpoint,
)
from ksim.task.env import Components, Environment, EnvSettings
from ksim.task.evaluation import EvalResult, Evaluator, eval_line, report_evaluation, summary_scalars
from ksim.task.loop import AheadOfTimeProgram, ProcessHooks, compile_programs, run_training
from ksim.task.types import (
    EnvState,
    Episode,
    PolicyOutput,
    PolicyState,
    RLConfig,
    SharedState,
    TrainState,
    Trajectory,
    Transition,
)
from ksim.terminations import Termination
from ksim.terrain import Terrain, TerrainCells, TerrainCurriculum, TerrainGrid, initial_cells
from ksim.viewer_settings import ViewSettings, check_geom_groups, check_view_port, command_ranges
from ksim.wandb_logging import WANDB_EXTRA, WandbRun

Array = jax.Array
Metrics = dict[str, Array]
Program = Any  # a jitted or pmapped function: callable, and `.lower(...)` compiles it ahead of time


ConfigT = TypeVar("ConfigT", bound=RLConfig)


def select_envs(mask: Array, if_true: Any, if_false: Any) -> Any:
    """Per env (leading axis), the leaves of `if_true` where `mask` holds, else those of `if_false`."""

    def pick(a: Array, b: Array) -> Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)

    return jax.tree.map(pick, if_true, if_false)


class RLTask(ABC, Generic[ConfigT]):
    """An RL task on MJX: subclass it with a robot model and components, and an algorithm (PPOTask)."""

    config: ConfigT

    def __init__(self, config: ConfigT) -> None:
        self.config = config
        self.validate_config()
        self.terrain = self.build_terrain()
        self.engine = self.get_engine()
        # Every component resolves its names once, here; refusals come before anything compiles.
        layout = self.engine.layout
        self.observations = bind_all(layout, self.get_observations())
        critic_group = self.get_critic_observations()
        self.critic_observations = None if critic_group is None else bind_all(layout, critic_group)
        self.rewards = bind_all(layout, self.get_rewards())
        self.terminations = bind_all(layout, self.get_terminations())
        self.resets = bind_all(layout, self.get_resets())
        self.randomizations = bind_all(layout, self.get_randomizations())
        command = self.get_command()
        self.command = None if command is None else command.bind(layout)
        self.events = bind_all(layout, self.get_events())
        observers = (*self.observations, *(self.critic_observations or ()))
        check_command_users(self.command, (*observers, *self.rewards))
        check_noise(self.observations)
        self.actuators = self.get_actuators()
        check_randomizations(self.randomizations, self.actuators)
        self.curriculum = self.get_terrain_curriculum()
        spawn_jitter = self.check_terrain_use()
        components = Components(
            self.observations,
            self.rewards,
            self.terminations,
            self.resets,
            self.randomizations,
            self.command,
            self.events,
            self.actuators,
            self.critic_observations,
        )
        settings = EnvSettings(
            config.ctrl_dt, self.max_episode_steps, config.action_delay_steps, config.eval_observation_noise
        )
        self.environment = Environment(self.engine, components, settings, self, self.terrain, spawn_jitter)
        self.evaluator = Evaluator(
            self.environment, config.eval_episodes, config.seed, self.eval_terrain_level, self.eval_terrain_column
        )
        self.reward_names = components.reward_names
        self.model = self.get_model()
        self.optimizer = self.get_optimizer()
        self._compiled: dict[str, Program] = {}
        self.wandb_run: WandbRun | None = None
        if config.compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", os.path.expanduser(config.compilation_cache_dir))
            # Every program, also the small ones (RNG splits, network init) that add up to seconds at startup.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    # ----- what a task defines ---------------------------------------------------------------------------

    @abstractmethod
    def get_mujoco_model(self) -> mujoco.MjModel | mujoco.MjSpec:
        """The robot's model; an `MjSpec` (ksim.terrain.load_mujoco_spec) when the task has a terrain."""

    def get_terrain(self) -> TerrainGrid | None:
        """Rough terrain (ksim.terrain): one heightfield added to the model; None keeps the model's floor."""
        return None

    def get_terrain_curriculum(self) -> TerrainCurriculum | None:
        """Moves envs between the terrain's levels at their episodes' ends (needs a terrain and a velocity command)."""
        return None

    def build_terrain(self) -> Terrain | None:
        grid = self.get_terrain()
        return None if grid is None else grid.build()

    def build_mujoco_model(self) -> mujoco.MjModel:
        """The task's model, with the terrain's heightfield when it has one."""
        model = self.get_mujoco_model()
        if self.terrain is None:
            return model.compile() if isinstance(model, mujoco.MjSpec) else model
        if not isinstance(model, mujoco.MjSpec):
            raise ConfigError(
                "get_terrain needs get_mujoco_model to return a mujoco.MjSpec (ksim.terrain.load_mujoco_spec), so the "
                "terrain is added before the model compiles"
            )
        compiled = self.terrain.compile(model)
        self.terrain.check_model(compiled, uses_mjx=True)
        return compiled

    def check_terrain_use(self) -> float:
        """ConfigError for a curriculum without a terrain or velocity command, or an eval level off the grid;
        returns how far spawns may move around a tile's centre."""
        if self.terrain is None:
            if self.curriculum is not None:
                raise ConfigError("get_terrain_curriculum needs a terrain (get_terrain returns None)")
            return 0.0
        grid = self.terrain.grid
        if self.curriculum is not None:
            self.curriculum.check(grid)
            if not isinstance(self.command, VelocityCommand):
                raise ConfigError(
                    "get_terrain_curriculum needs a velocity command (get_command returning VelocityCommand): an env "
                    "moves down when it walks less than its command asked"
                )
        if not -1 <= self.config.eval_terrain_level < grid.num_levels:
            raise ConfigError(
                f"eval_terrain_level={self.config.eval_terrain_level} must be -1 (the middle level) or in "
                f"[0, {grid.num_levels})"
            )
        if self.config.eval_terrain_type and self.config.eval_terrain_type not in grid.types:
            raise ConfigError(
                f"eval_terrain_type={self.config.eval_terrain_type!r} must be empty or one of the terrain's types: "
                + ", ".join(grid.types)
            )
        engine = self.engine
        return self.terrain.spawn_jitter(engine.mj_model, engine.default_qpos, engine.layout.base_body)

    @property
    def eval_terrain_level(self) -> int:
        level = self.config.eval_terrain_level
        return level if level >= 0 or self.terrain is None else self.terrain.grid.num_levels // 2

    @property
    def eval_terrain_column(self) -> int | None:
        kind = self.config.eval_terrain_type
        return None if self.terrain is None or not kind else self.terrain.grid.types.index(kind)

    def get_engine(self) -> PhysicsEngine:
        """The physics engine; override to step the model differently."""
        config = self.config
        model, envs = self.build_mujoco_model(), max(config.num_envs, config.eval_episodes)  # most envs of one call
        return create_engine(
            model, config.ctrl_dt, config.dt, config.base_body, config.root_joints, config.physics_impl, envs
        )

    @abstractmethod
    def get_observations(self) -> Sequence[Observation]: ...

    def get_critic_observations(self) -> Sequence[Observation] | None:
        """The critic's own inputs (privileged: never noised, with their own normaliser); None: the actor's."""
        return None

    @abstractmethod
    def get_rewards(self) -> Sequence[Reward]: ...

    @abstractmethod
    def get_terminations(self) -> Sequence[Termination]: ...

    def get_resets(self) -> Sequence[Reset]:
        return ()

    def get_randomizations(self) -> Sequence[Randomization]:
        """Physical parameters drawn per env at every episode start (ksim.randomization)."""
        return ()

    def get_command(self) -> Command | None:
        """What the policy is asked to do (ksim.commands); `ctx.command` is empty without one."""
        return None

    def get_events(self) -> Sequence[Event]:
        """Things that happen during episodes, such as pushes (ksim.events)."""
        return ()

    @abstractmethod
    def get_actuators(self) -> Actuators:
        """Built from `self.engine.mj_model` (and `self.engine.default_qpos` for PD control)."""

    @abstractmethod
    def get_model(self) -> nn.Module: ...

    @abstractmethod
    def get_optimizer(self) -> optax.GradientTransformation: ...

    @abstractmethod
    def init_params(self, rng: Array) -> Any:
        """The model's initial parameters."""

    @abstractmethod
    def initial_policy_state(self) -> PolicyState:
        """One env's policy state at the start of every episode (ksim.task.memory)."""

    @abstractmethod
    def act(
        self,
        shared: SharedState,
        state: PolicyState,
        obs: Array,
        critic_obs: Array,
        first: Array,
        rng: Array,
        deterministic: bool = False,
    ) -> PolicyOutput:
        """The policy's action for one env's (noised) observation frame, and its next policy state."""

    @abstractmethod
    def update_shard(self, shared: SharedState, trajectory: Trajectory, rng: Array) -> tuple[SharedState, Metrics]:
        """The learning update from one shard's rollout (the RL algorithm); metrics reduced over shards."""

    # ----- configuration ---------------------------------------------------------------------------------

    def validate_config(self) -> None:
        """Raises ConfigError naming the setting and the rule; runs before anything is built or compiled."""
        config = self.config
        require_positive(config, "num_envs", "batch_size", "num_passes", "rollout_length_frames", "num_steps")
        require_positive(config, "ctrl_dt", "dt", "eval_episodes", "log_every_n_steps", "video_width", "video_height")
        require_non_negative(config, "save_every_n_steps", "eval_every_n_steps", "watchdog_timeout_s")
        require_non_negative(config, "keep_last_n_checkpoints", "action_delay_steps")
        if (config.episode_length_s is None) == (config.episode_length_steps is None):
            raise ConfigError(
                f"set exactly one of episode_length_s={config.episode_length_s} and "
                f"episode_length_steps={config.episode_length_steps} (the other one to null)"
            )
        require_positive(config, "episode_length_s" if config.episode_length_s is not None else "episode_length_steps")
        require_divisible("num_envs", config.num_envs, config.batch_size, f"batch_size={config.batch_size}")
        if not substeps_divide(config.ctrl_dt, config.dt):
            raise ConfigError(f"dt={config.dt} must divide ctrl_dt={config.ctrl_dt} into a whole number of steps")
        require_choice(config, "mode", ("train", "eval", "export", "view"))
        require_choice(config, "physics_impl", PHYSICS_IMPLS)
        if config.mode in ("eval", "export") and not config.load_from_ckpt_path:
            raise ConfigError(f"mode={config.mode!r} needs load_from_ckpt_path=<checkpoint file>")
        if config.mode == "export" and not config.export_path:
            raise ConfigError("mode='export' needs export_path=<file>.onnx")
        if config.export_path and not config.export_path.endswith(".onnx"):
            raise ConfigError(f"export_path={config.export_path!r} must end in .onnx")
        if config.video_path and not config.video_path.endswith((".mp4", ".gif")):
            raise ConfigError(f"video_path={config.video_path!r} must end in .mp4 or .gif")
        check_geom_groups(config.geom_groups)
        require_choice(config, "logger", ("tensorboard", "wandb"))
        if config.logger == "wandb" and importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"logger='wandb' needs the wandb package: {WANDB_EXTRA}")
        if config.mode == "view":
            check_view_port(config.view_port)

    @property
    def max_episode_steps(self) -> int:
        if self.config.episode_length_steps is not None:
            return self.config.episode_length_steps
        return max(1, round((self.config.episode_length_s or 0.0) / self.config.ctrl_dt))

    @property
    def num_minibatches(self) -> int:
        return self.config.num_envs // self.config.batch_size

    @property
    def env_steps_per_train_step(self) -> int:
        return self.config.num_envs * self.config.rollout_length_frames

    @functools.cached_property
    def observation_dim(self) -> int:
        """The size of one observation frame (the policy sees observation_history of them)."""
        return sum(size for _, size in self.environment.observation_layout())

    @functools.cached_property
    def critic_observation_dim(self) -> int:
        """The size of the critic's own observations (0: it reads the actor's input)."""
        return sum(size for _, size in self.environment.critic_observation_layout() or [])

    @property
    def task_name(self) -> str:
        return type(self).__name__

    # ----- cross-device hooks (identity on one device; DistributedRLTask reduces over its pmap axis) --------

    def cross_device_mean(self, tree: Any) -> Any:
        return tree

    def cross_device_sum(self, tree: Any) -> Any:
        return tree

    def shard_env_offset(self, num_envs: int) -> Array:
        """The global index of this shard's first env."""
        return jnp.zeros((), jnp.int32)

    def debug_print(self, tag: str, values: dict[str, Array]) -> None:
        """Prints traced values from inside the device program (DistributedRLTask, with debug=true)."""

    def compile(self, fn: Callable[..., Any], donate_argnums: tuple[int, ...] = ()) -> Program:
        """How per-shard functions become device programs (pmap in DistributedRLTask)."""
        on_cpu = jax.default_backend() == "cpu"  # the CPU runtime ignores donation and warns
        return jax.jit(fn, donate_argnums=() if on_cpu else donate_argnums)

    def place_replicated(self, tree: Any) -> Any:
        """Puts state that every shard shares on the device(s)."""
        return jax.device_put(tree)

    def place_env_keys(self, rng: Array) -> Array:
        """One key per global env on the device(s), so env i's randomness does not depend on the split."""
        return jax.device_put(jax.random.split(rng, self.config.num_envs))

    def fetch_replicated(self, tree: Any) -> Any:
        """Host copy of shared state (the first replica when replicated)."""
        return jax.device_get(tree)

    def after_train_step(self, state: TrainState, step: int) -> TrainState:
        """Runs on the host after each train step (distributed: replica sync and consistency check)."""
        return state

    def log_fields(self, env_steps_per_s: float) -> dict[str, float]:
        return {"env_steps_per_s": env_steps_per_s}

    @property
    def process_hooks(self) -> ProcessHooks | None:
        """How the training loop coordinates with other processes (None: this is the only one)."""
        return None

    @property
    def is_logging_process(self) -> bool:
        return jax.process_index() == 0

    # ----- per-shard programs (leading env axis = this shard's envs) -----------------------------------------

    def reset_shard(self, env_keys: Array) -> EnvState:
        """Envs with no episode yet (zeros of an episode's shape): their first control step starts one."""
        num_envs = env_keys.shape[0]
        no_episode = jax.tree.map(
            lambda leaf: jnp.zeros((num_envs, *leaf.shape), leaf.dtype), self.environment.episode_shape
        )
        return EnvState(
            current=no_episode,
            ended=jnp.ones(num_envs, bool),
            next_start=no_episode,
            next_start_ready=jnp.zeros(num_envs, bool),
            episodes_started=jnp.zeros(num_envs, jnp.int32),
            reset_key=env_keys,
            terrain=self.first_cells(env_keys),
        )

    def first_cells(self, env_keys: Array) -> TerrainCells:
        num_envs = env_keys.shape[0]
        if self.terrain is None:
            return TerrainCells(level=jnp.zeros(num_envs, jnp.int32), column=jnp.zeros(num_envs, jnp.int32))
        start_level = 0 if self.curriculum is None else self.curriculum.max_start_level
        env_index = self.shard_env_offset(num_envs) + jnp.arange(num_envs)
        return initial_cells(env_index, env_keys, len(self.terrain.grid.types), start_level)

    def next_cells(self, env: EnvState, ended_episode: Episode, ended: Array) -> TerrainCells:
        """The curriculum's step: the tiles of envs whose episode ended move by the curriculum's rule."""
        if self.terrain is None or self.curriculum is None:
            return env.terrain
        grid, curriculum = self.terrain.grid, self.curriculum
        base_xy = ended_episode.data.xpos[:, self.engine.layout.base_body, :2]
        walked = jnp.linalg.norm(base_xy - self.terrain.origin(env.terrain), axis=-1)
        episode_s = self.max_episode_steps * self.config.ctrl_dt
        commanded = jnp.linalg.norm(ended_episode.command[:, :2], axis=-1) * episode_s
        keys = jax.vmap(lambda key, count: jax.random.fold_in(jax.random.fold_in(key, count), 2))(
            env.reset_key, env.episodes_started
        )
        advance = functools.partial(curriculum.next_level, tile_size=grid.tile_size, num_levels=grid.num_levels)
        level = jax.vmap(advance)(env.terrain.level, walked, commanded, keys)
        return env.terrain.replace(level=jnp.where(ended, level, env.terrain.level))

    def refill_next_starts(self, env: EnvState) -> EnvState:
        """Computes the next episode start of every env whose start was used, a chunk of envs at a time (the
        engine's `refill_fraction` of them).

        Only envs that need a start are reset (gathered by index), so with MJX the reset work is about one per
        ended episode, not one per env.
        """
        num_envs = env.next_start_ready.shape[0]
        chunk = max(1, int(num_envs * self.engine.refill_fraction))  # MJX: num_envs // 8, as before the fraction

        def refill_chunk(env: EnvState) -> EnvState:
            (index,) = jnp.nonzero(~env.next_start_ready, size=chunk, fill_value=num_envs)  # num_envs: no env
            safe = jnp.minimum(index, num_envs - 1)
            keys = jax.vmap(jax.random.fold_in)(env.reset_key[safe], env.episodes_started[safe])
            fresh = jax.vmap(self.environment.start_episode)(keys, jax.tree.map(lambda cells: cells[safe], env.terrain))
            next_start = jax.tree.map(lambda pool, new: pool.at[index].set(new, mode="drop"), env.next_start, fresh)
            ready = env.next_start_ready.at[index].set(True, mode="drop")
            return env.replace(next_start=next_start, next_start_ready=ready)

        return jax.lax.while_loop(lambda env: jnp.any(~env.next_start_ready), refill_chunk, env)

    def refill_if(self, needed: Array, env: EnvState) -> EnvState:
        """Refills only when some env needs it: a real branch, so most control steps skip reset physics."""
        return jax.lax.cond(jnp.any(needed), self.refill_next_starts, lambda env: env, env)

    def step_shard(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Transition]:
        """One control step of every env; an env whose episode ended at the last step first starts its next."""
        starting = env.ended
        env = self.refill_if(starting & ~env.next_start_ready, env)
        current = select_envs(starting, env.next_start, env.current)
        stepped, transition = jax.vmap(self.environment.step_env, in_axes=(None, 0))(shared, current)
        ended = transition.trajectory.terminated | transition.trajectory.truncated
        env = env.replace(episodes_started=env.episodes_started + starting)
        cells = self.next_cells(env, stepped, ended)
        moved = cells.level != env.terrain.level  # a start computed ahead for the old tile is computed again
        env = env.replace(
            current=stepped,
            ended=ended,
            next_start_ready=env.next_start_ready & ~starting & ~moved,
            terrain=cells,
        )
        return env, transition

    def rollout_shard(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Trajectory, Metrics]:
        """`rollout_length_frames` steps of every env; episodes carry over into the next rollout."""

        def body(env: EnvState, _: None) -> tuple[EnvState, Transition]:
            return self.step_shard(shared, env)

        env, transitions = jax.lax.scan(body, env, None, length=self.config.rollout_length_frames)
        trajectory = transitions.trajectory
        done = trajectory.terminated | trajectory.truncated
        metrics = {
            "episodes_finished": jnp.sum(done, dtype=jnp.float32),
            "episode_return_sum": jnp.sum(jnp.where(done, transitions.episode_return, 0.0)),
            "episode_length_sum": jnp.sum(jnp.where(done, transitions.episode_length, 0), dtype=jnp.float32),
            "terminations": jnp.sum(trajectory.terminated, dtype=jnp.float32),
        }
        metrics |= {f"reward/{name}": jnp.mean(term) for name, term in transitions.reward_terms.items()}
        if self.terrain is not None:
            metrics["terrain/mean_level"] = jnp.mean(env.terrain.level.astype(jnp.float32))
        metrics["reward/total"] = jnp.mean(trajectory.reward)
        return env, trajectory, metrics

    def update_normalizers(self, shared: SharedState, trajectory: Trajectory) -> SharedState:
        """Folds a rollout's newest observation frames (and the critic's own observations) into the statistics."""
        newest = trajectory.obs[..., trajectory.obs.shape[-1] - self.observation_dim :]
        normalizer = self.update_normalizer(shared.normalizer, newest)
        if self.critic_observations is None:
            return shared.replace(normalizer=normalizer)
        critic_normalizer = self.update_normalizer(shared.critic_normalizer, trajectory.critic_obs)
        return shared.replace(normalizer=normalizer, critic_normalizer=critic_normalizer)

    def update_normalizer(self, normalizer: Normalizer, obs: Array) -> Normalizer:
        """Folds a rollout's observations into the running statistics, over all shards."""
        if not self.config.normalize_observations:
            return normalizer
        flat = obs.reshape(-1, obs.shape[-1])
        batch_mean = self.cross_device_mean(jnp.mean(flat, axis=0))
        batch_var = self.cross_device_mean(jnp.mean(jnp.square(flat - batch_mean), axis=0))
        batch_count = self.cross_device_sum(jnp.asarray(flat.shape[0], jnp.float32))
        return normalizer.merge(batch_mean, batch_var, batch_count)

    def train_step_shard(self, state: TrainState) -> tuple[TrainState, Metrics]:
        """Rollout, then update, then new observation statistics (used from the next rollout on)."""
        update_key, rng = jax.random.split(state.rng)
        env, trajectory, rollout_metrics = self.rollout_shard(state.shared, state.env)
        self.debug_print("rollout", {k: rollout_metrics[k] for k in ("episodes_finished", "episode_return_sum")})
        shared, update_metrics = self.update_shard(state.shared, trajectory, update_key)
        shared = self.update_normalizers(shared, trajectory)
        return TrainState(shared=shared, env=env, rng=rng), self.reduce_rollout_metrics(
            rollout_metrics
        ) | update_metrics

    def reduce_rollout_metrics(self, metrics: Metrics) -> Metrics:
        """Episode counts and sums add up over shards; per-step reward means average."""
        averaged = ("reward/", "terrain/")
        sums = {k: v for k, v in metrics.items() if not k.startswith(averaged)}
        means = {k: v for k, v in metrics.items() if k.startswith(averaged)}
        return self.cross_device_sum(sums) | self.cross_device_mean(means)

    # ----- compiled entry points ------------------------------------------------------------------------------

    @functools.cached_property
    def _reset_program(self) -> Program:
        return self.compile(self.reset_shard)

    @functools.cached_property
    def _rollout_program(self) -> Program:
        return self.compile(self.rollout_shard, donate_argnums=(1,))

    @functools.cached_property
    def _update_program(self) -> Program:
        return self.compile(self.update_shard, donate_argnums=(0,))

    @functools.cached_property
    def _train_step_program(self) -> Program:
        return self.compile(self.train_step_shard, donate_argnums=(0,))

    def rollout(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Trajectory, Metrics]:
        return self._rollout_program(shared, env)

    def update(self, shared: SharedState, trajectory: Trajectory, rng: Array) -> tuple[SharedState, Metrics]:
        return self._update_program(shared, trajectory, rng)

    def program(self, name: str, fallback: Program) -> Program:
        """The ahead-of-time compiled program `name` (see `precompile`), else `fallback` (compiles on call).

        With several processes pmap's outputs are process-local arrays, which a compiled executable refuses;
        there `precompile` only fills the persistent cache and the call goes through pmap (tracing only).
        """
        if name in self._compiled and jax.process_count() == 1:
            return self._compiled[name]
        return fallback

    def train_step(self, state: TrainState) -> tuple[TrainState, Metrics]:
        return self.program("train_step", self._train_step_program)(state)

    def ahead_of_time_programs(self, state: TrainState) -> dict[str, AheadOfTimeProgram]:
        """What `precompile` compiles: {name in `program`: (what the log calls it, a function lowering it)}."""
        programs: dict[str, AheadOfTimeProgram] = {
            "train_step": ("train step", lambda: self._train_step_program.lower(state))
        }
        if self.config.eval_every_n_steps:
            eval_inputs = self.evaluator.inputs(self.fetch_replicated(state.shared))
            programs["eval"] = ("evaluation", lambda: self.evaluator.program.lower(*eval_inputs))  # type: ignore[attr-defined]
        return programs

    def precompile(self, state: TrainState, verbose: bool = True) -> None:
        """Compiles every program the run will call before the first train step (ahead of time)."""
        self._checkpoint_metadata  # noqa: B018 -- the observation layout is traced once, here, not at the first save
        self._compiled |= compile_programs(self.ahead_of_time_programs(state), verbose)

    # ----- state ----------------------------------------------------------------------------------------------

    def init_shared(self, rng: Array) -> SharedState:
        return self._init_shared_program(rng)

    @functools.cached_property
    def _init_shared_program(self) -> Program:
        """One program (one persistent-cache entry) rather than one per initializer op."""

        def init(rng: Array) -> SharedState:
            params = self.init_params(rng)
            return SharedState(
                params=params,
                opt_state=self.optimizer.init(params),
                normalizer=Normalizer.create(self.observation_dim),
                critic_normalizer=Normalizer.create(self.critic_observation_dim),
            )

        return jax.jit(init)

    def init_train_state(self, shared: SharedState | None = None, rng: Array | None = None) -> TrainState:
        """Fresh envs on the device(s), with new shared state unless one is given (e.g. a checkpoint's)."""
        seed_key = jax.random.PRNGKey(self.config.seed)
        model_key, env_key, update_key = jax.random.split(seed_key, 3)
        shared = self.init_shared(model_key) if shared is None else shared
        rng = update_key if rng is None else rng
        env = self._reset_program(self.place_env_keys(env_key))
        return TrainState(shared=self.place_replicated(shared), env=env, rng=self.place_replicated(rng))

    # ----- checkpoints (ksim.task.checkpointing) ------------------------------------------------------------------

    def action_layout(self) -> dict[str, Any]:
        return action_layout(self.engine.mj_model, self.actuators)

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What a checkpoint says about its writer; loading compares the task and the layouts."""
        return checkpoint_metadata(
            self.task_name,
            type(self),
            self.config,
            self.environment.observation_layout(),
            self.action_layout(),
            self.engine.physics_impl,
            self.environment.critic_observation_layout(),
            self.memory_settings(),
        )

    def memory_settings(self) -> dict[str, int]:
        """What the policy remembers (ksim.task.memory): its observation_history and recurrent_size."""
        return {"observation_history": 1, "recurrent_size": 0}

    @functools.cached_property
    def _checkpoint_metadata(self) -> dict[str, Any]:
        return self.checkpoint_metadata()

    def checkpoint_contents(self, state: TrainState, step: int, env_steps: int) -> dict[str, Any]:
        """What a checkpoint holds: shared state, update RNG and counters (envs restart on resume)."""
        return checkpoint_contents(
            self.fetch_replicated(state.shared), self.fetch_replicated(state.rng), step, env_steps
        )

    def save(self, run_dir: Path, state: TrainState, step: int, env_steps: int) -> Path:
        """Writes ckpt_<step>.bin and ckpt_latest.bin, then keeps the last keep_last_n_checkpoints numbered."""
        contents = self.checkpoint_contents(state, step, env_steps)
        keep = self.config.keep_last_n_checkpoints
        return save_run_checkpoint(run_dir, contents, self._checkpoint_metadata, step, keep)

    def load_contents(self, path: str | Path) -> dict[str, Any]:
        """A checkpoint's contents; ConfigError if another task or observation layout wrote it (see
        allow_checkpoint_mismatch) or if its shapes differ from the model's."""
        allow = self.config.allow_checkpoint_mismatch
        check_metadata(path, load_metadata(path), self._checkpoint_metadata, allow)  # before the model compiles
        template = self.init_shared(jax.random.PRNGKey(0))
        return load_run_checkpoint(path, template, self._checkpoint_metadata, self.config.allow_checkpoint_mismatch)

    def run_export(self) -> Path:
        """Writes the checkpoint's deterministic policy to export_path (ONNX) and a JSON beside it."""
        from ksim.export import export_policy

        checkpoint = self.config.load_from_ckpt_path
        shared = jax.device_get(self.load_contents(checkpoint)["shared"])
        doc = (type(self.actuators).__doc__ or "").strip().splitlines()
        onnx_path, json_path = export_policy(
            self.deterministic_step(shared),
            self._checkpoint_metadata,
            doc[0] if doc else "",
            self.config.export_path,
            checkpoint,
        )
        print(f"wrote {onnx_path} and {json_path}", flush=True)
        return onnx_path

    def deterministic_step(self, shared: SharedState) -> Callable[..., tuple[Array, ...]]:
        """The exported policy: (observations, *memory) -> (actions, *next memory), a batch of robots.

        The memory inputs are the actor's GRU state (recurrent_size > 0) and the past observation frames
        (observation_history > 1); the ONNX file takes and returns them in that order (ksim.export).
        """
        memory = self.memory_settings()
        recurrent, history = memory["recurrent_size"] > 0, memory["observation_history"] > 1
        key = jax.random.PRNGKey(0)  # unused by the deterministic policy

        def step(obs: Array, *memory_inputs: Array) -> tuple[Array, ...]:
            inputs, batch = list(memory_inputs), obs.shape[0]
            actor_carry = inputs.pop(0) if recurrent else jnp.zeros((batch, 0))
            past_frames = inputs.pop(0) if history else jnp.zeros((batch, 0, self.observation_dim))
            carry = jnp.stack([actor_carry, jnp.zeros_like(actor_carry)], axis=-2)  # the critic does not run here
            state = PolicyState(past_frames=past_frames, carry=carry)
            no_critic_obs = jnp.zeros((batch, self.critic_observation_dim))
            out = self.act(shared, state, obs, no_critic_obs, jnp.asarray(False), key, deterministic=True)
            next_carry, next_past = out.state.carry[:, 0], out.state.past_frames
            return (out.action, *([next_carry] if recurrent else []), *([next_past] if history else []))

        return step

    # ----- evaluation (ksim.task.evaluation.Evaluator) -----------------------------------------------------------

    def evaluate(
        self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None, level: int | None = None
    ) -> EvalResult:
        """Deterministic episodes from fresh envs (the precompiled program where the shapes are the run's), on
        terrain level `level` (default: eval_terrain_level): returns, lengths, locomotion measures and env 0's
        qpos per control step."""
        precompiled_shape = num_episodes in (None, self.config.eval_episodes)
        program = self.program("eval", self.evaluator.program) if precompiled_shape else None
        return self.evaluator.run(shared, num_episodes, seed, program, level)

    def eval_due(self, step: int) -> bool:
        every = self.config.eval_every_n_steps
        return every > 0 and (step % every == 0 or step == self.config.num_steps)

    def run_eval(self) -> np.ndarray:
        """mode=eval: the checkpoint's deterministic episodes, their summary line, a video and the W&B run."""
        contents = self.load_contents(self.config.load_from_ckpt_path)
        result = self.evaluate(contents["shared"])
        video = report_evaluation(self.task_name, result, self.engine.mj_model, self.config)
        if self.terrain is not None:  # the same episodes on every level: fall rate and speed per level
            for level in range(self.terrain.grid.num_levels):
                on_level = self.evaluate(contents["shared"], level=level)
                print(f"terrain level {level}: {eval_line(self.task_name, on_level)}", flush=True)
        # The checkpoint's run folder (RUN/checkpoints/ckpt_*.bin) keeps the evaluation's W&B run.
        wandb_run = self.start_wandb(Path(self.config.load_from_ckpt_path).resolve().parent.parent, "eval")
        if wandb_run is not None:
            wandb_run.scalars(int(contents["step"]), int(contents["env_steps"]), summary_scalars(result))
            if video is not None:
                wandb_run.video("eval/video", video)
            wandb_run.finish()
        return result.returns

    # ----- mode=view (ksim.viewer) -------------------------------------------------------------------------------

    def view_shared(self) -> SharedState:
        """The policy mode=view shows: the checkpoint's (refused as mode=eval refuses it), else the initial one."""
        if self.config.load_from_ckpt_path:
            return self.load_contents(self.config.load_from_ckpt_path)["shared"]
        return jax.device_get(self.init_shared(jax.random.split(jax.random.PRNGKey(self.config.seed), 3)[0]))

    def view_settings(self) -> ViewSettings:
        layout = tuple(self.environment.observation_layout())
        actions = tuple(self.action_layout()["names"])
        groups = tuple(self.config.geom_groups)
        ranges = command_ranges(self.command)
        return ViewSettings(self.config.view_port, self.config.ctrl_dt, groups, layout, actions, ranges)

    def make_viewer(self) -> Any:
        """The viewer (ksim.viewer.Viewer) of this task's policy, its first step compiled; serving from here on."""
        from ksim.viewer import Viewer
        from ksim.viewer_sim import ViewerSim

        level, column = self.eval_terrain_level, self.eval_terrain_column
        sim = ViewerSim(self.environment, self.view_shared(), self.config.seed, level, column)
        viewer = Viewer(sim, self.engine.mj_model, self.engine.layout.base_body, self.view_settings())
        viewer.step()
        return viewer

    def run_view(self) -> None:
        viewer = self.make_viewer()
        print(f"viewer: {viewer.url} (Ctrl+C to stop)", flush=True)
        try:
            viewer.run()
        except KeyboardInterrupt:
            pass
        finally:
            viewer.close()

    # ----- the training loop -----------------------------------------------------------------------------------

    def make_run_dir(self) -> Path:
        run_dir = Path(self.config.run_dir or f"runs/{self.task_name}/{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.config)))
        return run_dir

    def hang_diagnosis(self) -> str:
        return "The device program did not return; if this is a hang, the stacks below show where."

    def run(self) -> Any:
        if self.config.mode == "export":
            return self.run_export()
        if self.config.mode == "view":
            return self.run_view()
        return self.run_eval() if self.config.mode == "eval" else self.run_training()

    def run_training(self) -> TrainState:
        return run_training(self)

    def start_wandb(self, run_dir: Path, job_type: str) -> WandbRun | None:
        """The W&B run of logger=wandb (with the config), else None."""
        if self.config.logger != "wandb":
            return None
        config = dataclasses.asdict(self.config)
        name = f"{self.task_name}/{run_dir.name}"
        return WandbRun(run_dir, self.config.wandb_project, name, config, job_type)

    def make_logger(self, run_dir: Path | None) -> MetricsLogger:
        if run_dir is None:
            return MetricsLogger(None)
        self.wandb_run = self.start_wandb(run_dir, "train")
        sinks = [self.wandb_run] if self.wandb_run else []
        return MetricsLogger(run_dir / "tensorboard", run_dir / SCALARS_FILE, sinks)

    def after_training(self, run_dir: Path) -> None:
        """Runs on the logging process once training has ended (and saved): the learning-curve picture."""
        from ksim.plot import plot_learning_curve

        curve = plot_learning_curve(run_dir, self.task_name)
        print(f"wrote {curve}", flush=True)
        if self.wandb_run is not None:
            self.wandb_run.image("learning_curve", curve)
            self.wandb_run.finish()

    @staticmethod
    def scalars(window: list[dict[str, Any]]) -> dict[str, float]:
        """Host metrics of the steps since the last log line: episode sums become means over the episodes
        that finished in them; everything else is averaged over the steps."""
        totals = {key: float(np.sum([np.asarray(metrics[key]) for metrics in window])) for key in window[0]}
        finished = totals.pop("episodes_finished")
        return_sum, length_sum = totals.pop("episode_return_sum"), totals.pop("episode_length_sum")
        scalars = {key: value / len(window) for key, value in totals.items() if key != "terminations"}
        scalars["episodes_finished"] = finished
        scalars["terminations"] = totals["terminations"]
        scalars["episode_return"] = return_sum / finished if finished else math.nan
        scalars["episode_length"] = length_sum / finished if finished else math.nan
        return scalars

    # ----- command line ---------------------------------------------------------------------------------------

    @classmethod
    def launch(cls, config: ConfigT, argv: Sequence[str] | None = None) -> Any:
        """`python -m examples.x key=value ...`: parse overrides, validate, then train, evaluate or export."""
        try:
            task = cls(parse_command_line(config, argv))
            return task.run()
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
