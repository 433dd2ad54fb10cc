"""tests/run_files.sh, which `make test` runs: every file in a process of its own, and any failing file fails it."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "run_files.sh"
ALONE = re.findall(r"tests/test_\w+\.py", RUNNER.read_text().split("ALONE=(", 1)[1].split(")", 1)[0])


PASS = "def test_ok():\n    pass\n"
HEADER = re.compile(r"^== (\S+) \(\d+ s\)$", re.MULTILINE)


def run_tree(
    root: Path, files: dict[str, str], jobs: int = 2, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs a copy of the runner, `jobs` files at a time, on a tree whose tests/ holds `files` (a durations.txt
    among them) and a passing stand-in for each ALONE file."""
    (root / "tests").mkdir()
    shutil.copy(RUNNER, root / "tests" / "run_files.sh")
    for name in ALONE:
        (root / name).write_text(PASS)
    for name, text in files.items():
        (root / "tests" / name).write_text(text)
    return subprocess.run(
        ["bash", str(root / "tests" / "run_files.sh"), str(jobs)],
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failing_file_fails_the_run_and_is_named(tmp_path: Path) -> None:
    files = {f"test_pass_{i}.py": PASS for i in range(3)}
    files["test_broken.py"] = "def test_broken():\n    assert 1 == 2\n"
    result = run_tree(tmp_path, files)
    assert result.returncode == 1, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "FAILED: tests/test_broken.py"
    headers = HEADER.findall(result.stdout)
    assert sorted(headers) == sorted([f"tests/{name}" for name in files] + ALONE)  # each file's output, once
    assert headers[-len(ALONE) :] == ALONE  # the timing-sensitive files after the others, in order


def test_a_passing_tree_passes(tmp_path: Path) -> None:
    result = run_tree(tmp_path, {f"test_pass_{i}.py": PASS for i in range(2)})
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "all test files passed"


def test_files_start_longest_first_by_their_recorded_seconds(tmp_path: Path) -> None:
    durations = "50 tests/test_long.py\n5 tests/test_short.py\n"  # test_new.py is not in it: it starts first
    files = {"test_short.py": PASS, "test_long.py": PASS, "test_new.py": PASS, "durations.txt": durations}
    result = run_tree(tmp_path, files, jobs=1)
    assert result.returncode == 0, result.stdout
    order = ["tests/test_new.py", "tests/test_long.py", "tests/test_short.py"]
    assert HEADER.findall(result.stdout) == order + ALONE


def test_recording_writes_every_files_seconds_longest_first(tmp_path: Path) -> None:
    files = {"test_quick.py": PASS, "test_slow.py": "import time\n\n\ndef test_slow():\n    time.sleep(2)\n"}
    result = run_tree(tmp_path, files, env={"RECORD_DURATIONS": "1"})
    assert result.returncode == 0, result.stdout
    rows = [line.split() for line in (tmp_path / "tests" / "durations.txt").read_text().splitlines()]
    assert sorted(file for _, file in rows) == sorted([f"tests/{name}" for name in files] + ALONE)
    assert rows[0][1] == "tests/test_slow.py" and int(rows[0][0]) >= 2
    assert [int(seconds) for seconds, _ in rows] == sorted((int(seconds) for seconds, _ in rows), reverse=True)
