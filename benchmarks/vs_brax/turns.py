"""Turn-taking between the two workers of benchmarks/vs_brax, so both are timed under the same machine state.

Both workers run at once; only one works at a time. A worker ends each turn by printing `TURN_DONE` and
blocking on stdin until the parent writes `GO`; the parent hands turns out in the order A B B A A B ..., so a
drift in the machine's speed falls on both alike. Workers time themselves on `Turns.clock`, which stops while
they wait. No imports beyond the standard library: it runs in both frameworks' environments.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

TURN_DONE = "ksim-bench: turn done"
GO = "go"


class Turns:
    """The worker's side: `wait` between turns, `clock` for timings that leave the waits out."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now  # tests give a clock that does not depend on how fast the machine is
        self.waited_s = 0.0

    def wait(self) -> None:
        """Ends this worker's turn; returns when the parent gives it the next one."""
        start = self.now()
        print(TURN_DONE, flush=True)
        if sys.stdin.readline().strip() != GO:
            raise SystemExit("benchmarks.vs_brax worker: the parent closed the turn channel")
        self.waited_s += self.now() - start

    def clock(self) -> float:
        """Seconds of this worker's own turns (`now` stopped while it waits)."""
        return self.now() - self.waited_s


def turn_order(first: str, second: str, turn: int) -> str:
    """Whose turn number `turn` is: first, second, second, first, first, second, ..."""
    return (first, second)[(turn + 1) // 2 % 2]
