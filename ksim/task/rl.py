"""RLTask: MJX environments, rollouts with automatic resets, and the training loop.

The per-shard logic (`reset_shard`, `rollout_shard`, `update_shard`, `train_step_shard`) consists of pure
functions of explicit state pytrees. `RLTask` compiles them with `jax.jit`; `DistributedRLTask` compiles
the same functions with `jax.pmap` and fills in the cross-device hooks (`cross_device_mean`, ...).
"""

from __future__ import annotations

import faulthandler
import functools
import math
import os
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
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
from ksim.checkpoint import load_checkpoint, save_checkpoint
from ksim.config import (
    ConfigError,
    parse_command_line,
    require_choice,
    require_divisible,
    require_non_negative,
    require_positive,
)
from ksim.engine import PhysicsEngine, StepContext, substeps_divide
from ksim.normalization import Normalizer
from ksim.observations import Observation
from ksim.reporting import MetricsLogger
from ksim.resets import Reset
from ksim.rewards import Reward
from ksim.terminations import Termination, physics_diverged

Array = jax.Array
Metrics = dict[str, Array]


@dataclass
class RLConfig:
    num_envs: int = xax.field(64, help="Number of parallel environments (global, over all devices).")
    batch_size: int = xax.field(16, help="Environments per minibatch; num_envs must be divisible by it.")
    num_passes: int = xax.field(4, help="Passes (epochs) of minibatch SGD over each rollout.")
    rollout_length_frames: int = xax.field(32, help="Control steps per environment in one rollout.")
    ctrl_dt: float = xax.field(0.02, help="Control period in seconds (one policy action per ctrl_dt).")
    dt: float = xax.field(0.005, help="Physics timestep in seconds; must divide ctrl_dt.")
    episode_length_s: float = xax.field(10.0, help="Episodes are truncated after this many seconds.")
    num_steps: int = xax.field(100, help="Train steps to run (one rollout + one update each).")
    seed: int = xax.field(0, help="Random seed for params, environments and minibatches.")
    normalize_observations: bool = xax.field(True, help="Keep running observation statistics.")
    log_every_n_steps: int = xax.field(1, help="Print and record metrics every N train steps.")
    save_every_n_steps: int = xax.field(100, help="Write a checkpoint every N train steps (0: only at the end).")
    run_dir: str = xax.field("", help="Output folder (default: runs/<task>/<timestamp>).")
    load_from_ckpt_path: str = xax.field("", help="Checkpoint to resume training or to evaluate.")
    mode: str = xax.field("train", help="'train' or 'eval' (eval needs load_from_ckpt_path).")
    eval_episodes: int = xax.field(10, help="Episodes run by mode=eval (deterministic policy).")
    video_path: str = xax.field("", help="mode=eval: write the first episode to this .mp4 or .gif.")
    watchdog_timeout_s: float = xax.field(
        600.0,
        help="Abort with a diagnosis if one train step runs longer than this, compile excluded (0: off).",
    )


ConfigT = TypeVar("ConfigT", bound=RLConfig)


class EnvState(struct.PyTreeNode):
    """State of one env, or of a batch of envs with a leading env axis."""

    data: mjx.Data
    obs: Array
    last_action: Array
    episode_return: Array
    episode_length: Array
    rng: Array


class SharedState(struct.PyTreeNode):
    """What every env shares: the learner's parameters, optimizer state and observation statistics."""

    params: Any
    opt_state: Any
    normalizer: Normalizer


class TrainState(struct.PyTreeNode):
    shared: SharedState
    env: EnvState
    rng: Array


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


def _unique_names(names: Sequence[str]) -> list[str]:
    """Appends an index to repeated component names so each one is logged on its own."""
    return [name if names.count(name) == 1 else f"{name}_{names[:i].count(name)}" for i, name in enumerate(names)]


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag so the loop can checkpoint before it exits."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nreceived {signal.Signals(signum).name}: stopping after this step and saving", flush=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Watchdog:
    """Aborts with a diagnosis when one train step stays unfinished for `timeout_s`.

    The loop hands it each step's metrics right after dispatch (compilation has finished by then);
    a background thread polls `is_ready()`, so nothing blocks and nothing is transferred.
    """

    def __init__(self, timeout_s: float, diagnosis: Callable[[], str]) -> None:
        self.timeout_s = timeout_s
        self.diagnosis = diagnosis
        self._pending: deque[tuple[Any, float]] = deque()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, metrics: Any) -> None:
        if self.timeout_s > 0:
            with self._lock:
                self._pending.append((jax.tree.leaves(metrics)[0], time.monotonic()))

    def stalled_for(self) -> float:
        """Seconds the oldest unfinished step has been running (0 when none is)."""
        now, started = time.monotonic(), None
        with self._lock:
            while self._pending and self._pending[0][0].is_ready():
                self._pending.popleft()
                started = now  # the next step could only start once this one finished
            if not self._pending:
                return 0.0
            array, dispatched = self._pending[0]
            started = max(dispatched, started or dispatched)
            self._pending[0] = (array, started)
        return now - started

    def _watch(self) -> None:
        while not self._done.wait(min(2.0, self.timeout_s)):
            stalled = self.stalled_for()
            if stalled > self.timeout_s:
                print(
                    f"\nwatchdog: a train step has not finished in {stalled:.0f} s. {self.diagnosis()}",
                    file=sys.stderr,
                )
                faulthandler.dump_traceback(file=sys.stderr)
                sys.stderr.flush()
                os._exit(3)

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="ksim-watchdog")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        # Joined, not left to die with the interpreter: a daemon thread caught inside a JAX call at
        # shutdown aborts the process ("FATAL: exception not rethrown").
        if self._thread is not None:
            self._thread.join()


class RLTask(ABC, Generic[ConfigT]):
    """An RL task on MJX: subclass it with a robot model and components, and an algorithm (PPOTask)."""

    def __init__(self, config: ConfigT) -> None:
        self.config = config
        self.validate_config()
        self.engine = PhysicsEngine.create(self.get_mujoco_model(), config.ctrl_dt, config.dt)
        self.observations = tuple(self.get_observations())
        self.rewards = tuple(self.get_rewards())
        self.terminations = tuple(self.get_terminations())
        self.resets = tuple(self.get_resets())
        self.actuators = self.get_actuators()
        self.reward_names = _unique_names([reward.name for reward in self.rewards])
        self.model = self.get_model()
        self.optimizer = self.get_optimizer()

    # ----- what a task defines ---------------------------------------------------------------------------

    @abstractmethod
    def get_mujoco_model(self) -> mujoco.MjModel: ...

    @abstractmethod
    def get_observations(self) -> Sequence[Observation]: ...

    @abstractmethod
    def get_rewards(self) -> Sequence[Reward]: ...

    @abstractmethod
    def get_terminations(self) -> Sequence[Termination]: ...

    def get_resets(self) -> Sequence[Reset]:
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
        require_positive(config, "ctrl_dt", "dt", "episode_length_s", "eval_episodes", "log_every_n_steps")
        require_non_negative(config, "save_every_n_steps", "watchdog_timeout_s")
        require_divisible("num_envs", config.num_envs, config.batch_size, f"batch_size={config.batch_size}")
        if not substeps_divide(config.ctrl_dt, config.dt):
            raise ConfigError(f"dt={config.dt} must divide ctrl_dt={config.ctrl_dt} into a whole number of steps")
        require_choice(config, "mode", ("train", "eval"))
        if config.mode == "eval" and not config.load_from_ckpt_path:
            raise ConfigError("mode='eval' needs load_from_ckpt_path=<checkpoint file>")
        if config.video_path and not config.video_path.endswith((".mp4", ".gif")):
            raise ConfigError(f"video_path={config.video_path!r} must end in .mp4 or .gif")

    @property
    def max_episode_steps(self) -> int:
        return max(1, round(self.config.episode_length_s / self.config.ctrl_dt))

    @property
    def num_minibatches(self) -> int:
        return self.config.num_envs // self.config.batch_size

    @property
    def env_steps_per_train_step(self) -> int:
        return self.config.num_envs * self.config.rollout_length_frames

    @functools.cached_property
    def observation_dim(self) -> int:
        state = jax.eval_shape(self.reset_env, jax.random.PRNGKey(0))
        return int(state.obs.shape[-1])

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

    def compile(self, fn: Callable[..., Any], donate_argnums: tuple[int, ...] = ()) -> Callable[..., Any]:
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

    # ----- one environment ---------------------------------------------------------------------------------

    def observe(self, ctx: StepContext) -> Array:
        return jnp.concatenate([jnp.ravel(obs.observe(ctx)) for obs in self.observations])

    def reset_env(self, rng: Array) -> EnvState:
        """A new episode of one env: default pose perturbed by the task's resets."""
        engine = self.engine
        rng, *reset_keys = jax.random.split(rng, len(self.resets) + 1)
        root_qpos, root_qvel = (7, 6) if engine.free_joint else (0, 0)
        qpos = jnp.asarray(engine.default_qpos, dtype=jnp.float32)
        qvel = jnp.zeros(engine.mj_model.nv)
        joint_pos, joint_vel = qpos[root_qpos:], qvel[root_qvel:]
        for reset, key in zip(self.resets, reset_keys, strict=True):
            joint_pos, joint_vel = reset.apply(joint_pos, joint_vel, key)
        data = engine.make_data(
            jnp.concatenate([qpos[:root_qpos], joint_pos]), jnp.concatenate([qvel[:root_qvel], joint_vel])
        )
        no_action = jnp.zeros(engine.action_dim)
        obs = self.observe(engine.context(data, no_action, no_action, data.ctrl))
        return EnvState(
            data=data,
            obs=obs,
            last_action=no_action,
            episode_return=jnp.zeros(()),
            episode_length=jnp.zeros((), jnp.int32),
            rng=rng,
        )

    def step_env(self, shared: SharedState, env: EnvState, deterministic: bool = False) -> tuple[EnvState, Transition]:
        """One control step of one env, resetting it in place when its episode ends."""
        rng, action_key, reset_key = jax.random.split(env.rng, 3)
        action = self.sample_action(shared, env.obs, action_key, deterministic)
        data, ctrl = self.engine.step(env.data, lambda data: self.actuators.ctrl(action, data))
        ctx = self.engine.context(data, action, env.last_action, ctrl)
        diverged = physics_diverged(ctx)
        next_obs = jnp.where(diverged, 0.0, self.observe(ctx))
        reward_terms = {name: reward(ctx) for name, reward in zip(self.reward_names, self.rewards, strict=True)}
        reward = jnp.where(diverged, 0.0, sum(reward_terms.values(), jnp.zeros(())))
        terminated = functools.reduce(jnp.logical_or, (t.terminated(ctx) for t in self.terminations), diverged)
        episode_length = env.episode_length + 1
        truncated = (episode_length >= self.max_episode_steps) & ~terminated
        episode_return = env.episode_return + reward
        stepped = EnvState(data, next_obs, action, episode_return, episode_length, rng)
        fresh = self.reset_env(reset_key)
        done = terminated | truncated
        next_env = jax.tree.map(lambda new, old: jnp.where(done, new, old), fresh, stepped)
        trajectory = Trajectory(env.obs, next_obs, action, reward, terminated, truncated)
        return next_env, Transition(trajectory, episode_return, episode_length, reward_terms)

    # ----- per-shard programs (leading env axis = this shard's envs) -----------------------------------------

    def reset_shard(self, env_keys: Array) -> EnvState:
        return jax.vmap(self.reset_env)(env_keys)

    def rollout_shard(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Trajectory, Metrics]:
        """`rollout_length_frames` steps of every env; episodes carry over into the next rollout."""
        step_all = jax.vmap(self.step_env, in_axes=(None, 0))

        def body(env: EnvState, _: None) -> tuple[EnvState, Transition]:
            return step_all(shared, env)

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
    def _reset_program(self) -> Callable[..., Any]:
        return self.compile(self.reset_shard)

    @functools.cached_property
    def _rollout_program(self) -> Callable[..., Any]:
        return self.compile(self.rollout_shard, donate_argnums=(1,))

    @functools.cached_property
    def _update_program(self) -> Callable[..., Any]:
        return self.compile(self.update_shard, donate_argnums=(0,))

    @functools.cached_property
    def _train_step_program(self) -> Callable[..., Any]:
        return self.compile(self.train_step_shard, donate_argnums=(0,))

    def rollout(self, shared: SharedState, env: EnvState) -> tuple[EnvState, Trajectory, Metrics]:
        return self._rollout_program(shared, env)

    def update(self, shared: SharedState, trajectory: Trajectory, rng: Array) -> tuple[SharedState, Metrics]:
        return self._update_program(shared, trajectory, rng)

    def train_step(self, state: TrainState) -> tuple[TrainState, Metrics]:
        return self._train_step_program(state)

    # ----- state ----------------------------------------------------------------------------------------------

    def init_shared(self, rng: Array) -> SharedState:
        params = self.model.init(rng, jnp.zeros((1, self.observation_dim)))
        return SharedState(params, self.optimizer.init(params), Normalizer.create(self.observation_dim))

    def init_train_state(self, shared: SharedState | None = None, rng: Array | None = None) -> TrainState:
        """Fresh envs on the device(s), with new shared state unless one is given (e.g. a checkpoint's)."""
        seed_key = jax.random.PRNGKey(self.config.seed)
        model_key, env_key, update_key = jax.random.split(seed_key, 3)
        shared = self.init_shared(model_key) if shared is None else shared
        rng = update_key if rng is None else rng
        env = self._reset_program(self.place_env_keys(env_key))
        return TrainState(shared=self.place_replicated(shared), env=env, rng=self.place_replicated(rng))

    def checkpoint_contents(self, state: TrainState, step: int, env_steps: int) -> dict[str, Any]:
        """What a checkpoint holds: shared state, update RNG and counters (envs restart on resume)."""
        return {
            "shared": self.fetch_replicated(state.shared),
            "rng": self.fetch_replicated(state.rng),
            "step": np.asarray(step),
            "env_steps": np.asarray(env_steps),
        }

    def load_contents(self, path: str | Path) -> dict[str, Any]:
        target = {
            "shared": self.init_shared(jax.random.PRNGKey(0)),
            "rng": jax.random.PRNGKey(0),
            "step": np.asarray(0),
            "env_steps": np.asarray(0),
        }
        return load_checkpoint(path, target)

    # ----- the training loop -----------------------------------------------------------------------------------

    def make_run_dir(self) -> Path:
        run_dir = Path(self.config.run_dir or f"runs/{self.task_name}/{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.config)))
        return run_dir

    def hang_diagnosis(self) -> str:
        return "The device program did not return; if this is a hang, the stacks below show where."

    def run(self) -> Any:
        return self.run_eval() if self.config.mode == "eval" else self.run_training()

    def run_training(self) -> TrainState:
        """Trains for `num_steps` train steps; checkpoints periodically, at the end and on Ctrl-C/SIGTERM."""
        config = self.config
        step, env_steps, shared, rng = 0, 0, None, None
        if config.load_from_ckpt_path:
            contents = self.load_contents(config.load_from_ckpt_path)
            shared, rng = contents["shared"], contents["rng"]
            step, env_steps = int(contents["step"]), int(contents["env_steps"])
        run_dir = self.make_run_dir() if self.is_logging_process else None
        logger = MetricsLogger(run_dir / "tensorboard" if run_dir else None)
        if run_dir:
            print(f"{self.task_name}: writing to {run_dir}", flush=True)

        start_time = time.perf_counter()
        state = self.init_train_state(shared, rng)
        start_step, window = step, []  # window: metrics of the steps since the last log line, still on device
        with GracefulStop() as stop, Watchdog(config.watchdog_timeout_s, self.hang_diagnosis) as watchdog:
            try:
                while step < config.num_steps and not stop.requested:
                    with jax.transfer_guard("disallow"):
                        state, metrics = self.train_step(state)
                    watchdog.track(metrics)
                    window.append(metrics)
                    step += 1
                    env_steps += self.env_steps_per_train_step
                    state = self.after_train_step(state, step)
                    if step == start_step + 1:  # the first step compiles: keep it out of the throughput
                        jax.block_until_ready(metrics)
                        first_step_done = last_log_time = time.perf_counter()
                        last_log_env_steps = env_steps
                        if run_dir:
                            print(f"startup and first train step (compiles): {first_step_done - start_time:.1f} s")
                    if step % config.log_every_n_steps == 0 or step == config.num_steps:
                        scalars = self.scalars(self.fetch_replicated(window))
                        window = []
                        now = time.perf_counter()
                        if step > start_step + 1:
                            scalars |= self.log_fields((env_steps - last_log_env_steps) / (now - last_log_time))
                            last_log_time, last_log_env_steps = now, env_steps
                        seconds_per_step = (now - first_step_done) / max(step - start_step - 1, 1)
                        if run_dir:
                            logger.log(
                                step, config.num_steps, env_steps, scalars, seconds_per_step * (config.num_steps - step)
                            )
                    if run_dir and config.save_every_n_steps and step % config.save_every_n_steps == 0:
                        self.save(run_dir, state, step, env_steps)
                if run_dir and step > start_step:  # normal end, or stopped by SIGINT/SIGTERM
                    print(f"saved checkpoint {self.save(run_dir, state, step, env_steps)}", flush=True)
            finally:
                logger.close()
        return state

    def save(self, run_dir: Path, state: TrainState, step: int, env_steps: int) -> Path:
        contents = self.checkpoint_contents(state, step, env_steps)
        path = save_checkpoint(run_dir / "checkpoints" / f"ckpt_{step:08d}.bin", contents)
        save_checkpoint(run_dir / "checkpoints" / "ckpt_latest.bin", contents)
        return path

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

    # ----- evaluation -------------------------------------------------------------------------------------------

    @functools.cached_property
    def _eval_program(self) -> Callable[..., Any]:
        step_all = jax.vmap(functools.partial(self.step_env, deterministic=True), in_axes=(None, 0))

        def run_episodes(shared: SharedState, env_keys: Array) -> tuple[Array, Array, Array]:
            """Each env's first episode: its return, its length, and env 0's qpos at every step."""

            def body(carry: tuple[EnvState, Array, Array, Array], _: None) -> tuple[Any, Array]:
                env, returns, lengths, running = carry
                qpos = env.data.qpos[0]
                env, transition = step_all(shared, env)
                trajectory = transition.trajectory
                returns = returns + jnp.where(running, trajectory.reward, 0.0)
                lengths = lengths + running
                running = running & ~(trajectory.terminated | trajectory.truncated)
                return (env, returns, lengths, running), qpos

            num_envs = env_keys.shape[0]
            env = jax.vmap(self.reset_env)(env_keys)
            init = (env, jnp.zeros(num_envs), jnp.zeros(num_envs, jnp.int32), jnp.ones(num_envs, bool))
            (_, returns, lengths, _), qpos = jax.lax.scan(body, init, None, length=self.max_episode_steps)
            return returns, lengths, qpos

        return jax.jit(run_episodes)

    def evaluate(self, shared: SharedState, num_episodes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Returns of `num_episodes` deterministic episodes, and the first episode's qpos per control step."""
        keys = jax.random.split(jax.random.PRNGKey(seed), num_episodes)
        returns, lengths, qpos = jax.device_get(self._eval_program(jax.device_put(shared), keys))
        return returns, qpos[: int(lengths[0])]

    def run_eval(self) -> np.ndarray:
        contents = self.load_contents(self.config.load_from_ckpt_path)
        returns, qpos = self.evaluate(contents["shared"], self.config.eval_episodes, self.config.seed)
        print(
            f"{self.task_name}: {len(returns)} episodes, mean return {returns.mean():.4g} "
            f"(std {returns.std():.3g}, min {returns.min():.4g}, max {returns.max():.4g})",
            flush=True,
        )
        if self.config.video_path:
            from ksim.render import write_video

            path = write_video(self.engine.mj_model, qpos, self.config.ctrl_dt, self.config.video_path)
            print(f"wrote {path}", flush=True)
        return returns

    # ----- command line ---------------------------------------------------------------------------------------

    @classmethod
    def launch(cls, config: ConfigT, argv: Sequence[str] | None = None) -> Any:
        """`python -m examples.x key=value ...`: parse overrides, validate, then train or evaluate."""
        try:
            task = cls(parse_command_line(config, argv))
            return task.run()
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
