"""What rough terrain costs: the quadruped example's train step on its flat floor and with terrain=rough, side by side.

    .venv/bin/python -m benchmarks.terrain_cost                        # the example's physics_impl (auto)
    .venv/bin/python -m benchmarks.terrain_cost --physics-impl jax --rounds 5

Both variants are built and compiled first (compile time: the first train step, no compilation cache), then
timed in alternating rounds (medians reported), so load changes hit both alike. The rough variant adds the
heightfield's collisions, the height scan, the privileged critic and the curriculum.
"""

from __future__ import annotations

import argparse
import dataclasses

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from benchmarks.scaling import side_by_side
from examples.quadruped import DEFAULT_CONFIG, QuadrupedTask
from ksim.physics import PHYSICS_IMPLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--physics-impl", choices=PHYSICS_IMPLS, default=DEFAULT_CONFIG.physics_impl)
    parser.add_argument("--rounds", type=int, default=5, help="Alternating timing rounds (medians reported).")
    parser.add_argument("--steps", type=int, default=3, help="Train steps per timing round.")
    args = parser.parse_args()
    base = dataclasses.replace(DEFAULT_CONFIG, physics_impl=args.physics_impl, num_devices=1, compilation_cache_dir="")
    tasks = {terrain: QuadrupedTask(dataclasses.replace(base, terrain=terrain)) for terrain in ("flat", "rough")}
    report, _ = side_by_side(tasks, args.rounds, args.steps)
    print(f"quadruped, {base.num_envs} envs x {base.rollout_length_frames} steps, physics_impl={args.physics_impl}")
    print(f"{'terrain':>8}{'env-steps/s':>13}{'compile s':>11}")
    for terrain, entry in report.items():
        print(f"{terrain:>8}{entry['env_steps_per_s']:>13,.0f}{entry['compile_s']:>11.1f}")
    ratio = report["rough"]["env_steps_per_s"] / report["flat"]["env_steps_per_s"]
    print(f"rough/flat env-steps/s: {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
