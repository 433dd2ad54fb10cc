"""One env driven live by a policy, for the viewer: `Environment.start_episode` and `step_env`, jitted once.

The viewer's controls act between control steps: a command held at slider values (the policy sees it from
the next observation on, as it would see a new command in training), a push of the base, a reset,
deterministic or sampled actions. Each step hands the host what the viewer shows (`StepReport`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ksim.config import ConfigError
from ksim.events import Push
from ksim.reporting import unique_names
from ksim.task.env import Environment
from ksim.task.types import Episode
from ksim.terminations import physics_diverged
from ksim.terrain import TerrainCells

Array = jax.Array
HELD_COMMAND_STEPS = 2**30  # a command set from the viewer is never redrawn by the task's timer
TIME_LIMIT = "time limit"
COMMAND_ENDED = "end of the command"  # a motion's clip played to its last frame
DIVERGED = "physics diverged"


@dataclass(frozen=True)
class StepReport:
    """Host values after one control step of the viewed env."""

    qpos: np.ndarray
    obs: np.ndarray  # the observation the policy acted on
    action: np.ndarray
    reward_terms: dict[str, float]
    episode_return: float
    episode_length: int
    ended_by: str | None  # the termination that ended the episode, TIME_LIMIT, COMMAND_ENDED, or None while it runs
    reference_qpos: np.ndarray | None = None  # the pose the command asks for (a motion's frame); None: none


def push_of(environment: Environment, max_velocity: tuple[float, float, float]) -> Push | None:
    """A push of the base, or None where the base has no free joint to push."""
    try:
        return Push(max_velocity=max_velocity).bind(environment.engine.layout)
    except ConfigError:
        return None


class ViewerSim:
    """A single env of `environment` acting with `shared` (a host copy of the learner's state)."""

    def __init__(
        self,
        environment: Environment,
        shared: Any,
        seed: int = 0,
        terrain_level: int = 0,
        terrain_column: int | None = None,
    ) -> None:
        """With a terrain, every episode starts on a tile of `terrain_level`: of `terrain_column`, or of each
        terrain type in turn."""
        self.environment = environment
        self.terrain_level, self.terrain_column = terrain_level, terrain_column
        self.device = jax.local_devices()[0]
        self.shared = jax.device_put(shared, self.device)
        self.termination_names = [*unique_names([t.name for t in environment.components.terminations]), DIVERGED]
        self.push = push_of(environment, (1.0, 1.0, 0.0))
        self._key = jax.random.PRNGKey(seed)
        self._draws = 0
        self._episodes = 0  # started so far: with a terrain and no column, each starts on the next type
        self.episode = self._started(self._next_key())
        self.held_command: np.ndarray | None = None

    # ----- the jitted programs (each compiles once; the step once per action mode) ---------------------------

    @functools.cached_property
    def _start(self) -> Any:
        # Episodes start as the evaluation's do (a motion from its clip's first frame).
        return jax.jit(functools.partial(self.environment.start_episode, from_beginning=True))

    @functools.cached_property
    def _step(self) -> Any:
        return jax.jit(self._step_one, static_argnames="deterministic")

    @functools.cached_property
    def _push_program(self) -> Any:
        return jax.jit(self._push_one)

    def _step_one(
        self, shared: Any, episode: Episode, command: Array, hold: Array, deterministic: bool
    ) -> tuple[Episode, dict[str, Any]]:
        episode = episode.replace(
            command=jnp.where(hold, command, episode.command),
            command_state=jnp.where(hold, HELD_COMMAND_STEPS, episode.command_state),
        )
        stepped, transition = self.environment.step_env(shared, episode, deterministic)
        engine = self.environment.engine
        ctx = engine.context(
            stepped.data, episode.data, stepped.last_action, episode.last_action, stepped.data.ctrl, episode.command
        )
        ended = [t.terminated(ctx) for t in self.environment.components.terminations] + [physics_diverged(ctx)]
        trajectory = transition.trajectory
        report = {
            "qpos": stepped.data.qpos,
            "obs": trajectory.obs,
            "action": trajectory.action,
            "reward_terms": transition.reward_terms,
            "episode_return": transition.episode_return,
            "episode_length": transition.episode_length,
            "terminations": jnp.stack(ended),
            "terminated": trajectory.terminated,
            "truncated": trajectory.truncated,
        }
        task_command = self.environment.components.command
        reference = None if task_command is None else task_command.reference_qpos(stepped.command_state)
        if reference is not None:
            report["reference_qpos"] = reference
        return stepped, report

    def _push_one(self, episode: Episode, rng: Array) -> Episode:
        assert self.push is not None
        engine = self.environment.engine
        data = self.push.apply(episode.data, engine.layout, rng)
        return episode.replace(data=engine.velocities_changed(data, episode.randomized.model_fields))

    # ----- what the viewer calls -----------------------------------------------------------------------------

    def _next_key(self) -> Array:
        key = jax.random.fold_in(self._key, self._draws)
        self._draws += 1
        return key

    @property
    def command_size(self) -> int:
        return int(self.episode.command.shape[0])

    @property
    def qpos(self) -> np.ndarray:
        return np.asarray(jax.device_get(self.episode.data.qpos))

    @property
    def reference_qpos(self) -> np.ndarray | None:
        """The pose the command asks for now (a motion's frame); None without one."""
        command = self.environment.components.command
        reference = None if command is None else command.reference_qpos(self.episode.command_state)
        return None if reference is None else np.asarray(jax.device_get(reference))

    def _started(self, key: Array) -> Episode:
        # Committed to the device like the step's outputs, so that the step sees one input signature and
        # compiles once (an uncommitted episode would be a second cache entry: a second compile).
        cell = self._next_cell()
        self._episodes += 1
        return jax.device_put(self._start(key, cell), self.device)

    def _next_cell(self) -> TerrainCells | None:
        """The next episode's tile (None without a terrain, whose episodes start at the model's own pose)."""
        terrain = self.environment.terrain
        if terrain is None:
            return None
        column = self.terrain_column
        if column is None:
            column = self._episodes % len(terrain.grid.types)
        return TerrainCells(level=jnp.int32(self.terrain_level), column=jnp.int32(column))

    def reset(self) -> None:
        """Starts a new episode (the next of this viewer's seed)."""
        self.episode = self._started(self._next_key())

    def push_base(self) -> None:
        """Kicks the base with a random horizontal velocity of up to 1 m/s per axis (free bases only)."""
        if self.push is not None:
            self.episode = self._push_program(self.episode, self._next_key())

    def step(self, deterministic: bool = True) -> StepReport:
        """One control step; an episode that ends is followed by a new one at the next step."""
        hold = self.held_command is not None
        command = self.held_command if hold else np.zeros(self.command_size, np.float32)
        self.episode, report = self._step(self.shared, self.episode, command, hold, deterministic=deterministic)
        host = jax.device_get(report)
        ended_by = self._ended_by(host)
        if ended_by is not None:
            self.reset()
        return StepReport(
            qpos=np.asarray(host["qpos"]),
            obs=np.asarray(host["obs"]),
            action=np.asarray(host["action"]),
            reward_terms={name: float(value) for name, value in host["reward_terms"].items()},
            episode_return=float(host["episode_return"]),
            episode_length=int(host["episode_length"]),
            ended_by=ended_by,
            reference_qpos=np.asarray(host["reference_qpos"]) if "reference_qpos" in host else None,
        )

    def _ended_by(self, host: dict[str, Any]) -> str | None:
        if bool(host["terminated"]):
            fired = np.flatnonzero(host["terminations"])
            return ", ".join(self.termination_names[i] for i in fired) or DIVERGED
        if not bool(host["truncated"]):
            return None
        out_of_time = int(host["episode_length"]) >= self.environment.settings.max_episode_steps
        return TIME_LIMIT if out_of_time else COMMAND_ENDED
