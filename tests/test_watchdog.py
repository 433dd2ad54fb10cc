"""The watchdog times each train step from when it could start, and aborts a stuck one with a diagnosis."""

import subprocess
import sys
import textwrap
import time

from ksim.task.loop import Watchdog


class FakeStep:
    """Stands in for a step's metrics array: `is_ready()` is what the watchdog polls."""

    def __init__(self) -> None:
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready


def test_stall_is_measured_from_the_previous_step_finishing() -> None:
    watchdog = Watchdog(timeout_s=100.0, diagnosis=lambda: "")
    first, second = FakeStep(), FakeStep()
    watchdog.track({"loss": first})
    watchdog.track({"loss": second})
    time.sleep(0.2)
    assert watchdog.stalled_for() >= 0.2  # the first step is running
    first.ready = True
    assert watchdog.stalled_for() < 0.1  # the second one only starts now
    second.ready = True
    assert watchdog.stalled_for() == 0.0


def test_a_stuck_step_aborts_with_the_diagnosis() -> None:
    script = textwrap.dedent(
        """
        import time
        from ksim.task.loop import Watchdog

        class Stuck:
            def is_ready(self):
                return False

        with Watchdog(timeout_s=0.5, diagnosis=lambda: "Known issue: example diagnosis") as watchdog:
            watchdog.track({"loss": Stuck()})
            time.sleep(30)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "watchdog: a train step has not finished in" in result.stderr
    assert "Known issue: example diagnosis" in result.stderr
    assert "Thread" in result.stderr  # all threads' stacks follow
