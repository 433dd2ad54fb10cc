"""Gymnasium's MuJoCo v5 locomotion tasks (Hopper, Walker2d, HalfCheetah, Ant) as ksim tasks, trained with ksim's PPO.

    .venv/bin/python -m benchmarks.gymnasium_suite                                 # 4 tasks x 3 seeds, 1M env steps
    .venv/bin/python -m benchmarks.gymnasium_suite --tasks Hopper-v5 --seeds 1 --env-steps 5000000 --gymnasium-check
    .venv/bin/python -m benchmarks.gymnasium_suite --env-steps 5000000 --eval-every 250000 --tuned

Each task loads Gymnasium's own MJCF file from the installed `gymnasium` package (nothing is copied into this
repository) and is defined as Gymnasium 1.x defines the v5 task: observation, reward terms and weights, healthy
ranges, reset noise, `frame_skip`, the 1000-step time limit. `tests/test_gymnasium_tasks.py` steps each next to
`gymnasium.make("<Task>-v5")` from the same states with the same actions and checks that observations, rewards
and terminations agree. The script trains each task and seed with the small-budget PPO preset below, evaluates the
deterministic policy at the `--eval-at` env-step counts (and every `--eval-every` env steps) and prints a markdown
table beside published PPO results, with how stable each run's last five evaluations are (spread of their returns,
worst fall rate); `--gymnasium-check` also plays each trained policy in Gymnasium's own environment. `--tuned`
applies each task's settings for 5M env steps (`TUNED_5M`) over the preset, and `--set` any setting over those.

Where ksim's components could not express Gymnasium's definition as they were, and what this does instead:

- Healthy reward: Gymnasium v5 pays it only while healthy, so not at the step that terminates; `rew.StayAlive`
  pays every step. New `rew.Healthy` (0 at a step a termination ends).
- Control cost: Gymnasium charges the action it is given, before MuJoCo clamps it to the control range;
  `rew.ControlCost` charges the applied (clipped) control. New `rew.ActionCost`. `clip_actions=True` uses
  `rew.ControlCost`, which is what the env charges behind Gymnasium's `ClipAction` wrapper (CleanRL) or SB3's
  clipping of the policy's sample.
- Positions: qpos without the root's x (Ant: x and y). `obs.JointPosition(joints=...)` can leave out the planar
  robots' `rootx` but not part of the Ant's free joint. New `obs.GeneralizedPosition(skip=...)`.
- Velocities: the whole qvel, clipped to +-10 for Hopper and Walker2d: `obs.JointVelocity` expresses it with
  `scale=1.0` and every joint named (its defaults are 0.1 and the robot joints only).
- Health: Gymnasium reads z and the pitch angle from qpos with strict bounds; `term.HealthyRange` reads the torso
  frame's height and pitch (from its float32 quaternion) with inclusive bounds. New `term.JointPositionOutside`;
  Hopper's check that qpos[2:] and qvel stay within +-100 is new `term.StateOutsideRange`. The Ant's z range is
  inclusive, and its torso's frame is its free joint's position: `term.HealthyRange` expresses it exactly.
- Resets: uniform noise on every qpos and qvel value, the roots' included: `RandomJointPositions` and
  `RandomJointVelocities` with every joint named. HalfCheetah and Ant draw qvel from a normal distribution: new
  `resets.GaussianJointVelocities`. As in Gymnasium, the Ant's quaternion gets noise and is not normalised (its
  first observation shows it so; MuJoCo normalises it in the first step).
- Forward reward: (qpos[0] after - before) / dt for the planar three, which `rew.ForwardProgress` computes
  exactly (the torso frame's x is qpos[0] in these models). The Ant's reads the torso's `xpos` after
  `do_simulation`, which is not the state's: after `mj_step` MuJoCo's data describes the step's last evaluation
  point (with the Ant's RK4 integrator, its last stage), and the position "before" a step is the previous step's
  such reading (at an episode's first step, the reset pose's). ksim's engines compute their data at the final
  state. `GymnasiumStepEngine` below keeps those positions (`stepped_xpos`), `SteppedForwardProgress` reads them.
- Contact forces: the Ant observes `cfrc_ext` of its 12 bodies (78 values, clipped to +-1) and pays a contact
  cost on them; Gymnasium computes them with `mj_rnePostConstraint` after the step, at that evaluation point.
  ksim's engines have no `cfrc_ext`. `GymnasiumStepEngine` computes it; `ContactForces` and `ContactCost` read it.
  The engine and these three components live here rather than in ksim's modules because the components read
  fields only this engine fills; the Ant therefore needs `physics_impl='mujoco'` (C MuJoCo, the CPU default).
- Precision: ksim holds the state in float32 between control steps (every JAX state does), Gymnasium in float64.
  Each control step is the same float64 MuJoCo computation, from the float32 rounding of the previous step's end
  (the solver's warm start included), so trajectories drift apart by rounding; the forward reward, a difference
  of float32 positions divided by dt, is off by up to |x| * 6e-8 / dt (Hopper 10 m from the origin: 7e-5 m/s).
- Equal as they were: `frame_skip` substeps of the model's timestep (`dt` = timestep, `ctrl_dt` = frame_skip *
  timestep), the actuators (`TorqueActuators` clip to the control range as MuJoCo clamps: the same forces), the
  1000-step limit as a truncation (`episode_length_steps=1000`), termination ending the episode.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import xax

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, TorqueActuators
from ksim.binding import resolved, with_resolved
from ksim.config import ConfigError, parse_overrides
from ksim.engine import ModelLayout, PhysicsEngine, StepContext, body_index
from ksim.physics import resolve_physics_impl
from ksim.physics.native import DERIVED, STATE, NativeData, NativeEngine, field_shapes, reads_state
from ksim.resets import GaussianJointVelocities, RandomJointPositions, RandomJointVelocities, Reset
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask
from ksim.task.evaluation import EvalResult

Array = jax.Array
EPISODE_STEPS = 1000  # Gymnasium registers the four with max_episode_steps=1000


def gymnasium_asset(xml_file: str) -> Path:
    """An MJCF file of the installed gymnasium package (gymnasium/envs/mujoco/assets/), found without importing it."""
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or spec.origin is None:
        raise ConfigError("the Gymnasium tasks load their models from the gymnasium package: pip install gymnasium")
    path = Path(spec.origin).parent / "envs" / "mujoco" / "assets" / xml_file
    if not path.exists():
        raise ConfigError(f"{path} not found: the installed gymnasium has no {xml_file}")
    return path


def load_gymnasium_model(xml_file: str) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(gymnasium_asset(xml_file)))


# ----- the Ant's engine: C MuJoCo stepped as Gymnasium's MujocoEnv steps it ------------------------------------


class GymnasiumData(NativeData):
    """NativeData and what Gymnasium's Ant reads from MuJoCo's data right after its step."""

    stepped_xpos: Array  # (nbody, 3) positions as `mj_step` leaves them, at its last evaluation point
    cfrc_ext: Array  # (nbody, 6) external (contact) wrenches, `mj_rnePostConstraint` after the step


EXTRA = ("stepped_xpos", "cfrc_ext")


def packing(shapes: dict[str, tuple[int, ...]], names: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """(name, start, end) of each field in one flat row holding `names` in order."""
    ends = np.cumsum([math.prod(shapes[name]) for name in names])
    return tuple((name, int(end - math.prod(shapes[name])), int(end)) for name, end in zip(names, ends, strict=True))


@dataclass(frozen=True)
class GymnasiumStepEngine(NativeEngine):
    """C MuJoCo stepped as Gymnasium's `MujocoEnv.do_simulation`: `mj_step` over the control step's substeps, then
    `mj_rnePostConstraint`, one env after another. The data is NativeData's (its derived fields at the final state,
    as every engine's) plus `stepped_xpos` and `cfrc_ext` as Gymnasium reads them after the step."""

    @functools.cached_property
    def _shapes_with_extra(self) -> dict[str, tuple[int, ...]]:
        nbody = self.mj_model.nbody
        return {**field_shapes(self.mj_model), "stepped_xpos": (nbody, 3), "cfrc_ext": (nbody, 6)}

    @functools.cached_property
    def _input(self) -> tuple[tuple[str, int, int], ...]:
        return packing(self._shapes_with_extra, STATE)

    @functools.cached_property
    def _output(self) -> tuple[tuple[str, int, int], ...]:
        return packing(self._shapes_with_extra, (*STATE, *EXTRA, *DERIVED))

    def make_data(self, qpos: Array, qvel: Array, fields: dict[str, Array] | None = None) -> GymnasiumData:
        """A pose as Gymnasium's reset leaves it: positions current (`mj_forward`), no contact forces (its
        `mj_resetData` zeroes them and `mj_forward` does not compute them)."""
        data = super().make_data(qpos, qvel, fields)
        native = {field.name: getattr(data, field.name) for field in dataclasses.fields(NativeData)}
        no_forces = jnp.zeros(self._shapes_with_extra["cfrc_ext"], jnp.float32)
        return GymnasiumData(**native, stepped_xpos=data.xpos, cfrc_ext=no_forces)

    def step(
        self, data: NativeData, control: Callable[[NativeData], Array], fields: dict[str, Array] | None = None
    ) -> tuple[NativeData, Array]:
        if fields:
            raise ConfigError(f"{type(self).__name__} runs the model as written: no randomized model fields")
        if reads_state(control, data):
            raise ConfigError(f"{type(self).__name__} needs a control that does not read the state (TorqueActuators)")
        data = data.replace(ctrl=jnp.asarray(control(data), jnp.float32))
        row = jnp.concatenate([jnp.ravel(jnp.asarray(getattr(data, name), jnp.float32)) for name in STATE])
        packed = jax.pure_callback(
            self._step_host,
            jax.ShapeDtypeStruct((self._output[-1][2],), jnp.float32),
            row,
            vmap_method="broadcast_all",
        )
        shapes = self._shapes_with_extra
        return data.replace(**{name: packed[a:b].reshape(shapes[name]) for name, a, b in self._output}), data.ctrl

    def _step_host(self, rows: np.ndarray) -> np.ndarray:
        """Each env's control step from its packed state row, into one float32 row of `_output`."""
        rows = np.asarray(rows)  # the float32 state (pure_callback may hand over a jax.Array)
        lead = rows.shape[:-1]
        rows = rows.reshape(-1, rows.shape[-1]).astype(np.float64)
        out = np.empty((rows.shape[0], self._output[-1][2]), np.float32)
        mj_data = mujoco.MjData(self.mj_model)  # one per call: callbacks of several devices may run at once
        for env, row in enumerate(rows):
            for name, a, b in self._input:
                if name == "time":
                    mj_data.time = row[a]
                else:
                    getattr(mj_data, name)[...] = row[a:b].reshape(getattr(mj_data, name).shape)
            mujoco.mj_step(self.mj_model, mj_data, nstep=self.num_substeps)
            mujoco.mj_rnePostConstraint(self.mj_model, mj_data)
            values = {"stepped_xpos": mj_data.xpos.copy(), "cfrc_ext": mj_data.cfrc_ext.copy()}
            values |= {name: np.copy(getattr(mj_data, name)) for name in STATE}  # mj_step1 resets a bad state
            mujoco.mj_step1(self.mj_model, mj_data)  # positions and velocities at the final state, as NativeEngine
            values |= {name: getattr(mj_data, name) for name in DERIVED}
            for name, a, b in self._output:
                out[env, a:b] = np.ravel(values[name])
        return out.reshape(*lead, out.shape[-1])


@dataclass(frozen=True)
class ContactForces(obs.Observation):
    """Every body's external (contact) wrench but the world's, clipped to +-`clip`: Ant-v5's `cfrc_ext`
    observation (reads GymnasiumStepEngine's data)."""

    clip: float = 1.0

    def observe(self, ctx: StepContext) -> Array:
        return jnp.clip(ctx.data.cfrc_ext[1:], -self.clip, self.clip)


@dataclass(frozen=True)
class ContactCost(rew.Reward):
    """Squared external (contact) wrenches of every body, clipped to +-`clip`, summed: Ant-v5's contact cost
    (reads GymnasiumStepEngine's data)."""

    clip: float = 1.0

    def value(self, ctx: StepContext) -> Array:
        return jnp.sum(jnp.square(jnp.clip(ctx.data.cfrc_ext, -self.clip, self.clip)))


@dataclass(frozen=True)
class SteppedForwardProgress(rew.Reward):
    """A body's x displacement between its positions as `mj_step` left them before and after the control step,
    over ctrl_dt: Ant-v5's forward reward (reads GymnasiumStepEngine's data)."""

    body: str = "torso"
    body_id: int = resolved()

    def bind(self, layout: ModelLayout) -> Self:
        return with_resolved(self, body_id=body_index(layout.body_names, self.body, f"{self.name}.body"))

    def value(self, ctx: StepContext) -> Array:
        after, before = ctx.data.stepped_xpos[self.body_id, 0], ctx.prev_data.stepped_xpos[self.body_id, 0]
        return (after - before) / ctx.ctrl_dt


# ----- the tasks -----------------------------------------------------------------------------------------------


@dataclass
class GymnasiumConfig(DistributedPPOConfig):
    clip_actions: bool = xax.field(
        False,
        help="Charge the control cost on the action clipped to the control range, as the env sees it behind "
        "Gymnasium's ClipAction wrapper (CleanRL) or SB3's clipping; False: on the raw action, as Gymnasium's env.",
    )


class GymnasiumTask(DistributedPPOTask[GymnasiumConfig]):
    """What the four share: Gymnasium's model file, torque actuators, the control cost's choice."""

    gymnasium_id: ClassVar[str]
    xml_file: ClassVar[str]
    frame_skip: ClassVar[int]

    def get_mujoco_model(self) -> mujoco.MjModel:
        return load_gymnasium_model(self.xml_file)

    def get_actuators(self) -> Actuators:
        return TorqueActuators.from_model(self.engine.mj_model)

    @property
    def every_joint(self) -> tuple[str, ...]:
        """The model's joints in order, roots included: their coordinates are the whole qpos and qvel."""
        return self.engine.layout.joint_names

    def control_cost(self, weight: float) -> rew.Reward:
        return rew.ControlCost(scale=-weight) if self.config.clip_actions else rew.ActionCost(scale=-weight)


class HoppingTask(GymnasiumTask):
    """Hopper and Walker2d: the same observation, rewards and reset noise; their healthy ranges differ."""

    def get_observations(self) -> Sequence[obs.Observation]:
        return [obs.GeneralizedPosition(skip=1), obs.JointVelocity(scale=1.0, clip=10.0, joints=self.every_joint)]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [rew.ForwardProgress(scale=1.0), rew.Healthy(scale=1.0), self.control_cost(1e-3)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(5e-3, self.every_joint), RandomJointVelocities(5e-3, self.every_joint)]


class HopperTask(HoppingTask):
    gymnasium_id, xml_file, frame_skip = "Hopper-v5", "hopper.xml", 4

    def get_terminations(self) -> Sequence[term.Termination]:
        return [
            term.JointPositionOutside("rootz", low=0.7),
            term.JointPositionOutside("rooty", low=-0.2, high=0.2),
            term.StateOutsideRange(low=-100.0, high=100.0, skip=("rootx", "rootz")),
        ]


class Walker2dTask(HoppingTask):
    gymnasium_id, xml_file, frame_skip = "Walker2d-v5", "walker2d_v5.xml", 4

    def get_terminations(self) -> Sequence[term.Termination]:
        return [
            term.JointPositionOutside("rootz", low=0.8, high=2.0),
            term.JointPositionOutside("rooty", low=-1.0, high=1.0),
        ]


class HalfCheetahTask(GymnasiumTask):
    gymnasium_id, xml_file, frame_skip = "HalfCheetah-v5", "half_cheetah.xml", 5

    def get_observations(self) -> Sequence[obs.Observation]:
        return [obs.GeneralizedPosition(skip=1), obs.JointVelocity(scale=1.0, joints=self.every_joint)]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [rew.ForwardProgress(scale=1.0), self.control_cost(0.1)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return []

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(0.1, self.every_joint), GaussianJointVelocities(0.1, self.every_joint)]


class AntTask(GymnasiumTask):
    gymnasium_id, xml_file, frame_skip = "Ant-v5", "ant.xml", 5

    def validate_config(self) -> None:
        super().validate_config()
        impl = resolve_physics_impl(self.config.physics_impl, jax.local_devices()[0])
        if impl != "mujoco":
            raise ConfigError(
                f"physics_impl={self.config.physics_impl!r} runs {impl!r} here; {self.gymnasium_id} reads MuJoCo's "
                "data as Gymnasium does after its steps: set physics_impl='mujoco' (C MuJoCo, CPU devices)"
            )

    def get_engine(self) -> PhysicsEngine:
        engine = super().get_engine()
        assert isinstance(engine, NativeEngine)  # validate_config chose C MuJoCo
        return GymnasiumStepEngine(**{field.name: getattr(engine, field.name) for field in dataclasses.fields(engine)})

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.GeneralizedPosition(skip=2),
            obs.JointVelocity(scale=1.0, joints=self.every_joint),
            ContactForces(clip=1.0),
        ]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [
            SteppedForwardProgress(scale=1.0, body="torso"),
            rew.Healthy(scale=1.0),
            self.control_cost(0.5),
            ContactCost(scale=-5e-4, clip=1.0),
        ]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [term.HealthyRange(min_height=0.2, max_height=1.0)]

    def get_resets(self) -> Sequence[Reset]:
        return [RandomJointPositions(0.1, self.every_joint), GaussianJointVelocities(0.1, self.every_joint)]


TASKS: dict[str, type[GymnasiumTask]] = {
    task.gymnasium_id: task for task in (HopperTask, Walker2dTask, HalfCheetahTask, AntTask)
}

# The small-budget preset, for comparing sample efficiency with CleanRL's ppo_continuous_action (one env, 2,048-step
# rollouts, 32 minibatches, 10 epochs, Adam 3e-4 annealed to 0, 64x64 tanh networks, log std 0, no entropy bonus,
# gradient clip 0.5, observation and return normalisation). ksim steps many envs at once, so its 2,048 samples per
# update are 32 envs x 64 steps, shuffled as single steps into 32 minibatches of 64 (minibatch_shuffle=steps).
SMALL_BUDGET_PPO: dict[str, Any] = {
    "num_envs": 32,
    "rollout_length_frames": 64,
    "batch_size": 1,
    "minibatch_shuffle": "steps",
    "num_passes": 10,
    "learning_rate": 3e-4,
    "learning_rate_schedule": "linear",
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "value_clip_eps": 0.2,
    "entropy_coef": 0.0,
    "value_coef": 0.5,
    "max_grad_norm": 0.5,
    "actor_hidden": [64, 64],
    "critic_hidden": [64, 64],
    "init_log_std": 0.0,
    "normalize_observations": True,
    "normalize_returns": True,
}


# Each task's settings over the preset for runs of 5M env steps (`--tuned`; docs/benchmarks.md, "At 5M env steps"):
# an entropy bonus keeps the policy's noise, and with it the size of each update, from collapsing (the preset's
# Hopper falls in every episode after 2.5M); gamma 0.995 stops a late trade of staying up for speed; the Walker2d
# and the Ant need a lower rate to hold their KL, and smaller bonuses (with 0.01 their noise grows until the mean
# action, which the evaluation runs, falls; the Ant's 0.0025 let one seed of three settle on a slow gait); the
# HalfCheetah and the Ant start with less noise (with log std 0, two HalfCheetah seeds of four settled on a gait a
# quarter as fast); the Ant's falls are bounds that lift its torso over the 1 m ceiling, which gamma 0.999 (a
# horizon as long as the episode) prices in; the Ant's cosine anneal levels off a climb that the linear one left
# rising through the last fifth of the run (one seed of four spread 15.4% over its last five).
TUNED_5M: dict[str, dict[str, Any]] = {
    "Hopper-v5": {"entropy_coef": 0.01, "gamma": 0.995},
    "Walker2d-v5": {"entropy_coef": 0.0025, "gamma": 0.995, "learning_rate": 1e-4},
    "HalfCheetah-v5": {"entropy_coef": 0.01, "gamma": 0.995, "init_log_std": -1.0},
    "Ant-v5": {
        "entropy_coef": 0.005,
        "gamma": 0.999,
        "learning_rate": 1e-4,
        "learning_rate_schedule": "cosine",
        "init_log_std": -1.0,
    },
}


def task_config(task: type[GymnasiumTask], **overrides: Any) -> GymnasiumConfig:
    """The task's Gymnasium timing (the model's timestep, `frame_skip` of them per control step, 1000 steps) with the
    small-budget PPO preset; `overrides` replace any of them."""
    timestep = float(load_gymnasium_model(task.xml_file).opt.timestep)
    settings: dict[str, Any] = {
        "dt": timestep,
        "ctrl_dt": timestep * task.frame_skip,
        "episode_length_s": None,
        "episode_length_steps": EPISODE_STEPS,
        "eval_every_n_steps": 0,
        "save_every_n_steps": 0,
        **SMALL_BUDGET_PPO,
    }
    return GymnasiumConfig(**{**settings, **overrides})


# ----- the benchmark -------------------------------------------------------------------------------------------

LAST_EVALUATIONS = 5  # a run's stability is judged over its last five evaluations

# Published PPO results at 1M env steps (mean ± std as published), on earlier versions of these tasks.
CLEANRL = {"Hopper-v5": "2382.86 ± 271.74", "Walker2d-v5": "2287.95 ± 571.78", "HalfCheetah-v5": "1442.64 ± 46.03"}
ZOO = {
    "Hopper-v5": "2410.44 ± 10.03",
    "Walker2d-v5": "3478.80 ± 821.71",
    "HalfCheetah-v5": "5819.10 ± 663.53",
    "Ant-v5": "1327.16 ± 451.58",
}
CAPTION = (
    "ksim: deterministic-policy return, mean over {episodes} evaluation episodes per run, then mean ± std over "
    "seeds, with the small-budget PPO preset (benchmarks/gymnasium_suite.py). CleanRL: ppo_continuous_action.py on "
    "the v4 tasks, average episodic return of its training episodes at 1M steps "
    "(https://docs.cleanrl.dev/rl-algorithms/ppo/, MuJoCo v4 table, tag pr-424; its table has no Ant). "
    "rl-baselines3-zoo: PPO on the v3 tasks, one trained agent per task, 1M steps, deterministic policy, mean ± std "
    "over its evaluation episodes (https://github.com/DLR-RM/rl-baselines3-zoo/blob/master/benchmark.md). v3/v4 "
    "differ from v5 in details (v5 pays no healthy reward at the terminating step; Ant-v5 observes and pays for "
    "contact forces, which Ant-v3 read as zeros under mujoco-py >= 2 and Ant-v4 leaves out by default), so the "
    "published figures are context, not the same MDP."
)


@dataclass
class RunResult:
    """One task and seed: its evaluations by the env steps trained before each, and the run's wall time."""

    task: str
    seed: int
    evaluations: dict[int, EvalResult]
    wall_s: float
    updates: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)  # UPDATE_METRICS before each
    # With policy_average_decay > 0 `evaluations` run the parameters' average (what a robot gets) and `latest` the
    # latest parameters, side by side: the average does not change training, so one run shows what it is worth.
    latest: dict[int, EvalResult] = dataclasses.field(default_factory=dict)


# What --log-updates prints beside each evaluation: the train steps' means since the previous evaluation.
UPDATE_METRICS = ("entropy", "approx_kl", "clip_fraction", "local_grad_norm", "learning_rate")


def train_and_evaluate(
    task_class: type[GymnasiumTask],
    seed: int,
    env_steps: int,
    eval_at: Sequence[int],
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> tuple[RunResult, GymnasiumTask, Any]:
    """Trains for `env_steps` env steps (whole train steps) and evaluates after the first train step that reaches
    each of `eval_at` (passing each evaluation's `update_line` to `log` as it is made). Returns the run's result
    (its wall time counts everything: building, compiling, evaluating), the task and the trained shared state."""
    start = time.perf_counter()
    config = task_config(task_class, seed=seed, **overrides)
    num_steps = max(1, math.ceil(env_steps / (config.num_envs * config.rollout_length_frames)))
    task = task_class(dataclasses.replace(config, num_steps=num_steps))  # the learning rate anneals over num_steps
    state = task.init_train_state()
    run = RunResult(task_class.gymnasium_id, seed, {}, 0.0)
    due, since_evaluation = sorted(set(eval_at)), []
    for step in range(1, num_steps + 1):
        state, metrics = task.train_step(state)
        state = task.after_train_step(state, step)
        since_evaluation.append({name: metrics[name] for name in UPDATE_METRICS if name in metrics})
        trained = step * task.env_steps_per_train_step
        if due and (trained >= due[0] or step == num_steps):
            shared = task.fetch_replicated(state.shared)
            run.evaluations[trained] = task.evaluate(shared)
            if shared.average_params is not None:
                run.latest[trained] = task.evaluate(shared.replace(average_params=shared.params))
            means = jax.tree.map(lambda *values: float(np.mean(values)), *jax.device_get(since_evaluation))
            run.updates[trained], since_evaluation = means, []
            due = [count for count in due if count > trained]
            if log is not None:
                log(update_line(run, trained))
    shared = jax.block_until_ready(task.fetch_replicated(state.shared))
    run.wall_s = time.perf_counter() - start
    return run, task, shared


def return_and_falls(result: EvalResult) -> str:
    return f"return {np.mean(result.returns):.1f} ({int(np.sum(result.fell))}/{len(result.returns)} fell)"


def update_line(run: RunResult, steps: int) -> str:
    """The evaluation after `steps` env steps (and the latest parameters' beside it, if the run keeps an average),
    then the means of the updates since the previous evaluation."""
    means = " ".join(f"{name} {value:.4g}" for name, value in run.updates.get(steps, {}).items())
    latest = f" | latest parameters: {return_and_falls(run.latest[steps])}" if steps in run.latest else ""
    return f"  {steps:,} env steps: {return_and_falls(run.evaluations[steps])}{latest} | {means}"


def gymnasium_returns(task: GymnasiumTask, shared: Any, episodes: int, seed: int) -> list[float]:
    """The deterministic policy's returns in `gymnasium.make(<task id>)` itself (clipping its actions with
    clip_actions, as the ClipAction wrapper would)."""
    import gymnasium

    from ksim.modes.export import deterministic_step

    policy = jax.jit(deterministic_step(task, shared))
    env = gymnasium.make(task.gymnasium_id)
    space = env.action_space
    assert isinstance(space, gymnasium.spaces.Box)
    low, high = space.low, space.high
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed * 1000 + episode)
        total, done = 0.0, False
        while not done:
            action = np.asarray(policy(jnp.asarray(observation, jnp.float32)[None])[0][0], np.float64)
            action = np.clip(action, low, high) if task.config.clip_actions else action
            observation, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def steps_label(count: int) -> str:
    """1M, 2.5M, or 4,096 for counts that are no multiple of 100k."""
    return f"{count / 1e6:g}M" if count % 100_000 == 0 else f"{count:,}"


def mean_std(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def summary_table(results: Sequence[RunResult], eval_at: Sequence[int], episodes: int) -> str:
    """Per task: the mean evaluation return at each checkpoint over seeds, the stability of the runs' last
    evaluations, wall time, the published figures."""
    checkpoints = sorted(set(eval_at))
    header = ["task", "seeds", *(f"ksim at {steps_label(count)}" for count in checkpoints)]
    header += [f"last {LAST_EVALUATIONS} evaluations: spread / fall rate (worst seed)", "wall s per run"]
    header += ["CleanRL PPO (v4, 1M)", "SB3 zoo PPO (v3, 1M)"]
    lines = [f"Table: {CAPTION.format(episodes=episodes)}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|")
    for task in dict.fromkeys(result.task for result in results):
        runs = [result for result in results if result.task == task]
        cells = [task, str(len(runs))]
        for count in checkpoints:
            evaluations = [evaluation for run in runs if (evaluation := at(run, count)) is not None]
            returns = [float(np.mean(evaluation.returns)) for evaluation in evaluations]
            cells.append(mean_std(returns) if returns else "-")
        cells.append(stability_cell(runs))
        cells.append(mean_std([run.wall_s for run in runs]))
        cells += [CLEANRL.get(task, "n/a (not in CleanRL's table)"), ZOO.get(task, "-")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Stability:
    """A run's last evaluations: their lowest and highest mean return, the spread between them as a fraction of
    the highest (0.15: the lowest is 85% of the highest) and the worst fall rate among them."""

    lowest: float
    highest: float
    spread: float
    worst_fall_rate: float


def stability(by_steps: Mapping[int, EvalResult], last: int = LAST_EVALUATIONS) -> Stability | None:
    """How stable a run's last `last` evaluations are (`by_steps`: its evaluations by env steps); None when it has
    fewer."""
    evaluations = [by_steps[steps] for steps in sorted(by_steps)[-last:]]
    if len(evaluations) < last:
        return None
    returns = [float(np.mean(evaluation.returns)) for evaluation in evaluations]
    lowest, highest = min(returns), max(returns)
    spread = (highest - lowest) / abs(highest) if highest else math.inf
    worst = max(float(np.mean(evaluation.fell)) for evaluation in evaluations)
    return Stability(lowest, highest, spread, worst)


def stability_cell(runs: Sequence[RunResult]) -> str:
    """The worst spread and fall rate over the runs' last evaluations ("-" if a run has too few)."""
    measured = [stability(run.evaluations) for run in runs]
    if not measured or any(entry is None for entry in measured):
        return "-"
    spread = max(entry.spread for entry in measured if entry is not None)
    falls = max(entry.worst_fall_rate for entry in measured if entry is not None)
    return f"{spread:.0%} / {falls:.2f}"


def print_prefixed(prefix: str, line: str) -> None:
    print(f"{prefix}{line}", flush=True)


def run_summary(by_steps: Mapping[int, EvalResult]) -> str:
    """A run's final evaluation and the stability of its last ones."""
    line = f"final evaluation {np.mean(by_steps[max(by_steps)].returns):.1f}"
    if (last := stability(by_steps)) is not None:
        line += (
            f", last {LAST_EVALUATIONS} evaluations {last.lowest:.1f}-{last.highest:.1f} "
            f"(spread {last.spread:.0%}, worst fall rate {last.worst_fall_rate:.2f})"
        )
    return line


def eval_points(env_steps: int, eval_at: Sequence[int], eval_every: int) -> list[int]:
    """The env-step counts to evaluate at: `eval_at` and every `eval_every` (0: none), capped at `env_steps`."""
    periodic = range(eval_every, env_steps + 1, eval_every) if eval_every > 0 else []
    return sorted({min(count, env_steps) for count in [*eval_at, *periodic]})


def at(run: RunResult, count: int) -> EvalResult | None:
    """The run's evaluation for checkpoint `count`: the first one at or after it (the last if it trained less)."""
    reached = [steps for steps in sorted(run.evaluations) if steps >= count]
    if reached:
        return run.evaluations[reached[0]]
    return run.evaluations[max(run.evaluations)] if run.evaluations else None


def runs_table(results: Sequence[RunResult], gym_check: dict[tuple[str, int], list[float]]) -> str:
    """Per run: every evaluation (env steps trained, mean return, falls), wall time, Gymnasium's own returns."""
    lines = ["| task | seed | evaluations: env steps -> mean return (falls) | wall s | in Gymnasium's env |"]
    lines.append("|---|---:|---|---:|---|")
    for run in results:
        evaluations = ", ".join(
            f"{steps:,} -> {np.mean(result.returns):.1f} ({int(np.sum(result.fell))}/{len(result.returns)})"
            for steps, result in sorted(run.evaluations.items())
        )
        check = gym_check.get((run.task, run.seed))
        gym = f"{np.mean(check):.1f} over {len(check)} episodes" if check else "-"
        lines.append(f"| {run.task} | {run.seed} | {evaluations} | {run.wall_s:.0f} | {gym} |")
    return "\n".join(lines)


def setting_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set key=value` pairs, typed and checked against the task config; raises ConfigError on a bad one."""
    parsed = parse_overrides(task_config(HopperTask), pairs)
    return {key: getattr(parsed, key) for key in (pair.split("=", 1)[0] for pair in pairs)}


def task_settings(task_id: str, tuned: bool, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A task's settings over the preset: its TUNED_5M ones if `tuned`, then `settings` (from --set) over those."""
    return {**(TUNED_5M[task_id] if tuned else {}), **settings}


def task_names(requested: Sequence[str]) -> list[str]:
    """Gymnasium ids for names given as ids or short names (hopper, Walker2d, ...), in the order given."""
    short = {task_id.split("-")[0].lower(): task_id for task_id in TASKS}
    chosen = []
    for name in requested:
        task_id = name if name in TASKS else short.get(name.split("-")[0].lower())
        if task_id is None:
            raise SystemExit(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
        chosen.append(task_id)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="Gymnasium ids or short names")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per task: --first-seed .. --first-seed + N - 1")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to add seeds to an earlier run)")
    parser.add_argument("--env-steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument(
        "--eval-at", type=int, nargs="+", default=[1_000_000, 5_000_000], help="env-step counts (capped at --env-steps)"
    )
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N env steps (0: only --eval-at)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="deterministic episodes per evaluation")
    parser.add_argument("--clip-actions", action="store_true", help="control cost on clipped actions (see --help)")
    parser.add_argument(
        "--tuned", action="store_true", help="each task's settings for 5M env steps (TUNED_5M) over the preset"
    )
    parser.add_argument(
        "--gymnasium-check", action="store_true", help="also play each trained policy in gymnasium.make(<task>)"
    )
    parser.add_argument("--check-episodes", type=int, default=5, help="episodes of --gymnasium-check per run")
    parser.add_argument(
        "--log-updates", action="store_true", help="print each evaluation with the updates' entropy, KL, ... before it"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings over the preset's, e.g. entropy_coef=0.01 (any PPO setting: python -m examples.hopper --help)",
    )
    args = parser.parse_args()
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds={args.seeds} must be >= 1 and --first-seed={args.first_seed} >= 0")
    if args.eval_every < 0:
        parser.error(f"--eval-every={args.eval_every} must be >= 0 (0: evaluate only at --eval-at)")
    try:
        settings = setting_overrides(args.set)
    except ConfigError as error:
        parser.error(f"--set: {error}")
    columns = eval_points(args.env_steps, args.eval_at, 0)  # the table's; the runs also evaluate in between
    eval_at = eval_points(args.env_steps, args.eval_at, args.eval_every)
    results: list[RunResult] = []
    gym_check: dict[tuple[str, int], list[float]] = {}
    changed = {task_id: task_settings(task_id, args.tuned, settings) for task_id in task_names(args.tasks)}
    for task_id, task_changes in changed.items():
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            overrides = {
                **task_changes,
                "eval_episodes": args.eval_episodes,
                "clip_actions": args.clip_actions,
            }
            log = functools.partial(print_prefixed, f"{task_id} seed {seed}:") if args.log_updates else None
            run, task, shared = train_and_evaluate(TASKS[task_id], seed, args.env_steps, eval_at, log, **overrides)
            results.append(run)
            line = f"{task_id} seed {seed}: {run.wall_s:.0f} s, {run_summary(run.evaluations)}"
            if run.latest:
                line += f"; the latest parameters: {run_summary(run.latest)}"
            if args.gymnasium_check:
                gym_check[(task_id, seed)] = gymnasium_returns(task, shared, args.check_episodes, seed)
                line += f", in Gymnasium's env {np.mean(gym_check[(task_id, seed)]):.1f}"
            print(line, flush=True)
    print()
    for task_id, task_changes in changed.items():
        if task_changes:
            print(f"{task_id}'s settings over the preset: " + " ".join(f"{k}={v}" for k, v in task_changes.items()))
    print(summary_table(results, columns, args.eval_episodes))
    print()
    print(runs_table(results, gym_check))


if __name__ == "__main__":
    main()
