"""Two processes x 2 CPU devices: resuming (as 2 processes, or as 1 with 4 devices), SIGTERM, a lost process."""

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import DistributedCartpoleTask, distributed_cartpole_config
from test_multiprocess import start_workers

from ksim.task.processes import LOST_PROCESS_EXIT_CODE

STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    yield
    for process in STARTED:
        if process.poll() is None:
            process.kill()
            process.communicate()
    STARTED.clear()


def start(run_dir: Path, *overrides: str) -> list[subprocess.Popen[str]]:
    """Both processes of one run (overrides as key=value)."""
    processes = start_workers(run_dir, *overrides, env={"PYTHONUNBUFFERED": "1"})
    STARTED.extend(processes)
    return processes


def finish(processes: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output
    return outputs


def wait_for_line(processes: list[subprocess.Popen[str]], pattern: str, seen: list[str]) -> None:
    """Reads process 0's output until a line matches `pattern` (lines kept in `seen`); kills both after 300 s."""
    stdout = processes[0].stdout
    assert stdout is not None

    def kill_all() -> None:
        for process in processes:
            process.kill()

    deadline = threading.Timer(300, kill_all)
    deadline.start()
    try:
        for line in stdout:
            seen.append(line)
            if re.search(pattern, line):
                return
    finally:
        deadline.cancel()
    raise AssertionError("".join(seen))


def shared_params(task: DistributedCartpoleTask, path: Path) -> tuple[int, list[np.ndarray]]:
    loaded = task.checkpoints.load(path)
    return int(loaded["step"]), [np.asarray(leaf) for leaf in jax.tree.leaves(loaded["shared"])]


def test_resume_as_two_processes_and_as_one_with_four_devices(tmp_path: Path) -> None:
    finish(start(tmp_path / "first", "num_steps=2"))
    checkpoint = tmp_path / "first" / "checkpoints" / "ckpt_latest.bin"
    outputs = finish(start(tmp_path / "again", "num_steps=4", f"load_from_ckpt_path={checkpoint}"))
    assert "step 3/4" in outputs[0] and "step 1/4" not in outputs[0]  # continues from the checkpoint's step

    one = DistributedCartpoleTask(
        distributed_cartpole_config(
            num_devices=4, num_steps=4, load_from_ckpt_path=str(checkpoint), run_dir=str(tmp_path / "one")
        )
    )
    one.run()
    step, expected = shared_params(one, tmp_path / "one" / "checkpoints" / "ckpt_latest.bin")
    got_step, got = shared_params(one, tmp_path / "again" / "checkpoints" / "ckpt_latest.bin")
    assert step == got_step == 4
    for got_leaf, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(got_leaf, want, rtol=1e-5, atol=1e-6)


def test_sigterm_stops_every_process_after_the_same_step(tmp_path: Path) -> None:
    processes = start(tmp_path, "num_steps=100000", "log_every_n_steps=1")
    seen: list[str] = []
    wait_for_line(processes, r"step 2/", seen)
    processes[0].send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the processes receive it at different steps
    processes[1].send_signal(signal.SIGTERM)
    outputs = finish(processes)
    outputs[0] = "".join(seen) + outputs[0]
    steps = [re.findall(r"stopped after step (\d+)", output) for output in outputs]
    assert len(steps[0]) == 1 and steps[0] == steps[1], outputs
    task = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4))
    step, _ = shared_params(task, tmp_path / "checkpoints" / "ckpt_latest.bin")
    assert step == int(steps[0][0])
    assert f"ckpt_{step:08d}.bin" in outputs[0]


def test_a_lost_process_stops_the_others_with_one_line(tmp_path: Path) -> None:
    processes = start(
        tmp_path, "num_steps=100000", "log_every_n_steps=1", "save_every_n_steps=2", "heartbeat_timeout_s=10"
    )
    seen: list[str] = []
    wait_for_line(processes, r"step 3/", seen)
    processes[1].kill()
    killed_at = time.monotonic()
    output = "".join(seen) + processes[0].communicate(timeout=120)[0]
    stopped_s = time.monotonic() - killed_at
    processes[1].communicate()
    assert processes[0].returncode == LOST_PROCESS_EXIT_CODE, output
    assert stopped_s < 20, output  # ksim declares it lost after 10 s, JAX would abort after 30 s
    lines = [line for line in output.splitlines() if line.startswith("ksim: lost process")]
    assert len(lines) == 1 and lines[0].startswith("ksim: lost process 1 "), output
    assert "Check failure" not in output and "terminate called" not in output
    path = Path(re.search(r"load_from_ckpt_path=(\S+) \(step (\d+)\)", lines[0]).group(1))  # type: ignore[union-attr]
    task = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4))
    step, _ = shared_params(task, path)
    assert step >= 2 and step % 2 == 0
    print(f"survivor stopped {stopped_s:.1f} s after its peer was killed: {lines[0]}")
