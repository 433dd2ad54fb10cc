"""Two processes x 2 CPU devices train one policy, and match one process with 4 devices."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
from helpers import DistributedCartpoleTask, distributed_cartpole_config

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_workers(run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """Processes 0 and 1 of one run of tests/multiprocess_worker.py (overrides as key=value)."""
    address = f"127.0.0.1:{free_port()}"
    worker_env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    worker_env |= {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", **(env or {})}
    worker = str(ROOT / "tests" / "multiprocess_worker.py")
    return [
        subprocess.Popen(
            [sys.executable, worker, address, str(process_id), str(run_dir), *overrides],
            cwd=ROOT,
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for process_id in (0, 1)
    ]


def test_two_processes_match_one_process_with_as_many_devices(tmp_path: Path) -> None:
    processes = start_workers(tmp_path / "multi", env={"JAX_COMPILATION_CACHE_DIR": str(ROOT / ".jax_cache")})
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process_id, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, output
        assert f"process {process_id} done" in output
    assert "step 3/3" in outputs[0] and "step 3/3" not in outputs[1]  # only process 0 logs
    assert not (tmp_path / "multi" / "checkpoints" / "ckpt_latest.bin").is_symlink()

    reference = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4, num_steps=3))
    expected = reference.fetch_replicated(reference.run().shared)
    loaded = reference.checkpoints.load(tmp_path / "multi" / "checkpoints" / "ckpt_latest.bin")
    assert int(loaded["step"]) == 3
    for got, want in zip(jax.tree.leaves(loaded["shared"]), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
