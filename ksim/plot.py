"""Learning curves: `python -m ksim.plot RUN_DIR` writes RUN_DIR/learning_curve.png from the run's own scalars.

Training writes the same picture when it ends. The curves are read from `scalars.jsonl` (one JSON object
per log line): the mean return and length of the episodes that ended in each logging window, and the
deterministic evaluation return where the run evaluated (`eval_every_n_steps`), against env steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ksim.reporting import SCALARS_FILE

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


def plot_learning_curve(run_dir: str | Path, title: str | None = None) -> Path:
    """Writes `learning_curve.png` in the run folder and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_scalars(run_dir)
    figure, (returns_axis, length_axis) = plt.subplots(1, 2, figsize=(10, 3.6))
    returns_axis.plot(*series(rows, "episode_return"), label="training episodes (mean per log line)")
    steps, values = series(rows, "eval/return")
    if steps:
        returns_axis.plot(steps, values, "o-", label="evaluation (deterministic)")
    returns_axis.set(xlabel="env steps", ylabel="episode return", title="Return")
    returns_axis.legend(loc="lower right", fontsize=8)
    length_axis.plot(*series(rows, "episode_length"), label="training episodes")
    steps, values = series(rows, "eval/length")
    if steps:
        length_axis.plot(steps, values, "o-", label="evaluation")
    length_axis.set(xlabel="env steps", ylabel="control steps", title="Episode length")
    length_axis.legend(loc="lower right", fontsize=8)
    for axis in (returns_axis, length_axis):
        axis.grid(alpha=0.3)
    figure.suptitle(title or run_dir.name)
    figure.tight_layout()
    path = run_dir / PICTURE
    figure.savefig(path, dpi=100)
    plt.close(figure)
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
