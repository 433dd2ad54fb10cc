"""Training output: one line per log step on stdout and the same scalars to TensorBoard."""

from __future__ import annotations

import math
from pathlib import Path

STDOUT_KEYS = (
    "episode_return",
    "episode_length",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def format_line(step: int, num_steps: int, env_steps: int, scalars: dict[str, float], eta_s: float) -> str:
    """`step 10/100 (10%, eta 1m20s) env_steps 40960 | env_steps_per_s 2.1e+04 | ...`."""
    head = f"step {step}/{num_steps} ({100 * step // max(num_steps, 1)}%, eta {format_duration(eta_s)})"
    parts = [head, f"env_steps {env_steps}"]
    for key in ("env_steps_per_s", "env_steps_per_s_per_device", "num_devices", *STDOUT_KEYS):
        if key in scalars:
            value = scalars[key]
            parts.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return " | ".join(parts)


class MetricsLogger:
    """Prints log lines and writes TensorBoard scalars (only ever created on process 0)."""

    def __init__(self, log_dir: Path | None) -> None:
        self._writer = None
        if log_dir is not None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, num_steps: int, env_steps: int, scalars: dict[str, float], eta_s: float) -> None:
        print(format_line(step, num_steps, env_steps, scalars, eta_s), flush=True)
        if self._writer is not None:
            for key, value in scalars.items():
                if math.isfinite(value):
                    self._writer.add_scalar(key, value, env_steps)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
