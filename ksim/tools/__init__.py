"""Analysis commands over a trained checkpoint: `python -m ksim.tools.tracking_breakdown` (where a tracking error
comes from) and `python -m ksim.tools.gait_stats` (whether the feet lift, take turns and stay down)."""
