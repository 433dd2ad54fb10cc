"""Reference motions: a clip of a robot's root pose and joint angles, placed on the task's model.

    python -m ksim.motion CLIP --model MODEL.xml                  # frames, duration, ranges it exceeds, feet height
    python -m ksim.motion CLIP --model MODEL.xml --fps 50 --out CLIP.npz   # resampled, with its body poses

Three layouts are read:
- CSV without a header (ProtoMotions' G1 clips), one row per frame: root position x, y, z (m, world frame, z up), root
  quaternion w, x, y, z, then the joint angles in the model's joint order, at `--input-fps` (default 30);
- Unitree's CSV (unitree_rl_lab, mjlab's converter): the same with the quaternion x, y, z, w (`--quaternion xyzw`);
- mjlab's `.npz`: `fps`, `joint_pos`, `joint_vel`, `body_pos_w`, `body_quat_w` (w, x, y, z), `body_lin_vel_w`,
  `body_ang_vel_w`, the bodies in the model's order from the root (its root pose is body 0).

A clip is checked before anything uses it (one line naming the file and the rule: a joint count or joint names that
differ from the model's, a value that is not finite, a root quaternion that is not of unit length), resampled to the
task's control rate (joint angles and the root position linearly, the root orientation along the shortest arc), and
placed on the model frame by frame with MuJoCo's forward kinematics: each body's world pose, and its linear and
angular velocity by central differences. Numpy and MuJoCo only: a robot replays the same clip without JAX.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from ksim.errors import ConfigError

QUATERNION_ORDERS = ("wxyz", "xyzw")
DEFAULT_INPUT_FPS = 30.0
ONE_ANGLE_JOINTS = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
UNIT_TOLERANCE = 1e-3  # |q| may differ from 1 by this much (a CSV's printed digits), then it is normalized


class Frames:
    """Frames at `fps` of joint angles (T, J): what a clip and a placed motion have in common."""

    fps: float
    joint_pos: np.ndarray

    @property
    def num_frames(self) -> int:
        return int(self.joint_pos.shape[0])

    @property
    def duration(self) -> float:
        """Seconds from the first frame to the last."""
        return (self.num_frames - 1) / self.fps


@dataclass(frozen=True)
class Clip(Frames):
    """A motion as recorded: T frames at `fps` of the root position (T, 3), the root orientation (T, 4; w, x, y, z)
    and the joint angles (T, J) in the model's joint order."""

    fps: float
    root_pos: np.ndarray
    root_quat: np.ndarray
    joint_pos: np.ndarray
    joint_names: tuple[str, ...] = ()  # as the file names them (empty: the file names none)


@dataclass(frozen=True)
class Motion(Frames):
    """A clip placed on a model at `fps`: the joints' angles and velocities (T, J) and every body's world pose and
    velocity (T, B, ...; the model's bodies without the world, in its order)."""

    fps: float
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    body_names: tuple[str, ...]
    body_pos: np.ndarray  # (T, B, 3)
    body_quat: np.ndarray  # (T, B, 4): w, x, y, z
    body_lin_vel: np.ndarray  # (T, B, 3), world frame
    body_ang_vel: np.ndarray  # (T, B, 3), world frame

    def qpos(self, frame: int) -> np.ndarray:
        """The model's qpos at `frame`: the root's pose (body 0), then the joints."""
        return np.concatenate([self.body_pos[frame, 0], self.body_quat[frame, 0], self.joint_pos[frame]])

    def save(self, path: str | Path) -> Path:
        """Writes mjlab's `.npz` layout (plus `body_names`), which `read_clip` reads back."""
        path = Path(path)
        np.savez(
            path,
            fps=np.asarray(self.fps),
            joint_pos=self.joint_pos,
            joint_vel=self.joint_vel,
            body_names=np.asarray(self.body_names),
            body_pos_w=self.body_pos,
            body_quat_w=self.body_quat,
            body_lin_vel_w=self.body_lin_vel,
            body_ang_vel_w=self.body_ang_vel,
        )
        return path


# ----- reading ---------------------------------------------------------------------------------------------------


def read_clip(path: str | Path, quaternion: str = "wxyz", fps: float = DEFAULT_INPUT_FPS) -> Clip:
    """The clip in `path`: a `.csv` (its root quaternion in `quaternion` order, frames at `fps`) or an `.npz`
    (mjlab's layout; its own fps). ConfigError (one line) if it cannot be read as one."""
    path = Path(path)
    if quaternion not in QUATERNION_ORDERS:
        raise ConfigError(f"quaternion={quaternion!r} must be one of {', '.join(map(repr, QUATERNION_ORDERS))}")
    if not path.is_file():
        raise ConfigError(f"motion {path}: no such file")
    if path.suffix == ".npz":
        return _read_npz(path)
    if path.suffix != ".csv":
        raise ConfigError(f"motion {path}: a clip is a .csv or an .npz file")
    if fps <= 0:
        raise ConfigError(f"motion {path}: its fps={fps} must be positive")
    try:
        rows = np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
    except ValueError as error:
        raise ConfigError(f"motion {path}: not a CSV of numbers ({str(error).splitlines()[0]})") from None
    if rows.shape[1] < 8:
        raise ConfigError(f"motion {path}: {rows.shape[1]} columns per frame, a clip has 7 for the root and the joints")
    root_quat = rows[:, 3:7] if quaternion == "wxyz" else rows[:, [6, 3, 4, 5]]
    return Clip(fps, rows[:, :3], root_quat, rows[:, 7:])


def _read_npz(path: Path) -> Clip:
    with np.load(path) as data:
        missing = [key for key in ("fps", "joint_pos", "body_pos_w", "body_quat_w") if key not in data]
        if missing:
            raise ConfigError(f"motion {path}: an .npz clip needs {', '.join(missing)} (mjlab's layout)")
        names = tuple(str(n) for n in data["joint_names"]) if "joint_names" in data else ()
        return Clip(
            float(np.asarray(data["fps"]).reshape(-1)[0]),
            np.asarray(data["body_pos_w"][:, 0], np.float64),
            np.asarray(data["body_quat_w"][:, 0], np.float64),
            np.asarray(data["joint_pos"], np.float64),
            names,
        )


def robot_joints(mj_model: mujoco.MjModel) -> tuple[str, ...]:
    """The model's joints after its free root joint, in qpos order (those a clip gives angles for)."""
    if mj_model.njnt == 0 or int(mj_model.jnt_type[0]) != int(mujoco.mjtJoint.mjJNT_FREE):
        raise ConfigError("a motion is placed on a model whose first joint is a free joint (a floating base)")
    names = []
    for joint in range(1, mj_model.njnt):
        if int(mj_model.jnt_type[joint]) not in ONE_ANGLE_JOINTS:
            raise ConfigError(f"a motion gives one angle per joint; joint {mj_model.joint(joint).name} has more")
        names.append(mj_model.joint(joint).name)
    return tuple(names)


def check_clip(clip: Clip, mj_model: mujoco.MjModel, source: str) -> Clip:
    """The clip with its root quaternions normalized; ConfigError naming `source` and the rule it breaks."""
    joints = robot_joints(mj_model)
    if clip.num_frames < 2:
        raise ConfigError(f"motion {source}: {clip.num_frames} frame(s); a clip has at least 2")
    if clip.joint_pos.shape[1] != len(joints):
        raise ConfigError(
            f"motion {source}: {clip.joint_pos.shape[1]} joint angles per frame, the model has {len(joints)} joints"
        )
    if clip.joint_names and clip.joint_names != joints:
        wrong = next(i for i, (a, b) in enumerate(zip(clip.joint_names, joints, strict=True)) if a != b)
        raise ConfigError(
            f"motion {source}: joint {wrong} is {clip.joint_names[wrong]!r}, the model's is {joints[wrong]!r}"
        )
    for name, values in (("root position", clip.root_pos), ("root quaternion", clip.root_quat)):
        _require_finite(source, name, values)
    _require_finite(source, "joint angle", clip.joint_pos)
    norms = np.linalg.norm(clip.root_quat, axis=1)
    off = np.flatnonzero(np.abs(norms - 1.0) > UNIT_TOLERANCE)
    if off.size:
        raise ConfigError(
            f"motion {source}: the root quaternion of frame {off[0]} has length {norms[off[0]]:.4f}, not 1 "
            "(a CSV in Unitree's x, y, z, w order needs quaternion=xyzw)"
        )
    return Clip(clip.fps, clip.root_pos, clip.root_quat / norms[:, None], clip.joint_pos, clip.joint_names)


def _require_finite(source: str, name: str, values: np.ndarray) -> None:
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        raise ConfigError(f"motion {source}: a {name} of frame {bad[0][0]} is {values[tuple(bad[0])]}, not finite")


# ----- resampling and placing ------------------------------------------------------------------------------------


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Hamilton products a * b of (..., 4) quaternions (w, x, y, z)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conjugate(q: np.ndarray) -> np.ndarray:
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def slerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Unit quaternions from a (t = 0) to b (t = 1) along the shortest arc; (N, 4), (N, 4), (N,)."""
    dot = np.sum(a * b, axis=-1)
    b = np.where(dot[:, None] < 0, -b, b)  # q and -q are one rotation: take the nearer
    dot = np.abs(dot)
    angle = np.arccos(np.clip(dot, -1.0, 1.0))
    sin = np.sin(angle)
    near = sin < 1e-8  # (almost) the same rotation: linear, then normalized
    safe = np.where(near, 1.0, sin)
    wa = np.where(near, 1.0 - t, np.sin((1.0 - t) * angle) / safe)
    wb = np.where(near, t, np.sin(t * angle) / safe)
    q = wa[:, None] * a + wb[:, None] * b
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def resample(clip: Clip, fps: float) -> Clip:
    """The clip at `fps`: frames at k / fps over its duration (the last one at or before its end)."""
    if fps <= 0:
        raise ConfigError(f"fps={fps} must be positive")
    times = np.arange(int(np.floor(clip.duration * fps + 1e-9)) + 1) / fps
    position = times * clip.fps  # in source frames
    lo = np.minimum(np.floor(position).astype(int), clip.num_frames - 2)
    t = position - lo
    hi = lo + 1

    def lerp(values: np.ndarray) -> np.ndarray:
        return values[lo] + (values[hi] - values[lo]) * t[:, None]

    root_quat = slerp(clip.root_quat[lo], clip.root_quat[hi], t)
    return Clip(fps, lerp(clip.root_pos), root_quat, lerp(clip.joint_pos), clip.joint_names)


def central_difference(values: np.ndarray, dt: float) -> np.ndarray:
    """d values / dt along axis 0: central inside, one-sided at the two ends."""
    return np.gradient(values, dt, axis=0)


def angular_velocity(quat: np.ndarray, dt: float) -> np.ndarray:
    """World-frame angular velocities (T, ..., 3) of unit quaternions (T, ..., 4), by central differences."""
    before = np.concatenate([quat[:1], quat[:-2], quat[-2:-1]])
    after = np.concatenate([quat[1:2], quat[2:], quat[-1:]])
    span = np.full(quat.shape[0], 2.0 * dt)
    span[0] = span[-1] = dt
    turn = quat_multiply(after, quat_conjugate(before))  # the world-frame rotation from `before` to `after`
    turn = np.where(turn[..., :1] < 0, -turn, turn)
    vector = turn[..., 1:]
    sin_half = np.linalg.norm(vector, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(sin_half, turn[..., :1])
    axis = vector / np.where(sin_half < 1e-12, 1.0, sin_half)
    return axis * angle / span.reshape((-1,) + (1,) * (quat.ndim - 1))


def place(clip: Clip, mj_model: mujoco.MjModel) -> Motion:
    """Every body's world pose at each frame (MuJoCo's forward kinematics) and the velocities between frames."""
    data = mujoco.MjData(mj_model)
    frames, bodies = clip.num_frames, mj_model.nbody - 1
    body_pos = np.empty((frames, bodies, 3))
    body_quat = np.empty((frames, bodies, 4))
    for frame in range(frames):
        data.qpos[:] = np.concatenate([clip.root_pos[frame], clip.root_quat[frame], clip.joint_pos[frame]])
        mujoco.mj_kinematics(mj_model, data)
        body_pos[frame] = data.xpos[1:]
        body_quat[frame] = data.xquat[1:]
    dt = 1.0 / clip.fps
    return Motion(
        fps=clip.fps,
        joint_pos=clip.joint_pos,
        joint_vel=central_difference(clip.joint_pos, dt),
        body_names=tuple(mj_model.body(b).name for b in range(1, mj_model.nbody)),
        body_pos=body_pos,
        body_quat=body_quat,
        body_lin_vel=central_difference(body_pos, dt),
        body_ang_vel=angular_velocity(body_quat, dt),
    )


def load_motion(
    path: str | Path,
    mj_model: mujoco.MjModel,
    fps: float | None,
    quaternion: str = "wxyz",
    input_fps: float = DEFAULT_INPUT_FPS,
) -> Motion:
    """The clip in `path`, checked against the model, resampled to `fps` (None: its own rate) and placed on the
    model."""
    clip = check_clip(read_clip(path, quaternion, input_fps), mj_model, str(path))
    return place(clip if fps is None else resample(clip, fps), mj_model)


# ----- inspecting ------------------------------------------------------------------------------------------------


def range_excess(motion: Motion, mj_model: mujoco.MjModel) -> list[tuple[str, float]]:
    """(joint, radians past its range) for each limited joint the motion leaves, largest first."""
    joints = robot_joints(mj_model)
    found = []
    for index, name in enumerate(joints):
        joint = mj_model.joint(name)
        if not mj_model.jnt_limited[joint.id]:
            continue
        low, high = mj_model.jnt_range[joint.id]
        values = motion.joint_pos[:, index]
        excess = max(float(low - values.min()), float(values.max() - high), 0.0)
        if excess > 0:
            found.append((name, excess))
    return sorted(found, key=lambda item: -item[1])


def lowest_site_height(motion: Motion, mj_model: mujoco.MjModel, sites: Sequence[str]) -> float:
    """The lowest world height any of `sites` reaches over the motion."""
    data = mujoco.MjData(mj_model)
    ids = [mj_model.site(name).id for name in sites]
    lowest = np.inf
    for frame in range(motion.num_frames):
        data.qpos[:] = motion.qpos(frame)
        mujoco.mj_kinematics(mj_model, data)
        lowest = min(lowest, float(data.site_xpos[ids, 2].min()))
    return lowest


def describe(motion: Motion, mj_model: mujoco.MjModel, feet: Sequence[str]) -> list[str]:
    """What `python -m ksim.motion` prints about a placed motion."""
    lines = [f"{motion.num_frames} frames at {motion.fps:g} fps: {motion.duration:.2f} s"]
    excess = range_excess(motion, mj_model)
    if excess:
        lines.append("past their ranges: " + ", ".join(f"{name} by {amount:.3f} rad" for name, amount in excess))
    else:
        lines.append("every joint stays within its range")
    if feet:
        lines.append(f"lowest height of {', '.join(feet)}: {lowest_site_height(motion, mj_model, feet):.3f} m")
    return lines


def foot_sites(mj_model: mujoco.MjModel) -> tuple[str, ...]:
    """The model's sites with 'foot' in their name (what --feet defaults to)."""
    return tuple(mj_model.site(i).name for i in range(mj_model.nsite) if "foot" in mj_model.site(i).name)


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m ksim.motion", description=__doc__.split("\n\n")[0])
    parser.add_argument("clip", help="a .csv or .npz clip")
    parser.add_argument("--model", required=True, help="the MJCF model the clip is for")
    parser.add_argument("--fps", type=float, help="resample to this rate (default: the clip's own)")
    parser.add_argument("--input-fps", type=float, default=DEFAULT_INPUT_FPS, help="a CSV clip's frame rate")
    parser.add_argument("--quaternion", default="wxyz", help="a CSV's root quaternion order: wxyz or xyzw")
    parser.add_argument("--feet", nargs="*", help="sites whose lowest height is printed (default: *foot* sites)")
    parser.add_argument("--out", help="write the placed motion to this .npz (mjlab's layout)")
    args = parser.parse_args(argv)
    try:
        mj_model = mujoco.MjModel.from_xml_path(args.model)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: --model {args.model}: {str(error).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        motion = load_motion(args.clip, mj_model, args.fps, args.quaternion, args.input_fps)
        feet = foot_sites(mj_model) if args.feet is None else tuple(args.feet)
        unknown = [name for name in feet if mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_SITE, name) < 0]
        if unknown:
            raise ConfigError(f"--feet: the model has no site {', '.join(unknown)}")
        lines = describe(motion, mj_model, feet)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.out:
        lines.append(f"wrote {motion.save(args.out)}")
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
