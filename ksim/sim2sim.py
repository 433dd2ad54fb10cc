"""`python -m ksim.sim2sim policy.onnx`: an exported policy driven by ksim.runtime in a plain C MuJoCo loop.

The loop is what a robot's control program does, with MuJoCo as the robot: every `ctrl_dt` it reads the
readings the policy needs from MuJoCo (encoders from the joint state, the IMU from a framequat and gyro sensor
on the base when the model has them, named sensors, foot contacts; what only a simulator knows, from the
simulator, said at start), optionally with noise and latency, steps the runtime and applies its command at every
physics substep (a PD command is re-evaluated from the fresh joint state, as a motor driver does). No JAX runs in
the loop. Afterwards the episodes are judged by the task's own terminations, rewards and eval measures
(ksim.task.replay) and summarised in `mode=eval`'s line; with `--checkpoint` the checkpoint's `mode=eval` runs
the same number of episodes and both lines are printed.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from ksim.errors import ConfigError
from ksim.policy_spec import (
    BASE_ANGULAR_VELOCITY,
    BASE_HEIGHT,
    BASE_LINEAR_VELOCITY,
    BASE_LINEAR_VELOCITY_WORLD,
    BASE_ORIENTATION,
    COMMAND,
    FOOT_CONTACTS,
    JOINT_POSITIONS,
    JOINT_VELOCITIES,
    MOTION,
    ROBOT,
    SENSOR_PREFIX,
    PolicySpec,
)
from ksim.runtime import PolicyRuntime

if TYPE_CHECKING:
    from ksim.task.replay import RecordedEpisode, Start

SOLVERS = {"newton": mujoco.mjtSolver.mjSOL_NEWTON, "cg": mujoco.mjtSolver.mjSOL_CG, "pgs": mujoco.mjtSolver.mjSOL_PGS}


@dataclass(frozen=True)
class Sim2SimSettings:
    episodes: int = 50
    seed: int = 0
    command: tuple[float, ...] | None = None  # a fixed command instead of the task's sampler
    noise: float = 0.0  # standard deviation of Gaussian noise on every robot reading (not the command)
    latency_steps: int = 0  # the policy reads what the sensors said this many control steps ago
    timestep: float | None = None  # another physics timestep (ctrl_dt must stay a multiple of it)
    solver: str | None = None
    iterations: int | None = None
    video: str = ""


def _sensor_on_base(model: mujoco.MjModel, kind: int, base: int) -> int | None:
    """The address in sensordata of a sensor of `kind` on a site of the base body that is aligned with it."""
    for i in range(model.nsensor):
        if model.sensor_type[i] != kind or model.sensor_objtype[i] != mujoco.mjtObj.mjOBJ_SITE:
            continue
        site = int(model.sensor_objid[i])
        aligned = np.allclose(model.site_quat[site], [1, 0, 0, 0]) and model.sensor_reftype[i] == 0
        if model.site_bodyid[site] == base and aligned:
            return int(model.sensor_adr[i])
    return None


class MujocoReader:
    """The policy's readings from MuJoCo's state, as a robot's sensors would give them."""

    def __init__(self, model: mujoco.MjModel, spec: PolicySpec) -> None:
        self.spec, self.readings = spec, spec.readings()
        ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name) for name in spec.joints]
        self.qpos_index, self.qvel_index = model.jnt_qposadr[ids], model.jnt_dofadr[ids]
        self.base = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, spec.base_body)
        self.quat_adr = _sensor_on_base(model, mujoco.mjtSensor.mjSENS_FRAMEQUAT, self.base)
        self.gyro_adr = _sensor_on_base(model, mujoco.mjtSensor.mjSENS_GYRO, self.base)
        root = model.body_rootid[self.base]
        self.outside_robot = np.append(model.body_rootid[model.geom_bodyid] != root, False)
        self.feet = [np.isin(np.arange(model.ngeom + 1), geoms) for geoms in spec.foot_geoms]
        self.sensors = {}
        for name in self.readings:
            if name.startswith(SENSOR_PREFIX):
                sensor = model.sensor(name.removeprefix(SENSOR_PREFIX))
                self.sensors[name] = (int(sensor.adr[0]), int(sensor.dim[0]))
        unsupplied = [r for r in self.readings if r not in SOURCES and r not in self.sensors]
        if unsupplied:
            raise ConfigError(f"ksim.sim2sim cannot supply the policy's readings {', '.join(unsupplied)}")

    def sources(self) -> str:
        """One line: where the IMU readings come from and which readings only the simulator supplies."""
        imu = []
        if BASE_ORIENTATION in self.readings:
            imu.append("orientation from " + ("a framequat sensor" if self.quat_adr is not None else "the base's pose"))
        if BASE_ANGULAR_VELOCITY in self.readings:
            imu.append("gyro from " + ("a gyro sensor" if self.gyro_adr is not None else "the base's velocity"))
        simulator = [i.reading for i in self.spec.inputs if i.reading and i.source != ROBOT]
        parts = [*imu, *([f"from the simulator: {', '.join(simulator)}"] if simulator else [])]
        return "; ".join(parts) or "every reading from the joint state and named sensors"

    def read(self, model: mujoco.MjModel, data: mujoco.MjData, command: np.ndarray) -> dict[str, np.ndarray]:
        """Every reading the policy needs, from its source in SOURCES or its named sensor."""
        values = {name: source(self, model, data, command) for name, source in SOURCES.items() if name in self.readings}
        for name, (adr, dim) in self.sensors.items():
            values[name] = data.sensordata[adr : adr + dim]
        return {name: np.array(value, np.float32) for name, value in values.items()}

    def base_velocity(self, model: mujoco.MjModel, data: mujoco.MjData, local: bool) -> np.ndarray:
        """The base's (angular, linear) velocity, in its own frame where `local`, else the world's."""
        velocity = np.zeros(6)
        mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_XBODY, self.base, velocity, int(local))
        return velocity

    def orientation(self, data: mujoco.MjData) -> np.ndarray:
        adr = self.quat_adr
        return data.xquat[self.base] if adr is None else data.sensordata[adr : adr + 4]

    def gyro(self, model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
        adr = self.gyro_adr
        return self.base_velocity(model, data, True)[:3] if adr is None else data.sensordata[adr : adr + 3]

    def foot_contacts(self, data: mujoco.MjData) -> np.ndarray:
        """Per foot, 1 when one of its geoms touches (distance <= 0) a geom outside the robot."""
        contact = data.contact
        g1, g2, touching = contact.geom1, contact.geom2, contact.dist <= 0
        outside1, outside2 = self.outside_robot[g1], self.outside_robot[g2]
        return np.array(
            [np.any(touching & ((foot[g1] & outside2) | (foot[g2] & outside1))) for foot in self.feet], np.float32
        )


Source = Callable[[MujocoReader, mujoco.MjModel, mujoco.MjData, np.ndarray], np.ndarray]

# Where plain MuJoCo gives each of ksim.policy_spec's readings ("sensor:<name>" readings are the named sensors).
SOURCES: dict[str, Source] = {
    JOINT_POSITIONS: lambda reader, model, data, command: data.qpos[reader.qpos_index],
    JOINT_VELOCITIES: lambda reader, model, data, command: data.qvel[reader.qvel_index],
    BASE_ORIENTATION: lambda reader, model, data, command: reader.orientation(data),
    BASE_ANGULAR_VELOCITY: lambda reader, model, data, command: reader.gyro(model, data),
    BASE_LINEAR_VELOCITY: lambda reader, model, data, command: reader.base_velocity(model, data, True)[3:],
    BASE_LINEAR_VELOCITY_WORLD: lambda reader, model, data, command: reader.base_velocity(model, data, False)[3:],
    BASE_HEIGHT: lambda reader, model, data, command: data.xpos[reader.base, 2:3],
    FOOT_CONTACTS: lambda reader, model, data, command: reader.foot_contacts(data),
    COMMAND: lambda reader, model, data, command: command,
}


class CommandSampler:
    """The task's velocity command sampler in numpy (ranges from policy.json), or a fixed command."""

    def __init__(self, spec: PolicySpec, fixed: Sequence[float] | None, ctrl_dt: float) -> None:
        size = 0 if spec.command is None else int(spec.command["size"])
        self.spec, self.ctrl_dt, self.size = spec.command or {}, ctrl_dt, size
        if fixed is not None and len(fixed) != size:
            raise ConfigError(f"--command has {len(fixed)} values; the policy's command has {size}")
        self.motion = self.spec.get("kind") == MOTION  # the runtime plays it: nothing to draw
        if fixed is not None and self.motion:
            raise ConfigError("--command: the policy plays a motion; it takes no command")
        if fixed is None and size and self.spec.get("kind") not in ("velocity", MOTION):
            raise ConfigError(f"--command is needed: ksim.sim2sim cannot draw a {self.spec.get('kind')} command")
        self.fixed = None if fixed is None else np.asarray(fixed, np.float32)

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """(a command, control steps until the next draw)."""
        if self.fixed is not None or not self.size or self.motion:
            return (self.fixed if self.fixed is not None else np.zeros(0, np.float32)), -1
        ranges = np.asarray([self.spec["forward"], self.spec["lateral"], self.spec["yaw_rate"]], np.float64)
        value = rng.uniform(ranges[:, 0], ranges[:, 1])
        if rng.random() < float(self.spec["zero_probability"]):
            value = np.zeros(3)
        low, high = self.spec["resample_s"]
        return value.astype(np.float32), max(1, round(rng.uniform(low, high) / self.ctrl_dt))


def prepare_model(model: mujoco.MjModel, settings: Sim2SimSettings, ctrl_dt: float) -> int:
    """Applies the physics settings to `model`; returns the substeps per control step."""
    if settings.timestep is not None:
        model.opt.timestep = settings.timestep
    if settings.solver is not None:
        if settings.solver.lower() not in SOLVERS:
            raise ConfigError(f"--solver={settings.solver!r} must be one of {', '.join(SOLVERS)}")
        model.opt.solver = SOLVERS[settings.solver.lower()]
    if settings.iterations is not None:
        model.opt.iterations = settings.iterations
    substeps = round(ctrl_dt / model.opt.timestep)
    if substeps < 1 or not np.isclose(substeps * model.opt.timestep, ctrl_dt, rtol=0, atol=1e-6):
        raise ConfigError(f"--timestep={model.opt.timestep} must divide the policy's ctrl_dt={ctrl_dt}")
    return substeps


class Sim2Sim:
    """The loop: one runtime, one MuJoCo model and data, episodes run one after another."""

    def __init__(self, policy_path: str | Path, settings: Sim2SimSettings) -> None:
        self.runtime = PolicyRuntime.load(policy_path)
        self.spec, self.settings = self.runtime.spec, settings
        if not self.spec.model_file:
            raise ConfigError(f"{policy_path}: its policy.json names no model; export it again with mode=export")
        self.model = mujoco.MjModel.from_binary_path(str(Path(policy_path).with_name(self.spec.model_file)))
        self.substeps = prepare_model(self.model, settings, self.spec.ctrl_dt)
        self.data = mujoco.MjData(self.model)
        self.reader = MujocoReader(self.model, self.spec)
        self.sampler = CommandSampler(self.spec, settings.command, self.spec.ctrl_dt)
        actuation = self.runtime.actuation
        ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name) for name in actuation.joints]
        pd = actuation.kind == "pd"
        self.actuated_qpos = self.model.jnt_qposadr[ids] if pd else None
        self.actuated_qvel = self.model.jnt_dofadr[ids] if pd else None
        self.rng = np.random.default_rng(settings.seed)

    def run_episode(self, start: Start | None = None) -> RecordedEpisode:
        """One episode from `start` (qpos, qvel, first command, its state; default: the export's start pose and a
        drawn command), `episode_steps` control steps long or to its motion's last frame (judging ends it at its
        first termination). A motion plays from the start's frame (default: its first clip's first)."""
        from ksim.task.replay import RecordedEpisode  # the task's judge's record; no JAX runs in the loop

        model, data, spec, settings = self.model, self.data, self.spec, self.settings
        mujoco.mj_resetData(model, data)
        command, until_draw = self.sampler.draw(self.rng)
        data.qpos[:] = spec.start_qpos
        if start is not None:
            data.qpos[:], data.qvel[:] = start[0], start[1]
            command = command if self.sampler.fixed is not None else np.asarray(start[2], np.float32)
        mujoco.mj_forward(model, data)
        steps, frames = spec.episode_steps, None
        motion = self.runtime.motion
        if motion is None:
            self.runtime.reset()
        else:  # the simulator's world is the clip's: no heading to align
            first = int(start[3]) if start is not None else motion.start_frame(None, None)
            self.runtime.reset(frame=first, heading=0.0)
            steps = min(steps, int(motion.last[first]) - first)
            frames = np.arange(first, first + steps)
        # The policy reads what the sensors said `latency_steps` control steps ago (the oldest kept; at an
        # episode's start, its first readings).
        delayed: deque[dict[str, np.ndarray]] = deque(maxlen=settings.latency_steps + 1)
        qpos, qvel, actions, ctrls, commands = [data.qpos.copy()], [data.qvel.copy()], [], [], []
        for _ in range(steps):
            delayed.append(self._noisy(self.reader.read(model, data, command)))
            out = self.runtime.step({**delayed[0], COMMAND: command})  # the command is not delayed
            for substep in range(self.substeps):
                if self.actuated_qpos is not None and self.actuated_qvel is not None:  # a PD law: fresh state
                    data.ctrl[:] = out.ctrl(data.qpos[self.actuated_qpos], data.qvel[self.actuated_qvel])
                elif substep == 0:
                    data.ctrl[:] = out.ctrl()
                mujoco.mj_step(model, data)
            mujoco.mj_forward(model, data)  # sensors and contacts of the state the step ends in
            qpos.append(data.qpos.copy())
            qvel.append(data.qvel.copy())
            actions.append(out.action)
            ctrls.append(data.ctrl.copy())
            commands.append(command)
            until_draw -= 1
            if until_draw == 0:
                command, until_draw = self.sampler.draw(self.rng)
        qpos_a, qvel_a, action_a, ctrl_a, command_a = (
            np.asarray(x, np.float32) for x in (qpos, qvel, actions, ctrls, commands)
        )
        return RecordedEpisode(qpos_a, qvel_a, action_a, ctrl_a, command_a, motion_frame=frames)

    def _noisy(self, readings: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.settings.noise <= 0:
            return readings
        noise = self.settings.noise
        return {
            name: value if name == COMMAND else value + self.rng.normal(0.0, noise, value.shape).astype(np.float32)
            for name, value in readings.items()
        }


def build_task(spec: PolicySpec, policy_folder: str | Path, task: str = "", **overrides: Any) -> Any:
    """The task that trained the policy, rebuilt from policy.json (its class, config class and config); `task`
    ("module:Class" or "FILE.py:Class", from the working directory) names the class instead, and its config
    class too where policy.json has both in one module or file."""
    from omegaconf import OmegaConf

    from ksim.task.reference import load_attribute, relocated, same_location

    recorded = Path(policy_folder)  # where policy.json's relative files start
    task_at, config_at = (spec.task_class, recorded), (spec.config_class, recorded)
    if task:
        moves_config = same_location(spec.config_class, spec.task_class)
        task_at, config_at = (
            (task, Path(".")),
            (relocated(spec.config_class, task), Path(".")) if moves_config else config_at,
        )
    if not task_at[0]:
        raise ConfigError("policy.json does not name its task class: export it again, or pass --task FILE.py:Class")
    hint = "--task FILE.py:Class (or module:Class) to judge the episodes"
    task_type, config_type = (load_attribute(name, base, hint) for name, base in (task_at, config_at))
    merged = OmegaConf.merge(OmegaConf.structured(config_type), OmegaConf.create(spec.task_config), overrides)
    return task_type(OmegaConf.to_object(merged))


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Sim2SimSettings]:
    parser = argparse.ArgumentParser(prog="python -m ksim.sim2sim", description=__doc__.splitlines()[0])
    parser.add_argument("policy", help="policy.onnx written by mode=export (policy.json and policy.mjb beside it)")
    parser.add_argument("--episodes", type=int, default=50, help="episodes to run (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--command", type=float, nargs="+", help="a fixed command (e.g. 0.5 0 0) instead of the task's")
    parser.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on every sensor reading")
    parser.add_argument("--latency-steps", type=int, default=0, help="control steps between a reading and its use")
    parser.add_argument("--timestep", type=float, help="another physics timestep (must divide ctrl_dt)")
    parser.add_argument("--solver", help="another constraint solver: newton, cg or pgs")
    parser.add_argument("--iterations", type=int, help="another solver iteration count")
    parser.add_argument("--video", default="", help="write the first episode to this .mp4 or .gif")
    parser.add_argument("--checkpoint", default="", help="also run mode=eval on this checkpoint, side by side")
    parser.add_argument(
        "--task",
        default="",
        help="the task that judges the episodes, as module:Class or FILE.py:Class (default: the one policy.json names)",
    )
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.latency_steps < 0 or args.noise < 0:
        raise ConfigError("--episodes must be >= 1, --latency-steps and --noise >= 0")
    if args.video and Path(args.video).suffix not in (".mp4", ".gif"):
        raise ConfigError(f"--video={args.video!r} must end in .mp4 or .gif")
    settings = Sim2SimSettings(
        args.episodes,
        args.seed,
        None if args.command is None else tuple(args.command),
        args.noise,
        args.latency_steps,
        args.timestep,
        args.solver,
        args.iterations,
        args.video,
    )
    return args, settings


def main(argv: Sequence[str] | None = None) -> list[str]:
    """Runs the episodes, judges them with the task, prints (and returns) the summary lines."""
    try:
        args, settings = parse_args(argv)
        sim = Sim2Sim(args.policy, settings)
        task = build_task(
            sim.spec,
            Path(args.policy).parent,
            args.task,
            mode="eval",
            eval_episodes=settings.episodes,
            load_from_ckpt_path=args.checkpoint,
        )
        starts = draw_starts(task.environment, settings.seed, settings.episodes)
        print(f"sim2sim: {sim.reader.sources()}; starts and first commands drawn by the task", flush=True)
        episodes = [sim.run_episode(start) for start in starts]
        if settings.video:
            from ksim.render import write_video

            first = episodes[0]
            reference = reference_poses(task, first)
            path = write_video(sim.model, first.qpos, sim.spec.ctrl_dt, settings.video, reference=reference)
            print(f"wrote {path}", flush=True)
        lines = judged_lines(task, episodes, args.checkpoint)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    for line in lines:
        print(line, flush=True)
    return lines


def reference_poses(task: Any, episode: RecordedEpisode) -> np.ndarray | None:
    """The pose the task's command asked for at each recorded state (a motion's frames); None where it asks none."""
    command = task.environment.components.command
    if command is None or episode.motion_frame is None:
        return None
    frames = np.append(episode.motion_frame, episode.motion_frame[-1] + 1)  # one per recorded state, the start first
    return np.stack([np.asarray(command.reference_qpos(int(frame))) for frame in frames])


def draw_starts(environment: Any, seed: int, count: int) -> list[Start]:
    from ksim.task.replay import draw_starts as task_starts

    return task_starts(environment, seed, count)


def judged_lines(task: Any, episodes: list[RecordedEpisode], checkpoint: str) -> list[str]:
    """The sim-to-sim summary in mode=eval's words; with a checkpoint, mode=eval's own line for as many episodes."""
    from ksim.task.evaluation import eval_line
    from ksim.task.replay import judge_episodes

    lines = [f"sim2sim   {eval_line(task.task_name, judge_episodes(task.environment, episodes))}"]
    if checkpoint:
        result = task.evaluate(task.checkpoints.load(checkpoint)["shared"])
        lines.append(f"mode=eval {eval_line(task.task_name, result)}")
    return lines


if __name__ == "__main__":
    main()
