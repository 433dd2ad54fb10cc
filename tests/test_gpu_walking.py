"""benchmarks/gpu_walking.py reads the walking example's own lines (these are from its H100 run)."""

from benchmarks.gpu_walking import Run

LINES = [
    (39.6, "startup and compilation: 32.0 s"),
    (39.9, "step 1/100000 (0%, eta 8h21m) | env_steps 65536 | env_steps_per_s 2.178e+05 | episode_return 41.73"),
    (40.8, "step 5/100000 (0%, eta 6h41m) | env_steps 327680 | env_steps_per_s 2.898e+05 | episode_return 84.94"),
    (42.0, "step 10/100000 (0%, eta 6h30m) | env_steps 655360 | env_steps_per_s 2.879e+05 | episode_return 102.9"),
    (49.2, "eval step 40 | eval/return 228.5 | eval/length 76.3 | eval/base_speed_x 0.7897 | eval/fall_rate 1"),
    (61.7, "eval step 80 | eval/return 2244 | eval/length 1000 | eval/base_speed_x -0.006563 | eval/fall_rate 0"),
    (211.1, "eval step 560 | eval/return 3733 | eval/length 1000 | eval/base_speed_x 0.9581 | eval/fall_rate 0"),
    (272.9, "eval step 760 | eval/return 3758 | eval/length 1000 | eval/base_speed_x 1.032 | eval/fall_rate 0"),
]


def test_the_first_evaluation_that_walks_and_the_rates() -> None:
    run = Run("jax")
    for seconds, line in LINES:
        run.read(seconds, line)
    assert run.compile_s == 32.0
    assert run.rates == [2.178e5, 2.898e5, 2.879e5]
    assert [step for _, step, _, _ in run.evals] == [40, 80, 560, 760]
    assert run.first_walk() == (211.1, 560)  # step 40 is faster but falls; step 80 stands
    assert run.summary() == "| jax | 32.0 s | 288,850 | 211 s, step 560, 36.7M env steps | 4 |"
