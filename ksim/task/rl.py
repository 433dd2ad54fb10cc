"""RLTask: what a task defines (its robot, components and learner) and the per-shard programs built from it.

A subclass gives the `get_*` hooks, `act` and `update_shard`; `RLTask` binds the components, builds the
`Environment`, its pool of envs and the evaluator, and turns the pure per-shard functions (rollout, update,
train step) into programs with `compile`: `jax.jit` here, `jax.pmap` in `DistributedRLTask`, which also fills
in the cross-device hooks (`cross_device_mean`, ...). What runs a task (train, eval, export, view) is in
`ksim.modes`; checkpoint files in `ksim.task.run_checkpoints`; terrain use in `ksim.task.terrain_use`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import mujoco
import optax

from ksim.actuators import Actuators
from ksim.checkpoint import MEMORYLESS
from ksim.commands import Command
from ksim.config import ConfigError, require_choice, require_divisible, require_non_negative, require_positive
from ksim.engine import PhysicsEngine, substeps_divide
from ksim.events import Event
from ksim.learner.networks import PolicyNetwork
from ksim.learner.normalization import fold_batch, scale_by_return_std
from ksim.observations import Observation
from ksim.physics import PHYSICS_IMPLS, create_engine
from ksim.randomization import Randomization
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.task.env import Environment, EnvSettings, bind_components
from ksim.task.env_pool import EnvPool, reduce_rollout_metrics
from ksim.task.evaluation import EvalResult, Evaluator, default_evaluation_score
from ksim.task.loop import ProcessHooks
from ksim.task.programs import AheadOfTimeProgram, Program, Programs
from ksim.task.run_checkpoints import RunCheckpoints, task_metadata
from ksim.task.terrain_use import compile_with_terrain, terrain_use
from ksim.task.types import (
    EnvState,
    PolicyOutput,
    PolicyState,
    RLConfig,
    SharedState,
    TrainState,
    Trajectory,
    episode_steps,
)
from ksim.terminations import Termination
from ksim.terrain import TerrainCurriculum, TerrainGrid
from ksim.wandb_logging import WANDB_EXTRA

Array = jax.Array
Metrics = dict[str, Array]

ConfigT = TypeVar("ConfigT", bound=RLConfig)


class RLTask(ABC, Generic[ConfigT]):
    """An RL task: subclass it with a robot model and components, and an algorithm (PPOTask)."""

    config: ConfigT

    def __init__(self, config: ConfigT) -> None:
        self.config = config
        self.validate_config()
        grid = self.get_terrain()
        self.terrain = None if grid is None else grid.build()
        self.engine = self.get_engine()
        # Every component resolves its names once, here; refusals come before anything compiles.
        self.components = components = bind_components(
            self.engine.layout,
            self.engine.mj_model,
            self.get_observations(),
            self.get_critic_observations(),
            self.get_rewards(),
            self.get_terminations(),
            self.get_resets(),
            self.get_randomizations(),
            self.get_command(),
            self.get_events(),
            self.get_actuators(),
        )
        self.actuators, self.critic_observations = components.actuators, components.critic_observations
        self.curriculum = self.get_terrain_curriculum()
        steps = episode_steps(config)
        self.terrain_use = terrain_use(self.terrain, self.curriculum, components.command, self.engine, config, steps)
        noise = config.eval_observation_noise
        settings = EnvSettings(
            config.ctrl_dt, steps, config.action_delay_steps, noise, config.gamma, config.eval_events
        )
        spawn_jitter = self.terrain_use.spawn_jitter
        self.environment = Environment(self.engine, components, settings, self, self.terrain, spawn_jitter)
        self.env_pool = EnvPool(self.environment, self.terrain_use)
        eval_tile = (self.terrain_use.eval_level, self.terrain_use.eval_column)
        self.evaluator = Evaluator(self.environment, config.eval_episodes, config.seed, *eval_tile)
        self.model = self.get_model()
        self.optimizer = self.get_optimizer()
        self.programs = Programs(
            self.compile,
            {
                "reset": (functools.partial(reset_envs, self.env_pool, self.shard_env_offset), ()),
                "rollout": (self.rollout_shard, (1,)),
                "update": (self.update_shard, (0,)),
                "train_step": (self.train_step_shard, (0,)),
            },
        )

        def init_shared(rng: Array) -> SharedState:
            dims = (self.environment.observation_dim, self.environment.critic_observation_dim)
            average = config.policy_average_decay > 0
            return SharedState.initial(self.init_params(rng), self.optimizer, *dims, config.normalize_returns, average)

        self._init_shared = jax.jit(init_shared)
        self.checkpoints = RunCheckpoints(
            lambda: task_metadata(self.task_name, type(self), config, self.environment, self.memory_settings()),
            lambda: self.init_shared(jax.random.PRNGKey(0)),
            self.fetch_replicated,
            config.keep_last_n_checkpoints,
            config.allow_checkpoint_mismatch,
        )
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

    def get_engine(self) -> PhysicsEngine:
        """The physics engine; override to step the model differently."""
        config = self.config
        model = compile_with_terrain(self.get_mujoco_model(), self.terrain)
        envs = max(config.num_envs, config.eval_episodes)  # the most envs of one call
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
    def get_model(self) -> PolicyNetwork:
        """The policy's networks behind the learner's interface (ksim.learner.networks)."""

    @abstractmethod
    def get_optimizer(self) -> optax.GradientTransformation: ...

    @abstractmethod
    def init_params(self, rng: Array) -> Any:
        """The model's initial parameters."""

    @abstractmethod
    def initial_policy_state(self) -> PolicyState:
        """One env's policy state at the start of every episode (ksim.learner.memory)."""

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

    def memory_settings(self) -> dict[str, Any]:
        """What shapes the policy's network beyond its layers: its memory (ksim.learner.memory: observation_history,
        recurrent_size), what it estimates (estimated_observations) and its activation; a checkpoint must match them."""
        return dict(MEMORYLESS)

    # ----- configuration ---------------------------------------------------------------------------------

    def validate_config(self) -> None:
        """Raises ConfigError naming the setting and the rule; runs before anything is built or compiled (the
        rules of each mode's own settings are the mode's: ksim.modes)."""
        config = self.config
        require_positive(config, "num_envs", "batch_size", "num_passes", "rollout_length_frames", "num_steps")
        require_positive(config, "ctrl_dt", "dt", "eval_episodes", "log_every_n_steps")
        require_non_negative(config, "save_every_n_steps", "eval_every_n_steps", "watchdog_timeout_s")
        require_non_negative(config, "keep_last_n_checkpoints", "action_delay_steps")
        if not 0.0 <= config.policy_average_decay < 1.0:
            raise ConfigError(f"policy_average_decay={config.policy_average_decay} must be in [0, 1)")
        if (config.episode_length_s is None) == (config.episode_length_steps is None):
            raise ConfigError(
                f"set exactly one of episode_length_s={config.episode_length_s} and "
                f"episode_length_steps={config.episode_length_steps} (the other one to null)"
            )
        require_positive(config, "episode_length_s" if config.episode_length_s is not None else "episode_length_steps")
        require_divisible("num_envs", config.num_envs, config.batch_size, f"batch_size={config.batch_size}")
        if not substeps_divide(config.ctrl_dt, config.dt):
            raise ConfigError(f"dt={config.dt} must divide ctrl_dt={config.ctrl_dt} into a whole number of steps")
        require_choice(config, "physics_impl", PHYSICS_IMPLS)
        require_choice(config, "logger", ("tensorboard", "wandb"))
        if config.logger == "wandb" and importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"logger='wandb' needs the wandb package: {WANDB_EXTRA}")

    @property
    def policy_average_decay(self) -> float:
        """The decay of the evaluated parameters' moving average after each train step (0: the latest)."""
        return self.config.policy_average_decay

    @property
    def env_steps_per_train_step(self) -> int:
        return self.config.num_envs * self.config.rollout_length_frames

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

    def hang_diagnosis(self) -> str:
        return "The device program did not return; if this is a hang, the stacks below show where."

    def ahead_of_time_programs(self, state: TrainState) -> dict[str, AheadOfTimeProgram]:
        """What a run compiles before its first train step: {name in `programs`: (what the log calls it, a
        function lowering it)}."""
        programs: dict[str, AheadOfTimeProgram] = {
            "train_step": ("train step", lambda: self.programs.function("train_step").lower(state))
        }
        if self.config.eval_every_n_steps:
            eval_inputs = self.evaluator.inputs(self.fetch_replicated(state.shared))
            programs["eval"] = ("evaluation", lambda: self.evaluator.program.lower(*eval_inputs))  # type: ignore[attr-defined]
        return programs

    # ----- per-shard programs (leading env axis = this shard's envs) -----------------------------------------

    def rollout_shard(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Trajectory, Metrics]:
        """`rollout_length_frames` steps of every env; episodes carry over into the next rollout."""
        return self.env_pool.rollout(shared, env, self.config.rollout_length_frames)

    def train_step_shard(self, state: TrainState) -> tuple[TrainState, Metrics]:
        """Rollout, then update, then new observation statistics (used from the next rollout on)."""
        update_key, rng = jax.random.split(state.rng)
        env, trajectory, rollout_metrics = self.rollout_shard(state.shared, state.env)
        self.debug_print("rollout", {k: rollout_metrics[k] for k in ("episodes_finished", "episode_return_sum")})
        shared, devices = state.shared, (self.cross_device_mean, self.cross_device_sum)
        if shared.return_normalizer is not None:
            returns, reward = scale_by_return_std(
                shared.return_normalizer, trajectory.reward, trajectory.discounted_return, *devices
            )
            shared, trajectory = shared.replace(return_normalizer=returns), trajectory.replace(reward=reward)
        shared, update_metrics = self.update_shard(shared, trajectory, update_key)
        shared = shared.averaged(self.policy_average_decay)
        if self.config.normalize_observations:
            # The newest frame of each observation; the critic's own observations with their own statistics.
            newest = trajectory.obs[..., trajectory.obs.shape[-1] - self.environment.observation_dim :]
            fold = functools.partial(fold_batch, cross_device_mean=devices[0], cross_device_sum=devices[1])
            shared = shared.replace(normalizer=fold(shared.normalizer, newest))
            if self.critic_observations is not None:
                shared = shared.replace(critic_normalizer=fold(shared.critic_normalizer, trajectory.critic_obs))
        metrics = reduce_rollout_metrics(rollout_metrics, self.cross_device_mean, self.cross_device_sum)
        return TrainState(shared=shared, env=env, rng=rng), metrics | update_metrics

    # ----- entry points -----------------------------------------------------------------------------------------

    def train_step(self, state: TrainState) -> tuple[TrainState, Metrics]:
        return self.programs["train_step"](state)

    def init_shared(self, rng: Array) -> SharedState:
        """New shared state (one program, so one persistent-cache entry rather than one per initializer op)."""
        return self._init_shared(rng)

    def init_train_state(self, shared: SharedState | None = None, rng: Array | None = None) -> TrainState:
        """Fresh envs on the device(s), with new shared state unless one is given (e.g. a checkpoint's)."""
        seed_key = jax.random.PRNGKey(self.config.seed)
        model_key, env_key, update_key = jax.random.split(seed_key, 3)
        shared = self.init_shared(model_key) if shared is None else shared
        rng = update_key if rng is None else rng
        env = self.programs["reset"](self.place_env_keys(env_key))
        return TrainState(shared=self.place_replicated(shared), env=env, rng=self.place_replicated(rng))

    def evaluate(
        self, shared: SharedState, num_episodes: int | None = None, seed: int | None = None, level: int | None = None
    ) -> EvalResult:
        """Deterministic episodes from fresh envs (the precompiled program where the shapes are the run's), on
        terrain level `level` (default: eval_terrain_level): returns, lengths, locomotion measures and env 0's
        qpos per control step."""
        precompiled_shape = num_episodes in (None, self.config.eval_episodes)
        program = self.programs.get("eval", self.evaluator.program) if precompiled_shape else None
        return self.evaluator.run(shared.deployed(), num_episodes, seed, program, level)

    def evaluation_score(self, scalars: dict[str, float]) -> float:
        """How good an evaluation is (higher is better), for keeping the run's best checkpoint as ckpt_best.bin: a
        motion's success rate (over several clips, its weakest clip's, ties broken by all of them together), else the
        mean return. A task may weigh its own metrics instead."""
        return default_evaluation_score(scalars)

    def run(self, settings: Any = None) -> Any:
        """Runs the configured mode on this task (ksim.modes: train, eval, export or view) with the mode's own
        settings (its `Settings`; its defaults without)."""
        return modes().run(self, settings)

    @classmethod
    def launch(cls, config: ConfigT, argv: Sequence[str] | None = None) -> Any:
        """`python -m examples.x key=value ...`: parse overrides, check them, build the task, run its mode."""
        return modes().launch(cls, config, argv)


def reset_envs(env_pool: EnvPool, shard_env_offset: Callable[[int], Array], env_keys: Array) -> EnvState:
    """A shard's envs before their first episodes (the first control step starts them)."""
    return env_pool.reset(env_keys, shard_env_offset(env_keys.shape[0]))


def modes() -> Any:
    """ksim.modes, which sits above the task (each mode takes a built one): looked up by name when a task is run,
    so that `Task.launch(config)` works while nothing in ksim.task imports a mode."""
    return importlib.import_module("ksim.modes")
