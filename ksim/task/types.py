"""The task's types: its config and the state pytrees that its programs are pure functions of.

An `Episode` is one env's running episode; `EnvState` is every env of a shard (leading env axis) with
the starts of their next episodes; `SharedState` is what the envs share (the learner's parameters,
optimizer state and observation statistics); `TrainState` is both, with the update's random key.
A rollout is a `Trajectory` (time-major) built from one `Transition` per control step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import optax
import xax
from flax import struct

from ksim.learner.memory import PolicyState
from ksim.learner.normalization import Normalizer
from ksim.randomization import Randomized
from ksim.terrain import TerrainCells

if TYPE_CHECKING:  # MJX's types only: the native engine runs without importing MJX
    from mujoco import mjx

Array = jax.Array


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
    physics_impl: str = xax.field(
        "auto",
        help="Physics implementation: 'auto' ('mujoco' on CPU devices, 'jax' on GPUs and TPUs), 'jax' (MJX), 'warp' "
        "(MJX's Warp implementation, on a CUDA GPU or the CPU; needs the warp extra: pip install 'ksim[warp]') or "
        "'mujoco' (C MuJoCo through mujoco.batch, CPU devices only; see docs/physics.md).",
    )
    num_steps: int = xax.field(100, help="Train steps to run (one rollout + one update each).")
    seed: int = xax.field(0, help="Random seed for params, environments and minibatches.")
    gamma: float = xax.field(0.99, help="Discount factor (of GAE and of normalize_returns' return).")
    normalize_observations: bool = xax.field(True, help="Keep running observation statistics.")
    normalize_returns: bool = xax.field(
        False,
        help="Divide rewards in the update by the running std of each env's discounted return, clipped to +-10 "
        "(Gymnasium's NormalizeReward, Stable-Baselines3's VecNormalize); logged returns stay raw.",
    )
    policy_average_decay: float = xax.field(
        0.0,
        help="Evaluate, export and view a moving average of the parameters (Polyak averaging), updated after every "
        "train step with this decay (0.995: about the last 200 train steps); 0: the latest parameters.",
    )
    log_every_n_steps: int = xax.field(1, help="Print and record metrics every N train steps.")
    save_every_n_steps: int = xax.field(100, help="Write a checkpoint every N train steps (0: only at the end).")
    eval_every_n_steps: int = xax.field(0, help="Evaluate the deterministic policy every N train steps (0: never).")
    run_dir: str = xax.field("", help="Output folder (default: runs/<task>/<timestamp>).")
    load_from_ckpt_path: str = xax.field("", help="Checkpoint to resume training, evaluate or export.")
    allow_checkpoint_mismatch: bool = xax.field(
        False, help="Load a checkpoint written by another task or observation layout (shapes must still match)."
    )
    keep_last_n_checkpoints: int = xax.field(5, help="Numbered checkpoints kept (0: all); ckpt_latest always stays.")
    mode: str = xax.field(
        "train",
        help="'train', 'eval', 'export' (both need load_from_ckpt_path) or 'view' (a web page of the policy acting "
        "live; the checkpoint's, else the initial policy).",
    )
    robot_inputs_only: bool = xax.field(
        False,
        help="The actor reads only what a robot measures: mode=export refuses a policy that reads what only a "
        "simulator knows (base velocity, height...).",
    )
    eval_episodes: int = xax.field(10, help="Episodes per evaluation (mode=eval and eval_every_n_steps).")
    compilation_cache_dir: str = xax.field(
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ksim", "jax"),
        help="Persistent XLA compilation cache folder (empty: off). A second start of a run skips compiling.",
    )
    logger: str = xax.field(
        "tensorboard",
        help="'tensorboard' (TensorBoard and scalars.jsonl in the run folder) or 'wandb' (also Weights & Biases: "
        "scalars, config, learning curve, eval videos; WANDB_MODE=offline keeps it local).",
    )
    wandb_project: str = xax.field("ksim", help="logger=wandb: the W&B project.")
    watchdog_timeout_s: float = xax.field(
        600.0,
        help="Abort with a diagnosis if one train step runs longer than this, compile excluded (0: off).",
    )
    action_delay_steps: int = xax.field(0, help="The action applied is the one chosen this many control steps ago.")
    eval_observation_noise: bool = xax.field(False, help="Also add the observations' noise in evaluation.")
    eval_events: bool = xax.field(
        True, help="Evaluations run the task's events (pushes); false: without them, as ksim.sim2sim runs an export."
    )
    eval_terrain_level: int = xax.field(-1, help="Terrain level that evaluations run on (-1: the middle level).")
    eval_terrain_type: str = xax.field(
        "", help="Terrain type that evaluations run on (empty: episode i on type i modulo the number of types)."
    )


def episode_steps(config: RLConfig) -> int:
    """Control steps of an episode's time limit (episode_length_steps, or episode_length_s over ctrl_dt)."""
    if config.episode_length_steps is not None:
        return config.episode_length_steps
    return max(1, round((config.episode_length_s or 0.0) / config.ctrl_dt))


class PolicyOutput(struct.PyTreeNode):
    """What the policy returns for one env's control step."""

    action: Array
    log_prob: Array  # of `action` under the policy that chose it
    state: PolicyState  # the env's next policy state
    obs: Array  # the network's input (the last observation_history frames, flattened), recorded for the update
    carry: Array  # the GRU states before this step, recorded so the update can replay from a rollout's start


class Episode(struct.PyTreeNode):
    """One env's running episode (or a batch with a leading env axis)."""

    data: mjx.Data
    obs: Array  # without observation noise (the policy's input gets it in step_env)
    critic_obs: Array  # the critic's own observations (never noised; empty without a critic group)
    policy_state: PolicyState
    last_action: Array
    episode_return: Array
    episode_length: Array
    discounted_return: Array  # sum of gamma^(t - k) reward_k over the episode's steps k <= t so far
    rng: Array
    randomized: Randomized  # this episode's model fields and PD-gain scales (empty dicts: none)
    command: Array  # (command size,)
    command_state: Array  # the command's own state: a held command's steps left, a motion's frame
    event_timers: Array  # (num events,) control steps until each event
    action_queue: Array  # (action_delay_steps, action_dim) chosen actions not yet applied, oldest first
    component_state: dict[str, Any]  # stateful rewards' and terminations' state by key (ksim.stateful)


class Trajectory(struct.PyTreeNode):
    """A rollout, time-major: leaves are (rollout_length, num_envs, ...)."""

    obs: Array  # the policy network's input (observation_history noised frames)
    next_obs: Array  # the next frame (unnoised), before any automatic reset, for bootstrapping
    action: Array
    reward: Array
    terminated: Array
    truncated: Array
    log_prob: Array  # of the action, as the rollout's policy chose it
    critic_obs: Array  # the critic's own observations (empty without a critic group)
    next_critic_obs: Array
    carry: Array  # (2, recurrent_size) GRU states before the step
    discounted_return: Array  # the episode's discounted return after the step (normalize_returns' statistic)


class Transition(struct.PyTreeNode):
    trajectory: Trajectory
    episode_return: Array  # running return, final at `done`
    episode_length: Array
    reward_terms: dict[str, Array]


class EnvState(struct.PyTreeNode):
    """Every env: its episode, whether that ended at the last control step, and the start of its next one.

    An env whose episode ended starts the next one at its next control step, from `next_start` (computed
    ahead, a batch at a time). Episode k of env i starts from `fold_in(reset_key[i], k)`, so env i's starts
    depend only on its own key, never on when the pool is refilled or on which device (or with which
    other envs) it runs; with a command that samples starts where episodes fail (a motion), the start's bin also
    depends on the shard's recent failures (`start_failures`, summed over its envs). A fresh state has no episode
    yet (`ended` everywhere): the first control step starts every env's first episode, so the starts compile once,
    inside the rollout.
    """

    current: Episode  # the running episode, or the one that ended at the last step (`ended`)
    ended: Array
    next_start: Episode
    next_start_ready: Array
    episodes_started: Array
    reset_key: Array
    terrain: TerrainCells  # each env's terrain tile (zeros without a terrain); the curriculum moves it
    start_failures: Array  # (start_bins,) per env: its recent failures per start bin of the command (ksim.commands)

    @property
    def obs(self) -> Array:
        return self.current.obs

    @property
    def data(self) -> mjx.Data:
        return self.current.data


class SharedState(struct.PyTreeNode):
    """What every env shares: the learner's parameters, optimizer state and observation statistics (the
    actor's, and the critic's own when it has a critic group; of size 0 without), and with
    policy_average_decay > 0 the parameters' moving average."""

    params: Any
    opt_state: Any
    normalizer: Normalizer
    critic_normalizer: Normalizer
    return_normalizer: Normalizer | None = None  # normalize_returns: the discounted return's statistics
    average_params: Any = None  # policy_average_decay > 0: what is evaluated, exported and viewed

    @classmethod
    def initial(
        cls,
        params: Any,
        optimizer: optax.GradientTransformation,
        observation_dim: int,
        critic_observation_dim: int,
        normalize_returns: bool,
        average_params: bool = False,
    ) -> SharedState:
        """New shared state: `params`, their optimizer state and empty statistics (an average starts at `params`)."""
        return cls(
            params=params,
            opt_state=optimizer.init(params),
            normalizer=Normalizer.create(observation_dim),
            critic_normalizer=Normalizer.create(critic_observation_dim),
            return_normalizer=Normalizer.create(1) if normalize_returns else None,
            average_params=params if average_params else None,
        )

    def deployed(self) -> SharedState:
        """The state a robot's policy is taken from: the averaged parameters in place of the latest, if kept."""
        return self if self.average_params is None else self.replace(params=self.average_params)

    def averaged(self, decay: float) -> SharedState:
        """One train step of the parameters' moving average (unchanged when none is kept)."""
        if self.average_params is None:
            return self
        return self.replace(average_params=optax.incremental_update(self.params, self.average_params, 1.0 - decay))


class TrainState(struct.PyTreeNode):
    shared: SharedState
    env: EnvState
    rng: Array
