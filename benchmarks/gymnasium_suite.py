"""Gymnasium's MuJoCo v5 locomotion tasks (examples/gymnasium.py) trained with ksim's PPO, beside published results.

    .venv/bin/python -m benchmarks.gymnasium_suite                                 # 4 tasks x 3 seeds, 1M env steps
    .venv/bin/python -m benchmarks.gymnasium_suite --tasks Hopper-v5 --seeds 1 --env-steps 5000000 --gymnasium-check
    .venv/bin/python -m benchmarks.gymnasium_suite --env-steps 5000000 --eval-every 250000 --tuned

The script trains each task and seed with the small-budget PPO preset (examples/gymnasium.py), evaluates the
deterministic policy at the `--eval-at` env-step counts (and every `--eval-every` env steps) and prints a markdown
table beside published PPO results, with how stable each run's last five evaluations are (spread of their returns,
worst fall rate); `--gymnasium-check` also plays each trained policy in Gymnasium's own environment. `--tuned`
applies each task's settings for 5M env steps (`TUNED_5M`) over the preset, and `--set` any setting over those.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from examples.gymnasium import TASKS, TUNED_5M, GymnasiumTask, HopperTask, task_config
from ksim.config import ConfigError, parse_overrides
from ksim.task.evaluation import EvalResult

LAST_EVALUATIONS = 5  # a run's stability is judged over its last five evaluations

# Published PPO results at 1M env steps (mean ± std as published), on earlier versions of these tasks.
CLEANRL = {"Hopper-v5": "2382.86 ± 271.74", "Walker2d-v5": "2287.95 ± 571.78", "HalfCheetah-v5": "1442.64 ± 46.03"}
ZOO = {
    "Hopper-v5": "2410.44 ± 10.03",
    "Walker2d-v5": "3478.80 ± 821.71",
    "HalfCheetah-v5": "5819.10 ± 663.53",
    "Ant-v5": "1327.16 ± 451.58",
}
CAPTION = (
    "ksim: deterministic-policy return, mean over {episodes} evaluation episodes per run, then mean ± std over "
    "seeds, with the small-budget PPO preset (benchmarks/gymnasium_suite.py). CleanRL: ppo_continuous_action.py on "
    "the v4 tasks, average episodic return of its training episodes at 1M steps "
    "(https://docs.cleanrl.dev/rl-algorithms/ppo/, MuJoCo v4 table, tag pr-424; its table has no Ant). "
    "rl-baselines3-zoo: PPO on the v3 tasks, one trained agent per task, 1M steps, deterministic policy, mean ± std "
    "over its evaluation episodes (https://github.com/DLR-RM/rl-baselines3-zoo/blob/master/benchmark.md). v3/v4 "
    "differ from v5 in details (v5 pays no healthy reward at the terminating step; Ant-v5 observes and pays for "
    "contact forces, which Ant-v3 read as zeros under mujoco-py >= 2 and Ant-v4 leaves out by default), so the "
    "published figures are context, not the same MDP."
)


@dataclass
class RunResult:
    """One task and seed: its evaluations by the env steps trained before each, and the run's wall time."""

    task: str
    seed: int
    evaluations: dict[int, EvalResult]
    wall_s: float
    updates: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)  # UPDATE_METRICS before each
    # With policy_average_decay > 0 `evaluations` run the parameters' average (what a robot gets) and `latest` the
    # latest parameters, side by side: the average does not change training, so one run shows what it is worth.
    latest: dict[int, EvalResult] = dataclasses.field(default_factory=dict)


# What --log-updates prints beside each evaluation: the train steps' means since the previous evaluation.
UPDATE_METRICS = ("entropy", "approx_kl", "clip_fraction", "local_grad_norm", "learning_rate")


def train_and_evaluate(
    task_class: type[GymnasiumTask],
    seed: int,
    env_steps: int,
    eval_at: Sequence[int],
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> tuple[RunResult, GymnasiumTask, Any]:
    """Trains for `env_steps` env steps (whole train steps) and evaluates after the first train step that reaches
    each of `eval_at` (passing each evaluation's `update_line` to `log` as it is made). Returns the run's result
    (its wall time counts everything: building, compiling, evaluating), the task and the trained shared state."""
    start = time.perf_counter()
    config = task_config(task_class, seed=seed, **overrides)
    num_steps = max(1, math.ceil(env_steps / (config.num_envs * config.rollout_length_frames)))
    task = task_class(dataclasses.replace(config, num_steps=num_steps))  # the learning rate anneals over num_steps
    state = task.init_train_state()
    run = RunResult(task_class.gymnasium_id, seed, {}, 0.0)
    due, since_evaluation = sorted(set(eval_at)), []
    for step in range(1, num_steps + 1):
        state, metrics = task.train_step(state)
        state = task.after_train_step(state, step)
        since_evaluation.append({name: metrics[name] for name in UPDATE_METRICS if name in metrics})
        trained = step * task.env_steps_per_train_step
        if due and (trained >= due[0] or step == num_steps):
            shared = task.fetch_replicated(state.shared)
            run.evaluations[trained] = task.evaluate(shared)
            if shared.average_params is not None:
                run.latest[trained] = task.evaluate(shared.replace(average_params=shared.params))
            means = jax.tree.map(lambda *values: float(np.mean(values)), *jax.device_get(since_evaluation))
            run.updates[trained], since_evaluation = means, []
            due = [count for count in due if count > trained]
            if log is not None:
                log(update_line(run, trained))
    shared = jax.block_until_ready(task.fetch_replicated(state.shared))
    run.wall_s = time.perf_counter() - start
    return run, task, shared


def return_and_falls(result: EvalResult) -> str:
    return f"return {np.mean(result.returns):.1f} ({int(np.sum(result.fell))}/{len(result.returns)} fell)"


def update_line(run: RunResult, steps: int) -> str:
    """The evaluation after `steps` env steps (and the latest parameters' beside it, if the run keeps an average),
    then the means of the updates since the previous evaluation."""
    means = " ".join(f"{name} {value:.4g}" for name, value in run.updates.get(steps, {}).items())
    latest = f" | latest parameters: {return_and_falls(run.latest[steps])}" if steps in run.latest else ""
    return f"  {steps:,} env steps: {return_and_falls(run.evaluations[steps])}{latest} | {means}"


def gymnasium_returns(task: GymnasiumTask, shared: Any, episodes: int, seed: int) -> list[float]:
    """The deterministic policy's returns in `gymnasium.make(<task id>)` itself (clipping its actions with
    clip_actions, as the ClipAction wrapper would)."""
    import gymnasium

    from ksim.modes.export import exported_policy

    policy = jax.jit(exported_policy(task, shared))
    env = gymnasium.make(task.gymnasium_id)
    space = env.action_space
    assert isinstance(space, gymnasium.spaces.Box)
    low, high = space.low, space.high
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed * 1000 + episode)
        total, done = 0.0, False
        while not done:
            action = np.asarray(policy(jnp.asarray(observation, jnp.float32)[None])[0][0], np.float64)
            action = np.clip(action, low, high) if task.config.clip_actions else action
            observation, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def steps_label(count: int) -> str:
    """1M, 2.5M, or 4,096 for counts that are no multiple of 100k."""
    return f"{count / 1e6:g}M" if count % 100_000 == 0 else f"{count:,}"


def mean_std(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def summary_table(results: Sequence[RunResult], eval_at: Sequence[int], episodes: int) -> str:
    """Per task: the mean evaluation return at each checkpoint over seeds, the stability of the runs' last
    evaluations, wall time, the published figures."""
    checkpoints = sorted(set(eval_at))
    header = ["task", "seeds", *(f"ksim at {steps_label(count)}" for count in checkpoints)]
    header += [f"last {LAST_EVALUATIONS} evaluations: spread / fall rate (worst seed)", "wall s per run"]
    header += ["CleanRL PPO (v4, 1M)", "SB3 zoo PPO (v3, 1M)"]
    lines = [f"Table: {CAPTION.format(episodes=episodes)}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|")
    for task in dict.fromkeys(result.task for result in results):
        runs = [result for result in results if result.task == task]
        cells = [task, str(len(runs))]
        for count in checkpoints:
            evaluations = [evaluation for run in runs if (evaluation := at(run, count)) is not None]
            returns = [float(np.mean(evaluation.returns)) for evaluation in evaluations]
            cells.append(mean_std(returns) if returns else "-")
        cells.append(stability_cell(runs))
        cells.append(mean_std([run.wall_s for run in runs]))
        cells += [CLEANRL.get(task, "n/a (not in CleanRL's table)"), ZOO.get(task, "-")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Stability:
    """A run's last evaluations: their lowest and highest mean return, the spread between them as a fraction of
    the highest (0.15: the lowest is 85% of the highest) and the worst fall rate among them."""

    lowest: float
    highest: float
    spread: float
    worst_fall_rate: float


def stability(by_steps: Mapping[int, EvalResult], last: int = LAST_EVALUATIONS) -> Stability | None:
    """How stable a run's last `last` evaluations are (`by_steps`: its evaluations by env steps); None when it has
    fewer."""
    evaluations = [by_steps[steps] for steps in sorted(by_steps)[-last:]]
    if len(evaluations) < last:
        return None
    returns = [float(np.mean(evaluation.returns)) for evaluation in evaluations]
    lowest, highest = min(returns), max(returns)
    spread = (highest - lowest) / abs(highest) if highest else math.inf
    worst = max(float(np.mean(evaluation.fell)) for evaluation in evaluations)
    return Stability(lowest, highest, spread, worst)


def stability_cell(runs: Sequence[RunResult]) -> str:
    """The worst spread and fall rate over the runs' last evaluations ("-" if a run has too few)."""
    measured = [stability(run.evaluations) for run in runs]
    if not measured or any(entry is None for entry in measured):
        return "-"
    spread = max(entry.spread for entry in measured if entry is not None)
    falls = max(entry.worst_fall_rate for entry in measured if entry is not None)
    return f"{spread:.0%} / {falls:.2f}"


def print_prefixed(prefix: str, line: str) -> None:
    print(f"{prefix}{line}", flush=True)


def run_summary(by_steps: Mapping[int, EvalResult]) -> str:
    """A run's final evaluation and the stability of its last ones."""
    line = f"final evaluation {np.mean(by_steps[max(by_steps)].returns):.1f}"
    if (last := stability(by_steps)) is not None:
        line += (
            f", last {LAST_EVALUATIONS} evaluations {last.lowest:.1f}-{last.highest:.1f} "
            f"(spread {last.spread:.0%}, worst fall rate {last.worst_fall_rate:.2f})"
        )
    return line


def eval_points(env_steps: int, eval_at: Sequence[int], eval_every: int) -> list[int]:
    """The env-step counts to evaluate at: `eval_at` and every `eval_every` (0: none), capped at `env_steps`."""
    periodic = range(eval_every, env_steps + 1, eval_every) if eval_every > 0 else []
    return sorted({min(count, env_steps) for count in [*eval_at, *periodic]})


def at(run: RunResult, count: int) -> EvalResult | None:
    """The run's evaluation for checkpoint `count`: the first one at or after it (the last if it trained less)."""
    reached = [steps for steps in sorted(run.evaluations) if steps >= count]
    if reached:
        return run.evaluations[reached[0]]
    return run.evaluations[max(run.evaluations)] if run.evaluations else None


def runs_table(results: Sequence[RunResult], gym_check: dict[tuple[str, int], list[float]]) -> str:
    """Per run: every evaluation (env steps trained, mean return, falls), wall time, Gymnasium's own returns."""
    lines = ["| task | seed | evaluations: env steps -> mean return (falls) | wall s | in Gymnasium's env |"]
    lines.append("|---|---:|---|---:|---|")
    for run in results:
        evaluations = ", ".join(
            f"{steps:,} -> {np.mean(result.returns):.1f} ({int(np.sum(result.fell))}/{len(result.returns)})"
            for steps, result in sorted(run.evaluations.items())
        )
        check = gym_check.get((run.task, run.seed))
        gym = f"{np.mean(check):.1f} over {len(check)} episodes" if check else "-"
        lines.append(f"| {run.task} | {run.seed} | {evaluations} | {run.wall_s:.0f} | {gym} |")
    return "\n".join(lines)


def setting_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set key=value` pairs, typed and checked against the task config; raises ConfigError on a bad one."""
    parsed = parse_overrides(task_config(HopperTask), pairs)
    return {key: getattr(parsed, key) for key in (pair.split("=", 1)[0] for pair in pairs)}


def task_settings(task_id: str, tuned: bool, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A task's settings over the preset: its TUNED_5M ones if `tuned`, then `settings` (from --set) over those."""
    return {**(TUNED_5M[task_id] if tuned else {}), **settings}


def task_names(requested: Sequence[str]) -> list[str]:
    """Gymnasium ids for names given as ids or short names (hopper, Walker2d, ...), in the order given."""
    short = {task_id.split("-")[0].lower(): task_id for task_id in TASKS}
    chosen = []
    for name in requested:
        task_id = name if name in TASKS else short.get(name.split("-")[0].lower())
        if task_id is None:
            raise SystemExit(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
        chosen.append(task_id)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="Gymnasium ids or short names")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per task: --first-seed .. --first-seed + N - 1")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to add seeds to an earlier run)")
    parser.add_argument("--env-steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument(
        "--eval-at", type=int, nargs="+", default=[1_000_000, 5_000_000], help="env-step counts (capped at --env-steps)"
    )
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N env steps (0: only --eval-at)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="deterministic episodes per evaluation")
    parser.add_argument("--clip-actions", action="store_true", help="control cost on clipped actions (see --help)")
    parser.add_argument(
        "--tuned", action="store_true", help="each task's settings for 5M env steps (TUNED_5M) over the preset"
    )
    parser.add_argument(
        "--gymnasium-check", action="store_true", help="also play each trained policy in gymnasium.make(<task>)"
    )
    parser.add_argument("--check-episodes", type=int, default=5, help="episodes of --gymnasium-check per run")
    parser.add_argument(
        "--log-updates", action="store_true", help="print each evaluation with the updates' entropy, KL, ... before it"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings over the preset's, e.g. entropy_coef=0.01 (any PPO setting: python -m examples.hopper --help)",
    )
    args = parser.parse_args()
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds={args.seeds} must be >= 1 and --first-seed={args.first_seed} >= 0")
    if args.eval_every < 0:
        parser.error(f"--eval-every={args.eval_every} must be >= 0 (0: evaluate only at --eval-at)")
    try:
        settings = setting_overrides(args.set)
    except ConfigError as error:
        parser.error(f"--set: {error}")
    columns = eval_points(args.env_steps, args.eval_at, 0)  # the table's; the runs also evaluate in between
    eval_at = eval_points(args.env_steps, args.eval_at, args.eval_every)
    results: list[RunResult] = []
    gym_check: dict[tuple[str, int], list[float]] = {}
    changed = {task_id: task_settings(task_id, args.tuned, settings) for task_id in task_names(args.tasks)}
    for task_id, task_changes in changed.items():
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            overrides = {
                **task_changes,
                "eval_episodes": args.eval_episodes,
                "clip_actions": args.clip_actions,
            }
            log = functools.partial(print_prefixed, f"{task_id} seed {seed}:") if args.log_updates else None
            run, task, shared = train_and_evaluate(TASKS[task_id], seed, args.env_steps, eval_at, log, **overrides)
            results.append(run)
            line = f"{task_id} seed {seed}: {run.wall_s:.0f} s, {run_summary(run.evaluations)}"
            if run.latest:
                line += f"; the latest parameters: {run_summary(run.latest)}"
            if args.gymnasium_check:
                gym_check[(task_id, seed)] = gymnasium_returns(task, shared, args.check_episodes, seed)
                line += f", in Gymnasium's env {np.mean(gym_check[(task_id, seed)]):.1f}"
            print(line, flush=True)
    print()
    for task_id, task_changes in changed.items():
        if task_changes:
            print(f"{task_id}'s settings over the preset: " + " ".join(f"{k}={v}" for k, v in task_changes.items()))
    print(summary_table(results, columns, args.eval_episodes))
    print()
    print(runs_table(results, gym_check))


if __name__ == "__main__":
    main()
