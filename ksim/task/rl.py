"""RLTask: MJX environments, rollouts with automatic resets, and the per-shard programs.

The per-shard logic (`reset_shard`, `rollout_shard`, `update_shard`, `train_step_shard`) consists of pure
functions of explicit state pytrees. `RLTask` compiles them with `jax.jit`; `DistributedRLTask` compiles
the same functions with `jax.pmap` and fills in the cross-device hooks (`cross_device_mean`, ...).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import optax
import xax
from flax import struct
from mujoco import mjx
from omegaconf import OmegaConf

from ksim.actuators import Actuators
from ksim.commands import Command, check_command_users
from ksim.config import (
    ConfigError,
    parse_command_line,
    require_choice,
    require_divisible,
    require_non_negative,
    require_positive,
)
from ksim.engine import PhysicsEngine, check_components, substeps_divide
from ksim.events import Event
from ksim.normalization import Normalizer
from ksim.observations import Observation, check_noise
from ksim.randomization import Randomization, check_randomizations
from ksim.reporting import SCALARS_FILE, MetricsLogger, unique_names
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.task.checkpointing import CheckpointMixin
from ksim.task.env import EnvMixin, Episode, Trajectory, Transition
from ksim.task.evaluation import EvaluationMixin
from ksim.task.loop import AheadOfTimeProgram, compile_programs, run_training
from ksim.terminations import Termination

Array = jax.Array
Metrics = dict[str, Array]
Program = Any  # a jitted or pmapped function: callable, and `.lower(...)` compiles it ahead of time


@dataclass
class RLConfig:
    num_envs: int = xax.field(64, help="Number of parallel environments (global, over all devices).")
    batch_size: int = xax.field(16, help="Environments per minibatch; num_envs must be divisible by it.")
    num_passes: int = xax.field(4, help="Passes (epochs) of minibatch SGD over each rollout.")
    rollout_length_frames: int = xax.field(32, help="Control steps per environment in one rollout.")
    ctrl_dt: float = xax.field(0.02, help="Control period in seconds (one policy action per ctrl_dt).")
    dt: float = xax.field(0.005, help="Physics timestep in seconds; must divide ctrl_dt.")
    episode_length_s: float | None = xax.field(
        10.0, help="Episodes are truncated after this many seconds (set this or episode_length_steps)."
    )
    episode_length_steps: int | None = xax.field(
        None, help="Episodes are truncated after this many control steps (instead of episode_length_s)."
    )
    base_body: str | None = xax.field(None, help="Body whose pose is the base's (default: first body under the world).")
    root_joints: list[str] | None = xax.field(
        None,
        help="Joints that attach the base to the world and are no robot joints (default: free joints and the base "
        "body's unactuated joints; [] for none).",
    )
    num_steps: int = xax.field(100, help="Train steps to run (one rollout + one update each).")
    seed: int = xax.field(0, help="Random seed for params, environments and minibatches.")
    normalize_observations: bool = xax.field(True, help="Keep running observation statistics.")
    log_every_n_steps: int = xax.field(1, help="Print and record metrics every N train steps.")
    save_every_n_steps: int = xax.field(100, help="Write a checkpoint every N train steps (0: only at the end).")
    eval_every_n_steps: int = xax.field(0, help="Evaluate the deterministic policy every N train steps (0: never).")
    run_dir: str = xax.field("", help="Output folder (default: runs/<task>/<timestamp>).")
    load_from_ckpt_path: str = xax.field("", help="Checkpoint to resume training, evaluate or export.")
    allow_checkpoint_mismatch: bool = xax.field(
        False, help="Load a checkpoint written by another task or observation layout (shapes must still match)."
    )
    keep_last_n_checkpoints: int = xax.field(5, help="Numbered checkpoints kept (0: all); ckpt_latest always stays.")
    mode: str = xax.field("train", help="'train', 'eval' or 'export' (eval and export need load_from_ckpt_path).")
    export_path: str = xax.field("", help="mode=export: write the deterministic policy to this .onnx file.")
    eval_episodes: int = xax.field(10, help="Episodes per evaluation (mode=eval and eval_every_n_steps).")
    video_path: str = xax.field("", help="mode=eval: write the first episode to this .mp4 or .gif.")
    video_width: int = xax.field(640, help="Video frame width in pixels (at most the model's offscreen width).")
    video_height: int = xax.field(480, help="Video frame height in pixels (at most the model's offscreen height).")
    compilation_cache_dir: str = xax.field(
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ksim", "jax"),
        help="Persistent XLA compilation cache folder (empty: off). A second start of a run skips compiling.",
    )
    watchdog_timeout_s: float = xax.field(
        600.0,
        help="Abort with a diagnosis if one train step runs longer than this, compile excluded (0: off).",
    )
    action_delay_steps: int = xax.field(0, help="The action applied is the one chosen this many control steps ago.")
    eval_observation_noise: bool = xax.field(False, help="Also add the observations' noise in evaluation.")


ConfigT = TypeVar("ConfigT", bound=RLConfig)


class EnvState(struct.PyTreeNode):
    """Every env: its episode, whether that ended at the last control step, and the start of its next one.

    An env whose episode ended starts the next one at its next control step, from `next_start` (computed
    ahead, a batch at a time). Episode k of env i starts from `fold_in(reset_key[i], k)`, so env i's starts
    depend only on its own key, never on when the pool is refilled or on which device (or with which
    other envs) it runs. A fresh state has no episode yet (`ended` everywhere): the first control step
    starts every env's first episode, so the starts compile once, inside the rollout.
    """

    current: Episode  # the running episode, or the one that ended at the last step (`ended`)
    ended: Array
    next_start: Episode
    next_start_ready: Array
    episodes_started: Array
    reset_key: Array

    @property
    def obs(self) -> Array:
        return self.current.obs

    @property
    def data(self) -> mjx.Data:
        return self.current.data


class SharedState(struct.PyTreeNode):
    """What every env shares: the learner's parameters, optimizer state and observation statistics."""

    params: Any
    opt_state: Any
    normalizer: Normalizer


class TrainState(struct.PyTreeNode):
    shared: SharedState
    env: EnvState
    rng: Array


def select_envs(mask: Array, if_true: Any, if_false: Any) -> Any:
    """Per env (leading axis), the leaves of `if_true` where `mask` holds, else those of `if_false`."""

    def pick(a: Array, b: Array) -> Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)

    return jax.tree.map(pick, if_true, if_false)


class RLTask(EnvMixin, CheckpointMixin, EvaluationMixin, ABC, Generic[ConfigT]):
    """An RL task on MJX: subclass it with a robot model and components, and an algorithm (PPOTask)."""

    config: ConfigT

    def __init__(self, config: ConfigT) -> None:
        self.config = config
        self.validate_config()
        self.engine = self.get_engine()
        self.observations = tuple(self.get_observations())
        self.rewards = tuple(self.get_rewards())
        self.terminations = tuple(self.get_terminations())
        self.resets = tuple(self.get_resets())
        self.randomizations = tuple(self.get_randomizations())
        self.command = self.get_command()
        self.events = tuple(self.get_events())
        commands = () if self.command is None else (self.command,)
        check_components(
            self.engine.layout,
            (*self.observations, *self.rewards, *self.terminations, *self.resets, *self.randomizations, *commands),
        )
        check_components(self.engine.layout, self.events)
        check_command_users(self.command, (*self.observations, *self.rewards))
        check_noise(self.observations)
        self.actuators = self.get_actuators()
        check_randomizations(self.randomizations, self.actuators)
        self.reward_names = unique_names([reward.name for reward in self.rewards])
        self.model = self.get_model()
        self.optimizer = self.get_optimizer()
        self._compiled: dict[str, Program] = {}
        if config.compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", os.path.expanduser(config.compilation_cache_dir))
            # Every program, also the small ones (RNG splits, network init) that add up to seconds at startup.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    # ----- what a task defines ---------------------------------------------------------------------------

    @abstractmethod
    def get_mujoco_model(self) -> mujoco.MjModel: ...

    def get_engine(self) -> PhysicsEngine:
        """The physics engine; override to step the model differently."""
        config = self.config
        return PhysicsEngine.create(
            self.get_mujoco_model(), config.ctrl_dt, config.dt, config.base_body, config.root_joints
        )

    @abstractmethod
    def get_observations(self) -> Sequence[Observation]: ...

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
    def sample_action(self, shared: SharedState, obs: Array, rng: Array, deterministic: bool = False) -> Array:
        """The policy's action for one env's observation."""

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
        require_choice(config, "mode", ("train", "eval", "export"))
        if config.mode in ("eval", "export") and not config.load_from_ckpt_path:
            raise ConfigError(f"mode={config.mode!r} needs load_from_ckpt_path=<checkpoint file>")
        if config.mode == "export" and not config.export_path:
            raise ConfigError("mode='export' needs export_path=<file>.onnx")
        if config.export_path and not config.export_path.endswith(".onnx"):
            raise ConfigError(f"export_path={config.export_path!r} must end in .onnx")
        if config.video_path and not config.video_path.endswith((".mp4", ".gif")):
            raise ConfigError(f"video_path={config.video_path!r} must end in .mp4 or .gif")

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
        return sum(size for _, size in self.observation_layout())

    @property
    def task_name(self) -> str:
        return type(self).__name__

    # ----- cross-device hooks (identity on one device; DistributedRLTask reduces over its pmap axis) --------

    def cross_device_mean(self, tree: Any) -> Any:
        return tree

    def cross_device_sum(self, tree: Any) -> Any:
        return tree

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
    def is_logging_process(self) -> bool:
        return jax.process_index() == 0

    # ----- per-shard programs (leading env axis = this shard's envs) -----------------------------------------

    def reset_shard(self, env_keys: Array) -> EnvState:
        """Envs with no episode yet (zeros of an episode's shape): their first control step starts one."""
        num_envs = env_keys.shape[0]
        no_episode = jax.tree.map(lambda leaf: jnp.zeros((num_envs, *leaf.shape), leaf.dtype), self.episode_shape)
        return EnvState(
            current=no_episode,
            ended=jnp.ones(num_envs, bool),
            next_start=no_episode,
            next_start_ready=jnp.zeros(num_envs, bool),
            episodes_started=jnp.zeros(num_envs, jnp.int32),
            reset_key=env_keys,
        )

    def refill_next_starts(self, env: EnvState) -> EnvState:
        """Computes the next episode start of every env whose start was used, a chunk of envs at a time.

        Only envs that need a start are reset (gathered by index), so the reset work is about one per
        ended episode, not one per env.
        """
        num_envs = env.next_start_ready.shape[0]
        chunk = max(1, num_envs // 8)

        def refill_chunk(env: EnvState) -> EnvState:
            (index,) = jnp.nonzero(~env.next_start_ready, size=chunk, fill_value=num_envs)  # num_envs: no env
            safe = jnp.minimum(index, num_envs - 1)
            keys = jax.vmap(jax.random.fold_in)(env.reset_key[safe], env.episodes_started[safe])
            fresh = jax.vmap(self.start_episode)(keys)
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
        stepped, transition = jax.vmap(self.step_env, in_axes=(None, 0))(shared, current)
        env = env.replace(
            current=stepped,
            ended=transition.trajectory.terminated | transition.trajectory.truncated,
            next_start_ready=env.next_start_ready & ~starting,
            episodes_started=env.episodes_started + starting,
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
        metrics["reward/total"] = jnp.mean(trajectory.reward)
        return env, trajectory, metrics

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
        shared = shared.replace(normalizer=self.update_normalizer(shared.normalizer, trajectory.obs))
        return TrainState(shared=shared, env=env, rng=rng), self.reduce_rollout_metrics(
            rollout_metrics
        ) | update_metrics

    def reduce_rollout_metrics(self, metrics: Metrics) -> Metrics:
        """Episode counts and sums add up over shards; per-step reward means average."""
        sums = {k: v for k, v in metrics.items() if not k.startswith("reward/")}
        means = {k: v for k, v in metrics.items() if k.startswith("reward/")}
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
            eval_inputs = self.eval_inputs(self.fetch_replicated(state.shared))
            programs["eval"] = ("evaluation", lambda: self._eval_program.lower(*eval_inputs))
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
            params = self.model.init(rng, jnp.zeros((1, self.observation_dim)))
            return SharedState(params, self.optimizer.init(params), Normalizer.create(self.observation_dim))

        return jax.jit(init)

    def init_train_state(self, shared: SharedState | None = None, rng: Array | None = None) -> TrainState:
        """Fresh envs on the device(s), with new shared state unless one is given (e.g. a checkpoint's)."""
        seed_key = jax.random.PRNGKey(self.config.seed)
        model_key, env_key, update_key = jax.random.split(seed_key, 3)
        shared = self.init_shared(model_key) if shared is None else shared
        rng = update_key if rng is None else rng
        env = self._reset_program(self.place_env_keys(env_key))
        return TrainState(shared=self.place_replicated(shared), env=env, rng=self.place_replicated(rng))

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
        return self.run_eval() if self.config.mode == "eval" else self.run_training()

    def run_training(self) -> TrainState:
        return run_training(self)

    def make_logger(self, run_dir: Path | None) -> MetricsLogger:
        if run_dir is None:
            return MetricsLogger(None)
        return MetricsLogger(run_dir / "tensorboard", run_dir / SCALARS_FILE)

    def after_training(self, run_dir: Path) -> None:
        """Runs on the logging process once training has ended (and saved): the learning-curve picture."""
        from ksim.plot import plot_learning_curve

        print(f"wrote {plot_learning_curve(run_dir, self.task_name)}", flush=True)

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
