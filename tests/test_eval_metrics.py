"""Evaluation's locomotion measures on a task whose answers are known.

A free puck floats without gravity or contacts, so its base keeps the velocity it starts with. Each episode
starts it at 0.25 or 1.0 m/s along world x (a coin flip per episode); an episode ends by termination once the
base passes x = 0.51 m (a second termination, at 2 m, never fires), else by time after 1 s. So fast episodes
(and only they) fall, each episode's mean speed is its start speed, and against a forward command of 0.25 m/s
the tracking error is 0 or 0.75 (yaw rate error 0). Told to stand, and spinning at 0.5 rad/s about z, it drifts
at its speed with a yaw-rate error of 0.5.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.image
import mujoco
import numpy as np
import pytest

from ksim import observations as obs
from ksim import rewards as rew
from ksim import terminations as term
from ksim.actuators import Actuators, TorqueActuators
from ksim.commands import Command, VelocityCommand
from ksim.engine import ModelLayout, StepContext
from ksim.resets import Reset
from ksim.task.evaluation import default_evaluation_score, mean_drift, summary_scalars
from ksim.task.ppo import PPOConfig, PPOTask

PUCK_XML = """
<mujoco>
  <option timestep="0.01" iterations="1" ls_iterations="1" gravity="0 0 0"><flag contact="disable"/></option>
  <worldbody>
    <body name="puck" pos="0 0 1">
      <freejoint name="root"/>
      <geom type="sphere" size="0.1" mass="1"/>
      <body name="tab"><joint name="tab" type="hinge" axis="0 0 1"/><geom type="sphere" size="0.01" mass="0.01"/></body>
    </body>
  </worldbody>
  <actuator><motor joint="tab" gear="1e-9" ctrlrange="-1 1"/></actuator>
</mujoco>"""

SLOW, FAST = 0.25, 1.0
SPIN = 0.5  # rad/s about world z


@dataclasses.dataclass(frozen=True)
class CoinFlipSpeed(Reset):
    """The base starts at SLOW or FAST m/s along world x, spinning at `spin` rad/s about z."""

    spin: float = 0.0

    def apply(self, qpos: jax.Array, qvel: jax.Array, layout: ModelLayout, rng: jax.Array) -> tuple:
        return qpos, qvel.at[0].set(jnp.where(jax.random.bernoulli(rng), FAST, SLOW)).at[5].set(self.spin)


@dataclasses.dataclass(frozen=True)
class PastHalfMetre(term.Termination):
    def terminated(self, ctx: StepContext) -> jax.Array:
        return ctx.base_pos[0] > 0.51  # not 0.5, which a step lands on: float32 and float64 physics would differ


@dataclasses.dataclass(frozen=True)
class PastTwoMetres(term.Termination):
    def terminated(self, ctx: StepContext) -> jax.Array:
        return ctx.base_pos[0] > 2.0  # never within an episode's 1 s


@dataclasses.dataclass
class PuckConfig(PPOConfig):
    command: str = ""  # "", "forward" (SLOW m/s) or "stand"


class PuckTask(PPOTask[PuckConfig]):
    def get_mujoco_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(PUCK_XML)

    def get_observations(self) -> Sequence[obs.Observation]:
        return [obs.BaseLinearVelocity()]

    def get_rewards(self) -> Sequence[rew.Reward]:
        return [rew.StayAlive(scale=1.0)]

    def get_terminations(self) -> Sequence[term.Termination]:
        return [PastHalfMetre(), PastTwoMetres()]

    def get_resets(self) -> Sequence[Reset]:
        return [CoinFlipSpeed(spin=SPIN if self.config.command == "stand" else 0.0)]

    def get_command(self) -> Command | None:
        if not self.config.command:
            return None
        stand = 1.0 if self.config.command == "stand" else 0.0
        return VelocityCommand(forward=(SLOW, SLOW), lateral=(0.0, 0.0), yaw_rate=(0.0, 0.0), zero_probability=stand)

    def get_actuators(self) -> Actuators:
        return TorqueActuators.from_model(self.engine.mj_model)


def puck_config(**overrides: object) -> PuckConfig:
    settings: dict = {
        "num_envs": 4,
        "batch_size": 4,
        "rollout_length_frames": 4,
        "num_passes": 1,
        "actor_hidden": [8],
        "critic_hidden": [8],
        "ctrl_dt": 0.02,
        "dt": 0.01,
        "episode_length_s": 1.0,
        "eval_episodes": 16,
        "num_steps": 1,
        "save_every_n_steps": 0,
    }
    return PuckConfig(**{**settings, **overrides})


@pytest.mark.parametrize("command", ["", "forward"])
def test_speed_fall_rate_and_command_error_are_the_known_ones(command: str) -> None:
    with_command = bool(command)
    task = PuckTask(puck_config(command=command))
    result = task.evaluate(task.init_train_state().shared)
    fast = result.speed_x > (SLOW + FAST) / 2
    assert 0 < fast.sum() < len(fast)  # both kinds of episode occur
    np.testing.assert_allclose(result.speed_x, np.where(fast, FAST, SLOW), rtol=1e-4)
    np.testing.assert_array_equal(result.fell, fast)  # only fast episodes pass 0.51 m within 1 s
    np.testing.assert_array_equal(result.lengths, np.where(fast, 26, 50))  # past 0.51 m at step 26; limit 50
    scalars = summary_scalars(result)
    assert scalars["eval/fall_rate"] == pytest.approx(fast.mean())
    assert scalars["eval/base_speed_x"] == pytest.approx(SLOW + (FAST - SLOW) * fast.mean(), rel=1e-4)
    assert result.ended_by is not None
    np.testing.assert_array_equal(result.ended_by["PastHalfMetre"], fast)  # what ended each episode
    assert not result.ended_by["PastTwoMetres"].any()
    assert (
        scalars["eval/ended_by/PastHalfMetre"] == pytest.approx(fast.mean())
        and not scalars["eval/ended_by/PastTwoMetres"]
    )
    if with_command:
        assert result.command_error is not None
        np.testing.assert_allclose(result.command_error, np.where(fast, FAST - SLOW, 0.0), atol=1e-4)
        assert scalars["eval/command_error"] == pytest.approx((FAST - SLOW) * fast.mean(), abs=1e-4)
        assert scalars["eval/yaw_rate_error"] == pytest.approx(0.0, abs=1e-4)
        assert "eval/drift" not in scalars  # no episode was told to stand
    else:
        assert result.command_error is None and "eval/command_error" not in scalars
        assert "eval/yaw_rate_error" not in scalars and "eval/drift" not in scalars


def test_drift_is_the_speed_of_a_base_told_to_stand() -> None:
    task = PuckTask(puck_config(command="stand"))
    result = task.evaluate(task.init_train_state().shared)
    fast = result.speed_x > (SLOW + FAST) / 2
    assert result.drift is not None and 0 < fast.sum() < len(fast)
    np.testing.assert_allclose(result.drift, np.where(fast, FAST, SLOW), rtol=1e-4)
    np.testing.assert_allclose(result.command_error, result.drift, rtol=1e-4)  # the command is zero
    scalars = summary_scalars(result)
    assert scalars["eval/drift"] == pytest.approx(SLOW + (FAST - SLOW) * fast.mean(), rel=1e-4)
    assert scalars["eval/yaw_rate_error"] == pytest.approx(SPIN, abs=1e-4)


def test_training_logs_the_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    PuckTask(puck_config(eval_every_n_steps=1, run_dir=str(tmp_path))).run()
    rows = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    evals = [row for row in rows if "eval/return" in row]
    assert len(evals) == 1 and 0 < evals[0]["eval/fall_rate"] < 1
    assert evals[0]["eval/base_speed_x"] == pytest.approx(SLOW + (FAST - SLOW) * evals[0]["eval/fall_rate"], rel=1e-4)
    eval_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("eval step"))
    assert "eval/base_speed_x" in eval_line and "eval/fall_rate" in eval_line
    assert list((tmp_path / "tensorboard").iterdir())  # the same scalars go to TensorBoard
    width, _ = matplotlib.image.imread(tmp_path / "learning_curve.png").shape[1::-1]
    assert width == 1500  # three panels: return, length, and the evaluation's speed and fall rate


def test_drift_is_net_displacement_not_sway() -> None:
    # Per episode, the horizontal velocities of its zero-command steps, summed: swaying +-0.3 m/s along x over
    # 4 steps goes nowhere; 0.1 m/s along y over 5 steps drifts 0.1 m/s; an episode never told to stand: nan.
    velocities = [np.array([[0.3, 0.0], [-0.3, 0.0], [0.3, 0.0], [-0.3, 0.0]]), np.tile([0.0, 0.1], (5, 1))]
    drift = mean_drift(np.stack([v.sum(axis=0) for v in velocities] + [np.zeros(2)]), np.array([4, 5, 0]))
    np.testing.assert_allclose(drift[:2], [0.0, 0.1], atol=1e-12)
    assert np.isnan(drift[2])


def test_the_best_evaluation_over_several_clips_is_the_one_whose_weakest_clip_is_best() -> None:
    def scored(**clips: float) -> float:
        rates = {f"eval/{clip}/success_rate": rate for clip, rate in clips.items()}
        episodes = {f"eval/{clip}/episodes": 10.0 for clip in clips}
        overall = sum(clips.values()) / len(clips)
        return default_evaluation_score({"eval/return": 5.0, "eval/success_rate": overall, **rates, **episodes})

    # more success in all but one clip does not outweigh that clip's failing
    assert scored(walk=0.76, dance=0.96) > scored(walk=0.99, dance=0.55)
    # nor one episode of it in 200 (an evaluation of 1,000 over five clips), however well the others go
    level = dict.fromkeys(("walk", "wave", "high5", "dance"), 0.3)
    assert scored(**level, jumpjack=0.3) > scored(**dict.fromkeys(level, 1.0), jumpjack=0.3 - 1 / 200)
    # with the weakest clips level, the clips together decide
    assert scored(walk=0.8, dance=1.0) > scored(walk=0.8, dance=0.9)
    assert default_evaluation_score({"eval/return": 5.0, "eval/success_rate": 0.75}) == 0.75
    assert default_evaluation_score({"eval/return": 5.0}) == 5.0
