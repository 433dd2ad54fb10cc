"""What a recurrent policy costs: the walking example's train step with the MLP and with a GRU, side by side.

    .venv/bin/python -m benchmarks.recurrent_cost                          # recurrent_size=64, CPU preset
    .venv/bin/python -m benchmarks.recurrent_cost --recurrent-size 128 --rounds 5 --num-envs 256

Both variants are built and compiled first, then timed in alternating rounds (medians reported), so load
changes hit both alike. The GRU variant replays every trajectory through its GRUs in the update (truncated
backpropagation through the rollout) and steps the critic's GRU in the rollout, so both halves of the train
step grow.
"""

from __future__ import annotations

import argparse
import dataclasses

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from benchmarks.scaling import side_by_side
from examples.walking import CPU_CONFIG, WalkingTask


def build(recurrent_size: int, num_envs: int, rollout_length: int) -> WalkingTask:
    config = dataclasses.replace(
        CPU_CONFIG,
        recurrent_size=recurrent_size,
        num_envs=num_envs,
        batch_size=min(CPU_CONFIG.batch_size, num_envs),
        rollout_length_frames=rollout_length,
    )
    return WalkingTask(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recurrent-size", type=int, default=64, help="GRU units of the recurrent variant.")
    parser.add_argument("--num-envs", type=int, default=CPU_CONFIG.num_envs)
    parser.add_argument("--rollout-length", type=int, default=CPU_CONFIG.rollout_length_frames)
    parser.add_argument("--rounds", type=int, default=5, help="Alternating timing rounds (medians reported).")
    parser.add_argument("--steps", type=int, default=2, help="Train steps per timing round.")
    args = parser.parse_args()
    tasks = {
        "mlp": build(0, args.num_envs, args.rollout_length),
        f"gru{args.recurrent_size}": build(args.recurrent_size, args.num_envs, args.rollout_length),
    }
    report, _ = side_by_side(tasks, args.rounds, args.steps)
    (mlp, mlp_report), (gru, gru_report) = report.items()
    steps_per_train_step = tasks[mlp].env_steps_per_train_step
    mlp_s, gru_s = (steps_per_train_step / r["env_steps_per_s"] for r in (mlp_report, gru_report))
    print(f"walking, {args.num_envs} envs x {args.rollout_length} steps per train step, {args.rounds} rounds")
    print(f"{'variant':>10}{'train step s':>14}{'compile s':>11}")
    for name, seconds, compile_s in ((mlp, mlp_s, mlp_report["compile_s"]), (gru, gru_s, gru_report["compile_s"])):
        print(f"{name:>10}{seconds:>14.3f}{compile_s:>11.0f}")
    print(f"{gru}/{mlp} train step time: {gru_s / mlp_s:.2f}", flush=True)


if __name__ == "__main__":
    main()
