"""Training output: one line per log step on stdout, the same scalars to TensorBoard and to
`scalars.jsonl` (one JSON object per log step, read back by `python -m ksim.plot`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

STDOUT_KEYS = (
    "episode_length",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "learning_rate",  # only with a learning_rate_schedule
    "symmetry_loss",  # only with symmetry_coef > 0
)
SCALARS_FILE = "scalars.jsonl"


def clip_success_rates(scalars: dict[str, float]) -> dict[str, float]:
    """Per clip, the success rate logged by a motion's evaluation over several clips (`eval/CLIP/success_rate`)."""
    rates = {}
    for key, value in scalars.items():
        scope, _, rest = key.partition("/")
        clip, _, quantity = rest.partition("/")
        if scope == "eval" and quantity == "success_rate":
            rates[clip] = value
    return rates


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _format(key: str, value: Any) -> str:
    return f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"


def format_line(step: int, num_steps: int, env_steps: int, scalars: dict[str, float], eta_s: float) -> str:
    """`step 10/100 (10%, eta 1m20s) env_steps 40960 | env_steps_per_s 2.1e+04 | episode_return 31.2 (37 ended) ...`.

    The return is the mean over the episodes that ended since the last line (short ones dominate early).
    """
    head = f"step {step}/{num_steps} ({100 * step // max(num_steps, 1)}%, eta {format_duration(eta_s)})"
    parts = [head, f"env_steps {env_steps}"]
    parts += [
        _format(key, scalars[key])
        for key in ("env_steps_per_s", "env_steps_per_s_per_device", "num_devices")
        if key in scalars
    ]
    if "episode_return" in scalars:
        ended = int(scalars.get("episodes_finished", 0))
        parts.append(f"episode_return {scalars['episode_return']:.4g} ({ended} ended)")
    parts += [_format(key, scalars[key]) for key in STDOUT_KEYS if key in scalars]
    return " | ".join(parts)


class ScalarSink(Protocol):
    """Somewhere else the same scalars go (ksim.wandb_logging.WandbRun); its owner closes it."""

    def scalars(self, step: int, env_steps: int, values: dict[str, float]) -> None: ...


class MetricsLogger:
    """Prints log lines and writes TensorBoard scalars and `scalars.jsonl` (only ever created on process 0),
    and hands the same scalars to `sinks`."""

    def __init__(
        self, log_dir: Path | None, scalars_path: Path | None = None, sinks: Sequence[ScalarSink] = ()
    ) -> None:
        self._writer = None
        self._scalars_path = scalars_path
        self._sinks = tuple(sinks)
        if log_dir is not None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(log_dir))

    def _record(self, step: int, env_steps: int, scalars: dict[str, float]) -> None:
        finite = {key: value for key, value in scalars.items() if math.isfinite(value)}
        if self._writer is not None:
            for key, value in finite.items():
                self._writer.add_scalar(key, value, env_steps)
            self._writer.flush()
        if self._scalars_path is not None:
            with self._scalars_path.open("a") as file:
                file.write(json.dumps({"step": step, "env_steps": env_steps, **finite}) + "\n")
        for sink in self._sinks:
            sink.scalars(step, env_steps, finite)

    def log(self, step: int, num_steps: int, env_steps: int, scalars: dict[str, float], eta_s: float) -> None:
        print(format_line(step, num_steps, env_steps, scalars, eta_s), flush=True)
        self._record(step, env_steps, scalars)

    def log_eval(self, step: int, env_steps: int, scalars: dict[str, float]) -> None:
        """`eval step 20 | eval/return 412.5 | eval/length 500`."""
        print(" | ".join([f"eval step {step}", *(_format(k, v) for k, v in scalars.items())]), flush=True)
        self._record(step, env_steps, scalars)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def unique_names(names: Sequence[str]) -> list[str]:
    """Appends an index to repeated component names so each one is logged on its own."""
    return [name if names.count(name) == 1 else f"{name}_{names[:i].count(name)}" for i, name in enumerate(names)]


def window_scalars(window: list[dict[str, Any]]) -> dict[str, float]:
    """Host metrics of the train steps since the last log line: episode sums become means over the episodes
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
