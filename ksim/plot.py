"""Learning curves: `python -m ksim.plot RUN_DIR` writes RUN_DIR/learning_curve.png from the run's own scalars.

Training writes the same picture when it ends. The curves are read from `scalars.jsonl` (one JSON object
per log line): the mean return and length of the episodes that ended in each logging window, and the
deterministic evaluation return where the run evaluated (`eval_every_n_steps`), against env steps. Runs
whose evaluations measured locomotion get a third panel: the evaluation's fall rate beside its command and
yaw-rate errors where the task has a velocity command, a motion-tracking run's success rate beside its body
position errors (cm), else its base speed; a run over several clips one more: each clip's success rate; runs on a
terrain with a curriculum one more: the training envs' mean terrain level.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ksim.reporting import SCALARS_FILE, clip_success_rates

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PICTURE = "learning_curve.png"


def read_scalars(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / SCALARS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a ksim run folder?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(env steps, values) of the rows that have `key`."""
    points = [(row["env_steps"], row[key]) for row in rows if key in row]
    return [x for x, _ in points], [y for _, y in points]


def draw_panel(axis: Any, rows: list[dict[str, float]], quantity: str, ylabel: str, training_label: str) -> None:
    """Training episodes' `episode_<quantity>` against env steps, and `eval/<quantity>` where there is one."""
    axis.plot(*series(rows, f"episode_{quantity}"), label=training_label)
    steps, values = series(rows, f"eval/{quantity}")
    if steps:
        axis.plot(steps, values, "o-", label="evaluation (deterministic)")
    axis.set(xlabel="env steps", ylabel=ylabel, title=f"Episode {quantity}")
    axis.legend(loc="lower right", fontsize=8)
    axis.grid(alpha=0.3)
    axis.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))


def draw_locomotion_panel(axis: Any, rows: list[dict[str, float]]) -> None:
    """The evaluation's fall rate (right axis, 0 to 1) and, left: for a run with a velocity command, its command
    and yaw-rate errors (what tracking is judged by); else its mean base world-x speed (m/s)."""
    if any("eval/command_error" in row for row in rows):
        axis.plot(*series(rows, "eval/command_error"), "o-", color="tab:green", label="command error (m/s)")
        steps, yaw_errors = series(rows, "eval/yaw_rate_error")
        if steps:
            axis.plot(steps, yaw_errors, "^-", color="tab:purple", label="yaw-rate error (rad/s)")
        axis.set(xlabel="env steps", ylabel="m/s, rad/s", title="Evaluation: tracking and falls")
    else:
        axis.plot(*series(rows, "eval/base_speed_x"), "o-", color="tab:green", label="base speed x (m/s)")
        axis.set(xlabel="env steps", ylabel="m/s", title="Evaluation: speed and falls")
    add_rate_axis(axis, rows, "eval/fall_rate", "fall rate")


def add_rate_axis(axis: Any, rows: list[dict[str, float]], key: str, label: str) -> None:
    """Grid and sci-notation env steps on an evaluation panel, a rate (0 to 1) on its right axis, one legend."""
    axis.grid(alpha=0.3)
    axis.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    rate_axis = axis.twinx()
    rate_axis.plot(*series(rows, key), "s--", color="tab:red", label=label)
    rate_axis.set(ylabel=label, ylim=(-0.05, 1.05))
    lines = axis.get_lines() + rate_axis.get_lines()
    axis.legend(lines, [line.get_label() for line in lines], loc="center right", fontsize=8)


def draw_motion_panel(axis: Any, rows: list[dict[str, float]]) -> None:
    """A motion-tracking run's evaluation: the share of episodes that reach the clip's end (right axis, 0 to 1) and,
    left, the mean body position error in the anchor's frame and in the world (cm)."""
    for key, marker, color, label in (
        ("eval/body_error_anchor", "o-", "tab:green", "body error, anchor frame (cm)"),
        ("eval/body_error_world", "^-", "tab:purple", "body error, world (cm)"),
    ):
        steps, errors = series(rows, key)
        axis.plot(steps, [100.0 * error for error in errors], marker, color=color, label=label)
    axis.set(xlabel="env steps", ylabel="cm", title="Evaluation: tracking and success")
    add_rate_axis(axis, rows, "eval/success_rate", "success rate")


def clip_names(rows: list[dict[str, float]]) -> list[str]:
    """The clips a motion run over several clips evaluated one by one, as first logged."""
    return list({clip: None for row in rows for clip in clip_success_rates(row)})


def draw_clip_panel(axis: Any, rows: list[dict[str, float]], clips: list[str]) -> None:
    """Each clip's evaluation success rate (0 to 1)."""
    for clip in clips:
        axis.plot(*series(rows, f"eval/{clip}/success_rate"), "o-", markersize=3, label=clip)
    axis.set(xlabel="env steps", ylabel="success rate", ylim=(-0.05, 1.05), title="Evaluation: success per clip")
    axis.legend(loc="lower right", fontsize=8)
    axis.grid(alpha=0.3)
    axis.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))


def draw_terrain_panel(axis: Any, rows: list[dict[str, float]]) -> None:
    """The terrain curriculum's mean level over the training envs, and the level evaluations ran on."""
    axis.plot(*series(rows, "terrain/mean_level"), color="tab:brown", label="training envs' mean level")
    axis.plot(*series(rows, "eval/terrain_level"), "o", color="tab:gray", label="evaluation level")
    axis.set(xlabel="env steps", ylabel="terrain level", title="Terrain curriculum")
    axis.legend(fontsize=8)


def learning_curve_figure(rows: list[dict[str, float]], title: str) -> Figure:
    """The panels for a run's logged rows: return, length, then motion tracking (or else locomotion), the clips
    one by one and terrain where the run has them."""
    from matplotlib.figure import Figure  # without pyplot: a file needs no backend or display (and loads faster)

    locomotion = any("eval/base_speed_x" in row for row in rows)
    clips = clip_names(rows)
    terrain = any("terrain/mean_level" in row for row in rows)
    panels = 2 + locomotion + bool(clips) + terrain
    figure = Figure(figsize=(5 * panels, 3.6))
    axes = figure.subplots(1, panels)
    draw_panel(axes[0], rows, "return", "episode return", "training episodes (mean per log line)")
    draw_panel(axes[1], rows, "length", "control steps", "training episodes")
    if locomotion and any("eval/success_rate" in row for row in rows):
        draw_motion_panel(axes[2], rows)
    elif locomotion:
        draw_locomotion_panel(axes[2], rows)
    if clips:
        draw_clip_panel(axes[2 + locomotion], rows, clips)
    if terrain:
        draw_terrain_panel(axes[-1], rows)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_learning_curve(run_dir: str | Path, title: str | None = None) -> Path:
    """Writes `learning_curve.png` in the run folder and returns its path."""
    run_dir = Path(run_dir)
    path = run_dir / PICTURE
    learning_curve_figure(read_scalars(run_dir), title or run_dir.name).savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m ksim.plot RUN_DIR   (writes RUN_DIR/learning_curve.png)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        print(f"wrote {plot_learning_curve(args[0])}")
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
