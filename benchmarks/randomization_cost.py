"""What the sim-to-real components cost: env-steps/s with them on and off, side by side, on one device.

    .venv/bin/python -m benchmarks.randomization_cost                     # cart-pole and walking, CPU sizes
    .venv/bin/python -m benchmarks.randomization_cost --tasks cartpole --rounds 5

"On" is domain randomization (every ksim.randomization class the model allows), a velocity command
(redrawn every 0.5-1 s), pushes (walking only: the cart-pole's root is a slider, which pushes refuse),
observation noise and a one-step action delay. Both variants of a task are built first, then timed in
alternating rounds (median reported), so load changes hit both alike; compile time is the first train step.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

import ksim  # noqa: F401  (sizes the CPU thread pool before JAX starts)
from benchmarks.scaling import side_by_side
from examples.cartpole import DEFAULT_CONFIG as CARTPOLE_CONFIG
from examples.cartpole import CartpoleTask
from examples.walking import CPU_CONFIG as WALKING_CONFIG
from examples.walking import WalkingTask
from ksim import observations as obs
from ksim import randomization as rnd
from ksim.commands import Command, VelocityCommand
from ksim.events import Event, Push

FAST_COMMAND = VelocityCommand(resample_s=(0.5, 1.0))


class CartpoleSim2RealTask(CartpoleTask):
    """The cart-pole with everything its model allows on (contacts are off, so no friction; no pushes)."""

    def get_observations(self) -> Sequence[obs.Observation]:
        return [
            obs.JointPosition(joints=("hinge",), noise=0.01),
            obs.JointVelocity(scale=1.0, joints=("slider", "hinge"), noise=0.05),
            obs.Command(),
        ]

    def get_randomizations(self) -> Sequence[rnd.Randomization]:
        return [
            rnd.BodyMass(0.8, 1.2),
            rnd.CenterOfMassOffset(-0.02, 0.02, body="pole"),
            rnd.JointDamping(0.5, 2.0),
            rnd.JointArmature(0.5, 2.0),
            rnd.ActuatorStrength(0.8, 1.2),
        ]

    def get_command(self) -> Command | None:
        return FAST_COMMAND


class WalkingSim2RealTask(WalkingTask):
    """The walking task's sim-to-real components with commands and pushes drawn often."""

    def get_command(self) -> Command | None:
        return FAST_COMMAND

    def get_events(self) -> Sequence[Event]:
        return [Push(interval_s=(0.5, 1.0))]


def variants(task: str) -> dict[str, Any]:
    if task == "cartpole":
        delay = dataclasses.replace(CARTPOLE_CONFIG, action_delay_steps=1)
        return {"off": CartpoleTask(CARTPOLE_CONFIG), "on": CartpoleSim2RealTask(delay)}
    walking_on = dataclasses.replace(WALKING_CONFIG, sim2real=True, action_delay_steps=1)
    return {"off": WalkingTask(WALKING_CONFIG), "on": WalkingSim2RealTask(walking_on)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=("cartpole", "walking"), default=["cartpole", "walking"])
    parser.add_argument("--rounds", type=int, default=3, help="Alternating timing rounds (median is reported).")
    parser.add_argument("--steps", type=int, default=5, help="Train steps per timing round.")
    args = parser.parse_args()
    header = ("task", "envs x steps", "off env-steps/s", "on env-steps/s", "on/off", "compile s off/on")
    widths = (10, 14, 17, 16, 8, 18)
    print("".join(f"{text:>{width}}" for text, width in zip(header, widths, strict=True)))
    for task_name in args.tasks:
        report, _ = side_by_side(variants(task_name), args.rounds, args.steps)
        config = CARTPOLE_CONFIG if task_name == "cartpole" else WALKING_CONFIG
        off, on = report["off"], report["on"]
        row = (
            task_name,
            f"{config.num_envs} x {config.rollout_length_frames}",
            f"{off['env_steps_per_s']:.0f}",
            f"{on['env_steps_per_s']:.0f}",
            f"{on['env_steps_per_s'] / off['env_steps_per_s']:.2f}",
            f"{off['compile_s']:.0f} / {on['compile_s']:.0f}",
        )
        print("".join(f"{text:>{width}}" for text, width in zip(row, widths, strict=True)), flush=True)


if __name__ == "__main__":
    main()
