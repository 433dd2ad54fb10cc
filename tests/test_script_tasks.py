"""A task in the user's own file, outside the repository, run as `python my_robot.py` and as `python -m
my_package.my_robot`: it trains, exports, and goes through `ksim.sim2sim` (with and without `--checkpoint`);
a moved file is named in one line with the option that points at it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ksim.config import ConfigError
from ksim.task.reference import class_reference, load_attribute

TASK_FILE = textwrap.dedent(
    '''
    """A cart-pole written by a user, in a folder of their own."""

    from dataclasses import dataclass

    from ksim import observations as obs
    from ksim import rewards as rew
    from ksim import terminations as term
    from ksim.actuators import TorqueActuators
    from ksim.engine import load_mujoco_model
    from ksim.resets import RandomJointPositions
    from ksim.task.ppo import PPOConfig, PPOTask


    @dataclass
    class MyRobotConfig(PPOConfig):
        pass


    class MyRobotTask(PPOTask[MyRobotConfig]):
        def get_mujoco_model(self):
            return load_mujoco_model("cartpole.xml")

        def get_observations(self):
            return [obs.JointPosition(joints=("hinge",)), obs.JointVelocity(joints=("slider", "hinge"))]

        def get_rewards(self):
            return [rew.StayAlive(scale=1.0)]

        def get_terminations(self):
            return [term.JointOutOfRange(joint="hinge", limit=0.3)]

        def get_resets(self):
            return [RandomJointPositions(scale=0.05, joints=("slider", "hinge"))]

        def get_actuators(self):
            return TorqueActuators.from_model(self.engine.mj_model)


    DEFAULT_CONFIG = MyRobotConfig(
        num_envs=8, batch_size=4, rollout_length_frames=8, num_passes=2, num_steps=2, actor_hidden=[16, 16],
        critic_hidden=[16, 16], ctrl_dt=0.02, dt=0.01, episode_length_s=2.0, eval_every_n_steps=0,
        save_every_n_steps=0, eval_episodes=4,
    )

    if __name__ == "__main__":
        MyRobotTask.launch(DEFAULT_CONFIG)
    '''
)


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ""}  # nothing of the repository: ksim comes from the installed package
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def ok(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


def train_and_export(launch: list[str], cwd: Path) -> tuple[Path, Path]:
    """Trains two steps with `launch` (a script or a -m module) and exports the checkpoint; (policy, checkpoint)."""
    ok(run([*launch, "run_dir=run"], cwd))
    checkpoint = cwd / "run" / "checkpoints" / "ckpt_latest.bin"
    policy = cwd / "export" / "policy.onnx"
    lines = ok(run([*launch, "mode=export", f"load_from_ckpt_path={checkpoint}", f"export_path={policy}"], cwd))
    assert lines[-1].startswith("wrote ") and policy.exists()
    return policy, checkpoint


def sim2sim(policy: Path, cwd: Path, *options: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "ksim.sim2sim", str(policy), "--episodes", "4", *options], cwd)


def assert_judged(lines: list[str], with_eval: bool) -> None:
    summaries = [line for line in lines if line.startswith(("sim2sim   ", "mode=eval "))]
    expected = ["sim2sim   MyRobotTask: 4 episodes"] + (["mode=eval MyRobotTask: 4 episodes"] if with_eval else [])
    assert [line.split(", mean return")[0] for line in summaries] == expected


@pytest.fixture(scope="module")
def script_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("user_folder")
    (folder / "my_robot.py").write_text(TASK_FILE)
    policy, checkpoint = train_and_export([sys.executable, str(folder / "my_robot.py")], folder)
    return folder, policy, checkpoint


def test_a_script_task_records_its_file_relative_to_the_export(script_export: tuple) -> None:
    _, policy, _ = script_export
    spec = policy.with_suffix(".json").read_text()
    assert '"task_class": "../my_robot.py:MyRobotTask"' in spec
    assert '"config_class": "../my_robot.py:MyRobotConfig"' in spec


def test_sim2sim_judges_a_script_tasks_export_from_another_folder(script_export: tuple, tmp_path: Path) -> None:
    _, policy, checkpoint = script_export
    assert_judged(ok(sim2sim(policy, tmp_path)), with_eval=False)
    assert_judged(ok(sim2sim(policy, tmp_path, "--checkpoint", str(checkpoint))), with_eval=True)


def test_a_moved_script_is_named_with_the_option_that_points_at_it(script_export: tuple, tmp_path: Path) -> None:
    folder, policy, checkpoint = script_export
    moved = tmp_path / "elsewhere.py"
    (folder / "my_robot.py").rename(moved)
    try:
        result = sim2sim(policy, tmp_path)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == (
            f"error: the task's file {folder / 'my_robot.py'} does not exist; point at it with --task FILE.py:Class "
            "(or module:Class) to judge the episodes"
        )
        pointed = sim2sim(policy, tmp_path, "--task", "elsewhere.py:MyRobotTask", "--checkpoint", str(checkpoint))
        assert_judged(ok(pointed), with_eval=True)
    finally:
        moved.rename(folder / "my_robot.py")


def test_a_package_module_task_goes_through_export_and_sim2sim(tmp_path: Path) -> None:
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "my_robot.py").write_text(TASK_FILE)
    policy, checkpoint = train_and_export([sys.executable, "-m", "my_package.my_robot"], tmp_path)
    assert '"task_class": "my_package.my_robot:MyRobotTask"' in policy.with_suffix(".json").read_text()
    assert_judged(ok(sim2sim(policy, tmp_path, "--checkpoint", str(checkpoint))), with_eval=True)
    elsewhere = sim2sim(policy, policy.parent)  # my_package is not importable from there
    assert elsewhere.returncode == 2
    assert "run from the folder that holds 'my_package'; point at it with --task" in elsewhere.stderr


def test_class_reference_names_a_module_class_by_its_module() -> None:
    assert class_reference(ConfigError) == "ksim.errors:ConfigError"
    assert load_attribute("ksim.errors:ConfigError") is ConfigError


def test_a_file_reference_loads_once_and_names_its_file(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("FACTOR = 3\n")
    (tmp_path / "tasks.py").write_text("from helper import FACTOR\n\nclass Thing:\n    factor = FACTOR\n")
    thing = load_attribute("tasks.py:Thing", base=tmp_path)
    assert thing.factor == 3 and load_attribute(f"{tmp_path / 'tasks.py'}:Thing") is thing
    assert class_reference(thing) == f"{(tmp_path / 'tasks.py').as_posix()}:Thing"
    assert class_reference(thing, tmp_path / "export") == "../tasks.py:Thing"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("examples.kbot", "'examples.kbot' must be module:Class or FILE.py:Class"),
        ("ksim.errors:Nope", "defines no 'Nope'"),
        ("no_such_module_here:Task", "cannot import module 'no_such_module_here'"),
        ("missing.py:Task", "the task's file .*missing.py does not exist"),
    ],
)
def test_references_that_cannot_load_are_one_line(reference: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_attribute(reference, hint="--task FILE.py:Class")
