"""Two processes x 2 CPU devices train one policy, and match one process with 4 devices."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import DistributedCartpoleTask, distributed_cartpole_config

from ksim.task.processes import detected_cluster_job

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_worker(
    address: str, process_id: int, run_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Process `process_id` of one run of tests/multiprocess_worker.py (overrides as key=value)."""
    worker_env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "PJRT_NPROC")}
    worker_env |= {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", **(env or {})}
    worker = str(ROOT / "tests" / "multiprocess_worker.py")
    return subprocess.Popen(
        [sys.executable, worker, address, str(process_id), str(run_dir), *overrides],
        cwd=ROOT,
        env=worker_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def start_workers(run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """Processes 0 and 1 of one run of tests/multiprocess_worker.py (overrides as key=value)."""
    address = f"127.0.0.1:{free_port()}"
    return [start_worker(address, process_id, run_dir, *overrides, env=env) for process_id in (0, 1)]


@pytest.fixture(scope="module")
def one_process_reference() -> object:
    """The final shared state of the same run in one process with 4 devices."""
    reference = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4, num_steps=3))
    return reference.fetch_replicated(reference.run().shared)


def assert_trained_as_one(run_dir: Path, outputs: list[str], reference: object) -> None:
    assert "step 3/3" in outputs[0] and "step 3/3" not in outputs[1]  # only process 0 logs
    loaded = DistributedCartpoleTask(distributed_cartpole_config(num_devices=4)).checkpoints.load(
        run_dir / "checkpoints" / "ckpt_latest.bin"
    )
    assert int(loaded["step"]) == 3
    for got, want in zip(jax.tree.leaves(loaded["shared"]), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def finished(processes: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process_id, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, output
        assert f"process {process_id} done" in output
    return outputs


def test_two_processes_match_one_process_with_as_many_devices(tmp_path: Path, one_process_reference: object) -> None:
    processes = start_workers(tmp_path / "multi", env={"JAX_COMPILATION_CACHE_DIR": str(ROOT / ".jax_cache")})
    outputs = finished(processes)
    assert not (tmp_path / "multi" / "checkpoints" / "ckpt_latest.bin").is_symlink()
    assert_trained_as_one(tmp_path / "multi", outputs, one_process_reference)


def slurm_step(process_id: int, port: int) -> dict[str, str]:
    """What `srun --nodes=1 --ntasks=2` sets for task `process_id` (JAX_COORDINATOR_PORT: a port known free)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": str(process_id),
        "SLURM_LOCALID": str(process_id),
        "JAX_COORDINATOR_PORT": str(port),
    }


def test_processes_of_a_slurm_job_join_without_coordinator_settings(
    tmp_path: Path, one_process_reference: object
) -> None:
    port = free_port()
    processes = [
        start_worker(
            "cluster",
            process_id,
            tmp_path / "slurm",
            env={"JAX_COMPILATION_CACHE_DIR": str(ROOT / ".jax_cache"), **slurm_step(process_id, port)},
        )
        for process_id in (0, 1)
    ]
    outputs = finished(processes)
    for process_id, output in enumerate(outputs):
        line = f"ksim: joining the slurm job as process {process_id} of 2 (coordinator 127.0.0.1:{port}; found by"
        assert line in output
    assert_trained_as_one(tmp_path / "slurm", outputs, one_process_reference)


@pytest.mark.parametrize(
    ("tasks_per_node", "node", "expected", "device_ids"),
    [("1", "0", 1, []), ("2(x3),1", "3", 1, []), ("2(x3),1", "1", 2, None), ("4", "0", 4, None)],
)
def test_a_process_alone_on_its_node_takes_every_local_device(
    monkeypatch: pytest.MonkeyPatch, tasks_per_node: str, node: str, expected: int, device_ids: list[int] | None
) -> None:
    for name, value in {
        **slurm_step(0, 1234),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_NODEID": node,
    }.items():
        monkeypatch.setenv(name, value)
    job = detected_cluster_job("auto", 10)
    assert job is not None and (job.launcher, job.num_processes, job.tasks_on_this_node) == ("slurm", 2, expected)
    assert job.local_device_ids == device_ids  # [] is every device; None JAX's one device per local rank


def test_no_cluster_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
        monkeypatch.delenv(name, raising=False)
    assert detected_cluster_job("auto", 10) is None
