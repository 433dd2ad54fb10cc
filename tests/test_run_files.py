"""tests/run_files.sh, which `make test` runs: every file in a process of its own, and any failing file fails it."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "run_files.sh"
ALONE = re.findall(r"tests/test_\w+\.py", RUNNER.read_text().split("ALONE=(", 1)[1].split(")", 1)[0])


def run_tree(root: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs a copy of the runner on a tree whose tests/ holds `files` and a passing stand-in for each ALONE file."""
    (root / "tests").mkdir()
    shutil.copy(RUNNER, root / "tests" / "run_files.sh")
    for name in ALONE:
        (root / name).write_text("def test_alone():\n    pass\n")
    for name, text in files.items():
        (root / "tests" / name).write_text(text)
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(root / "tests" / "run_files.sh"), "2"], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_failing_file_fails_the_run_and_is_named(tmp_path: Path) -> None:
    files = {f"test_pass_{i}.py": "def test_ok():\n    pass\n" for i in range(3)}
    files["test_broken.py"] = "def test_broken():\n    assert 1 == 2\n"
    result = run_tree(tmp_path, files)
    assert result.returncode == 1, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "FAILED: tests/test_broken.py"
    headers = re.findall(r"^== (\S+)$", result.stdout, re.MULTILINE)
    assert sorted(headers) == sorted([f"tests/{name}" for name in files] + ALONE)  # each file's output, once
    assert headers[-len(ALONE) :] == ALONE  # the timing-sensitive files after the others, in order


def test_a_passing_tree_passes(tmp_path: Path) -> None:
    result = run_tree(tmp_path, {f"test_pass_{i}.py": "def test_ok():\n    pass\n" for i in range(2)})
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "all test files passed"
