"""Several processes: joining them, agreeing when to stop, and stopping cleanly when one is lost.

Every process must launch the same collectives in the same order. Work only one process does (loading,
compiling on a cache miss, making the run folder) takes different times, so the processes meet at a
barrier before the first collective; a stop request (SIGTERM arrives at slightly different steps in each
process) becomes a vote that every process reads at the same step.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import jax
import numpy as np
from jax._src import distributed as jax_distributed

from ksim.config import ConfigError
from ksim.task.devices import device_axis_sharding, unreplicate
from ksim.task.loop import ProcessHooks

Array = jax.Array

# Exit status of a process that stopped because another one was lost (EX_TEMPFAIL: resuming is the fix).
LOST_PROCESS_EXIT_CODE = 75
KEY_PREFIX = "ksim"


@dataclass(frozen=True)
class Timeouts:
    """Seconds: joining, a silent process declared lost (by ksim), leaving, waiting for the others at startup."""

    initialization: int
    peer: int
    shutdown: int
    startup: int

    @property
    def jax_heartbeat(self) -> int:
        """JAX's own heartbeat timeout, a backstop: it aborts the process, so ksim's monitor must act first."""
        return 2 * self.peer + 10


def check_timeouts(settings: dict[str, float]) -> None:
    """ConfigError naming the first timeout that is not a whole number of seconds >= 1."""
    for name, value in settings.items():
        if value < 1 or value != int(value):
            raise ConfigError(f"{name}={value} must be a whole number of seconds >= 1")


def join(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    timeouts: Timeouts,
    local_device_ids: list[int] | None = None,
) -> None:
    """Connects this process to the others (before JAX's backends start), with ksim's timeouts."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        local_device_ids,
        initialization_timeout=timeouts.initialization,
        heartbeat_timeout_seconds=timeouts.jax_heartbeat,
        shutdown_timeout_seconds=timeouts.shutdown,
    )


CLUSTERS = ("slurm", "ompi")  # the launchers whose jobs a process joins on its own (JAX's names for them)


@dataclass(frozen=True)
class ClusterJob:
    """This process's place in a job a cluster launcher started, as JAX's own cluster detection reads it."""

    launcher: str  # "slurm" or "ompi"
    coordinator_address: str
    num_processes: int
    process_id: int
    tasks_on_this_node: int | None  # None where the launcher does not say

    @property
    def local_device_ids(self) -> list[int] | None:
        """[] (every local device) where the node runs this process alone, as ksim runs one process a machine;
        None (JAX's rule: the device of the process's local rank) where it runs several."""
        return [] if self.tasks_on_this_node == 1 else None

    def line(self) -> str:
        return (
            f"ksim: joining the {self.launcher} job as process {self.process_id} of {self.num_processes} "
            f"(coordinator {self.coordinator_address}; found by jax.distributed's cluster detection)"
        )


def detected_cluster_job(launcher: str, timeout_s: int) -> ClusterJob | None:
    """The SLURM or Open MPI job this process runs in (`launcher`: "auto" for either), if any; None otherwise."""
    from jax._src import clusters  # JAX's own detection: the variables srun and mpirun set

    names = CLUSTERS if launcher == "auto" else (launcher,)
    found = [env for env in clusters.ClusterEnv._cluster_types if env.name in names and env.is_env_present()]
    if not found:
        return None
    env = found[0]
    return ClusterJob(
        env.name,
        env.get_coordinator_address(
            timeout_secs=timeout_s, override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT")
        ),
        env.get_process_count(),
        env.get_process_id(),
        _tasks_on_this_node(env.name),
    )


def _tasks_on_this_node(launcher: str) -> int | None:
    """How many of the job's processes run on this node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1": this node's
    entry by SLURM_NODEID) or Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE."""
    if launcher == "ompi":
        size = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
        return int(size) if size.isdigit() else None
    counts = []
    for entry in os.environ.get("SLURM_STEP_TASKS_PER_NODE", os.environ.get("SLURM_TASKS_PER_NODE", "")).split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", entry.strip())
        if match is None:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    node = int(os.environ.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else None


def client() -> Any:
    """JAX's client of the coordination service (its key-value store and barriers)."""
    found = jax_distributed.global_state.client
    if found is None:
        raise RuntimeError("jax.distributed is not initialized")
    return found


def wait_for_all(name: str, timeout_s: float) -> None:
    """Returns once every process has reached the barrier `name` (raises after `timeout_s`)."""
    client().wait_at_barrier(f"{KEY_PREFIX}/{name}", int(timeout_s * 1000))


def share_from_first(name: str, value: str, timeout_s: float) -> str:
    """Process 0's `value` on every process (through the coordination service's key-value store)."""
    key = f"{KEY_PREFIX}/{name}"
    if jax.process_index() == 0:
        client().key_value_set(key, value)
        return value
    return str(client().blocking_key_value_get(key, int(timeout_s * 1000)))


def first_line(error: BaseException) -> str:
    """The gist of a runtime error: its first line without XLA's status prefixes."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^(\w+: )?(Buffer Definition Event: )?", "", text)[:200]


def lost_process_message(lost: Sequence[int], cause: str, checkpoint: tuple[int, str]) -> str:
    """One line: who was lost, why this process noticed, and the checkpoint every process resumes from."""
    who = ", ".join(str(index) for index in lost) or "unknown"
    step, path = checkpoint
    resume = (
        f"Resume every process with load_from_ckpt_path={path} (step {step})"
        if path
        else "No checkpoint was written yet: start again."
    )
    return f"ksim: lost process {who} ({cause}); process {jax.process_index()} stops. {resume}"


def exit_after_lost_process(message: str) -> NoReturn:
    """Prints the one line and leaves at once: JAX's own shutdown would wait for (and abort on) the lost one.

    Nothing is lost by leaving this way: the metrics are flushed line by line and checkpoints are renamed
    into place whole (ksim.checkpoint).
    """
    sys.stdout.flush()
    print(message, flush=True)
    sys.stderr.flush()
    os._exit(LOST_PROCESS_EXIT_CODE)


class StopVote:
    """Whether any process asked to stop, decided the same way on every process.

    Each call launches this step's vote (a psum of one flag per device) and returns the previous call's
    result, so reading it never waits for the step just dispatched; every process reads the same vote at
    the same call, so all stop after the same step.
    """

    def __init__(self, program: Callable[[Array], Array], devices: Sequence[jax.Device], axis_name: str) -> None:
        self.program = program
        self.devices = list(devices)
        self.axis_name = axis_name
        self._pending: Array | None = None

    def flags(self, requested: bool) -> Array:
        """One int32 flag per device in use, this process's own on its devices."""
        local = [d for d in self.devices if d.process_index == jax.process_index()]
        shards = [jax.device_put(np.full((1,), int(requested), np.int32), device) for device in local]
        sharding = device_axis_sharding(self.devices, self.axis_name)
        return jax.make_array_from_single_device_arrays((len(self.devices),), sharding, shards)

    def __call__(self, requested: bool) -> bool:
        previous, self._pending = self._pending, self.program(self.flags(requested))
        if previous is None:
            return False
        return bool(unreplicate(previous) > 0)


class PeerMonitor:
    """Declares a process lost when its beat stops, and stops this one with one line, before JAX would abort.

    A background thread bumps this process's counter in the coordination service's key-value store every
    `BEAT_S` and reads everyone's. A process whose counter stays put for `timeout_s` (`first_beat_s` before
    its first beat; unless it said it is done) is lost; when the store itself stops answering, process 0,
    which holds it, is the one lost.
    A collective with a dead peer may fail at once or hang, so the monitor and not the collective decides.
    """

    BEAT_S = 1.0

    def __init__(self, timeout_s: float, checkpoint: Callable[[], tuple[int, str]], first_beat_s: float) -> None:
        self.timeout_s = timeout_s
        self.first_beat_s = first_beat_s  # a process starts beating once it has loaded its task and checkpoint
        self.checkpoint = checkpoint
        self._seen: dict[int, tuple[str, float]] = {}  # process -> (its last counter, when it last changed)
        self._answered = time.monotonic()  # the last time the store answered
        self._beats = 0
        self._done = threading.Event()
        # Two threads: a call to the store can hang when process 0's machine is gone, the judge never does.
        self._threads = [
            threading.Thread(target=self._beat_until_done, daemon=True, name="ksim-peer-beat"),
            threading.Thread(target=self._judge_until_done, daemon=True, name="ksim-peer-monitor"),
        ]

    def start(self) -> None:
        now = time.monotonic()
        self._seen = {index: ("", now) for index in range(jax.process_count()) if index != jax.process_index()}
        self._answered = now
        for thread in self._threads:
            thread.start()

    def finished(self) -> None:
        """This process ended its train steps without an error: the others stop watching it."""
        with contextlib.suppress(Exception):
            client().key_value_set(f"{KEY_PREFIX}/done/{jax.process_index()}", "1", allow_overwrite=True)

    def stop(self) -> None:
        """This process stops watching (and beating: after an error, the others then report it lost)."""
        self._done.set()
        self._threads[1].join()  # the beat thread may sit in a store call that never returns; it is a daemon

    def _beat(self) -> None:
        """One round: bump our counter, then note whose counters moved (and who is done)."""
        self._beats += 1
        client().key_value_set(f"{KEY_PREFIX}/beat/{jax.process_index()}", str(self._beats), allow_overwrite=True)
        counters = dict(client().key_value_dir_get(f"{KEY_PREFIX}/beat/"))
        done = {key.rsplit("/", 1)[-1] for key, _ in client().key_value_dir_get(f"{KEY_PREFIX}/done/")}
        now = time.monotonic()
        seen = {}
        for index, (count, since) in self._seen.items():
            current = counters.get(f"{KEY_PREFIX}/beat/{index}", "")
            if str(index) not in done:
                seen[index] = (current, now) if current != count else (count, since)
        self._seen, self._answered = seen, now  # replaced whole: the judge reads them from its own thread

    def lost(self) -> list[int]:
        """Processes silent for longer than the timeout (process 0 when the store does not answer)."""
        now = time.monotonic()
        if now - self._answered > self.timeout_s:
            return [0]
        return [
            index
            for index, (count, since) in list(self._seen.items())
            if now - since > (self.timeout_s if count else self.first_beat_s)
        ]

    def _beat_until_done(self) -> None:
        while not self._done.wait(self.BEAT_S):
            with contextlib.suppress(Exception):  # the store is gone or slow: the judge decides after the timeout
                self._beat()

    def _judge_until_done(self) -> None:
        while not self._done.wait(self.BEAT_S):
            lost = self.lost()
            if lost and not self._done.is_set():
                silent = f"silent for {self.timeout_s:.0f} s"
                exit_after_lost_process(lost_process_message(lost, silent, self.checkpoint()))


class ManyProcesses(ProcessHooks):
    """The loop's questions answered across processes: one run folder, one start, one stop, a clear end."""

    def __init__(self, vote: StopVote, timeouts: Timeouts) -> None:
        self.vote = vote
        self.timeouts = timeouts
        self.monitor: PeerMonitor | None = None

    def start(self, run_dir: Path | None, checkpoint: Callable[[], tuple[int, str]]) -> Path | None:
        # Watched from before loading and compiling: a process lost there would otherwise leave the others
        # at the startup barrier until JAX aborts them.
        self.monitor = PeerMonitor(self.timeouts.peer, checkpoint, first_beat_s=self.timeouts.startup)
        self.monitor.start()
        shared = share_from_first("run_dir", str(run_dir or ""), self.timeouts.startup)
        return Path(shared) if shared else None

    def wait_for_others(self) -> None:
        # Process 0 may load every program from the persistent cache (JAX writes it from process 0 only)
        # while the others compile; the first collective would otherwise time out waiting for them.
        wait_for_all("ready", self.timeouts.startup)

    def finished(self) -> None:
        if self.monitor is not None:
            self.monitor.finished()

    def leave(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()

    def agree_to_stop(self, requested: bool) -> bool:
        return self.vote(requested)

    def on_runtime_error(self, error: BaseException) -> None:
        """A collective failed: when a peer is gone the monitor stops this process (waited for here)."""
        if self.monitor is None:
            return
        deadline = time.monotonic() + self.timeouts.peer + 2 * PeerMonitor.BEAT_S
        while time.monotonic() < deadline:
            time.sleep(PeerMonitor.BEAT_S)  # the monitor exits the process from its thread
        print(f"ksim: process {jax.process_index()}: a collective failed ({first_line(error)})", flush=True)
