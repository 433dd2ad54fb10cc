"""The host side of training: the train-step loop, signals, the hang watchdog and compile reporting.

Everything on the device is `RLTask`'s; this module only dispatches its programs, logs and saves.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import jax

from ksim.reporting import MetricsLogger, window_scalars
from ksim.task.evaluation import EvalResult, summary_scalars
from ksim.task.programs import AheadOfTimeProgram, Programs
from ksim.task.run_checkpoints import RunCheckpoints, best_score, numbered_checkpoint
from ksim.task.types import RLConfig, SharedState, TrainState


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag so the loop can checkpoint before it exits.

    With `hold_sigterm` (several processes), a SIGTERM that arrives after the loop is ignored until the process
    exits: a scheduler signals every process, and one may get it after the others' signal already stopped it.
    """

    def __init__(self, hold_sigterm: bool = False) -> None:
        self.requested = False
        self.hold_sigterm = hold_sigterm
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            # A second Ctrl-C stops at once. A repeated SIGTERM does not: `timeout` and schedulers signal the
            # child and then its process group, so one stop can arrive twice within a millisecond.
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        print(f"\nreceived {signal.Signals(signum).name}: stopping after this step and saving", flush=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            held = self.hold_sigterm and signum == signal.SIGTERM
            signal.signal(signum, signal.SIG_IGN if held else handler)


class Watchdog:
    """Aborts with a diagnosis when one train step stays unfinished for `timeout_s`.

    The loop hands it each step's metrics right after dispatch (compilation has finished by then);
    a background thread polls `is_ready()`, so nothing blocks and nothing is transferred.
    """

    def __init__(self, timeout_s: float, diagnosis: Callable[[], str]) -> None:
        self.timeout_s = timeout_s
        self.diagnosis = diagnosis
        self._pending: deque[tuple[Any, float]] = deque()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, metrics: Any) -> None:
        if self.timeout_s > 0:
            with self._lock:
                self._pending.append((jax.tree.leaves(metrics)[0], time.monotonic()))

    def stalled_for(self) -> float:
        """Seconds the oldest unfinished step has been running (0 when none is)."""
        now, started = time.monotonic(), None
        with self._lock:
            while self._pending and self._pending[0][0].is_ready():
                self._pending.popleft()
                started = now  # the next step could only start once this one finished
            if not self._pending:
                return 0.0
            array, dispatched = self._pending[0]
            started = max(dispatched, started or dispatched)
            self._pending[0] = (array, started)
        return now - started

    def _watch(self) -> None:
        while not self._done.wait(min(2.0, self.timeout_s)):
            stalled = self.stalled_for()
            if stalled > self.timeout_s:
                print(
                    f"\nwatchdog: a train step has not finished in {stalled:.0f} s. {self.diagnosis()}",
                    file=sys.stderr,
                )
                faulthandler.dump_traceback(file=sys.stderr)
                sys.stderr.flush()
                os._exit(3)

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="ksim-watchdog")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        # Joined, not left to die with the interpreter: a daemon thread caught inside a JAX call at
        # shutdown aborts the process ("FATAL: exception not rethrown").
        if self._thread is not None:
            self._thread.join()


class TrainingTask(Protocol):
    """What the training loop asks of a task (`RLTask` is one)."""

    @property
    def config(self) -> RLConfig: ...
    @property
    def task_name(self) -> str: ...
    @property
    def env_steps_per_train_step(self) -> int: ...
    @property
    def process_hooks(self) -> ProcessHooks | None:
        """How to coordinate with the other processes (None: this is the only one)."""

    @property
    def programs(self) -> Programs: ...
    @property
    def checkpoints(self) -> RunCheckpoints: ...

    def ahead_of_time_programs(self, state: TrainState) -> dict[str, AheadOfTimeProgram]: ...
    def init_train_state(self, shared: SharedState | None = None, rng: jax.Array | None = None) -> TrainState: ...
    def train_step(self, state: TrainState) -> tuple[TrainState, dict[str, jax.Array]]: ...
    def after_train_step(self, state: TrainState, step: int) -> TrainState: ...
    def fetch_replicated(self, tree: Any) -> Any: ...
    def log_fields(self, env_steps_per_s: float) -> dict[str, float]: ...
    def evaluate(self, shared: SharedState) -> EvalResult: ...
    def evaluation_score(self, scalars: dict[str, float]) -> float: ...
    def hang_diagnosis(self) -> str: ...


@dataclass(frozen=True)
class Resume:
    """Where a run resumes from a checkpoint: its shared state, update key and counters."""

    shared: SharedState
    rng: jax.Array
    step: int
    env_steps: int

    @classmethod
    def from_contents(cls, contents: dict[str, Any]) -> Resume:
        return cls(contents["shared"], contents["rng"], int(contents["step"]), int(contents["env_steps"]))


def eval_due(config: RLConfig, step: int) -> bool:
    every = config.eval_every_n_steps
    return every > 0 and (step % every == 0 or step == config.num_steps)


def run_training(
    task: TrainingTask, run_dir: Path | None, logger: MetricsLogger, resume: Resume | None = None
) -> tuple[TrainState, int]:
    """Trains until `num_steps` train steps; checkpoints periodically, at the end and on Ctrl-C/SIGTERM.

    `run_dir` is the logging process's run folder (None on the others); returns the last state and the number
    of train steps this call ran.
    """
    config = task.config
    step, env_steps = (resume.step, resume.env_steps) if resume else (0, 0)
    if run_dir:
        print(f"{task.task_name}: writing to {run_dir}", flush=True)
    processes = task.process_hooks or ProcessHooks()
    checkpoints = LastCheckpoint(step, config.load_from_ckpt_path)
    checkpoints.run_dir = processes.start(run_dir, lambda: checkpoints.last)

    start_time = time.perf_counter()
    try:
        state = task.init_train_state(resume.shared if resume else None, resume.rng if resume else None)
        task.checkpoints.metadata  # noqa: B018 -- the observation layout is traced once, here, not at the first save
        task.programs.precompile(task.ahead_of_time_programs(state), verbose=run_dir is not None)
    except BaseException:
        processes.leave()
        raise
    if run_dir:
        print(f"startup and compilation: {time.perf_counter() - start_time:.1f} s", flush=True)
    start_step, window = step, []  # window: metrics of the steps since the last log line, still on device
    best = BestEvaluation(task, run_dir) if run_dir else None
    watchdog = Watchdog(config.watchdog_timeout_s, task.hang_diagnosis)
    with GracefulStop(hold_sigterm=jax.process_count() > 1) as stop, watchdog:
        try:
            processes.wait_for_others()
            loop_start = last_log_time = time.perf_counter()
            last_log_env_steps, eval_seconds = env_steps, 0.0  # evaluation time is kept out of the throughput
            while step < config.num_steps and not processes.agree_to_stop(stop.requested):
                with jax.transfer_guard("disallow"):
                    state, metrics = task.train_step(state)
                watchdog.track(metrics)
                window.append(metrics)
                step += 1
                env_steps += task.env_steps_per_train_step
                state = task.after_train_step(state, step)
                if step % config.log_every_n_steps == 0 or step in (start_step + 1, config.num_steps):
                    scalars = window_scalars(task.fetch_replicated(window))
                    window = []
                    now = time.perf_counter()
                    train_seconds = now - last_log_time - eval_seconds
                    scalars |= task.log_fields((env_steps - last_log_env_steps) / max(train_seconds, 1e-9))
                    eta_s = (now - loop_start) / max(step - start_step, 1) * (config.num_steps - step)
                    if run_dir:
                        logger.log(step, config.num_steps, env_steps, scalars, eta_s)
                    last_log_time, last_log_env_steps, eval_seconds = now, env_steps, 0.0
                if eval_due(config, step):
                    eval_start = time.perf_counter()
                    eval_scalars = summary_scalars(task.evaluate(task.fetch_replicated(state.shared)))
                    eval_seconds += time.perf_counter() - eval_start
                    if run_dir:
                        logger.log_eval(step, env_steps, eval_scalars)
                    if best:
                        best.consider(state, step, env_steps, eval_scalars)
                if config.save_every_n_steps and step % config.save_every_n_steps == 0:
                    checkpoints.saved(step, task.checkpoints.save(run_dir, state, step, env_steps) if run_dir else None)
            if step > start_step:  # normal end, or stopped by SIGINT/SIGTERM
                if step < config.num_steps and jax.process_count() > 1:  # every process stops here
                    print(f"process {jax.process_index()}: stopped after step {step}", flush=True)
                if run_dir:
                    print(f"saved checkpoint {task.checkpoints.save(run_dir, state, step, env_steps)}", flush=True)
            processes.finished()
        except jax.errors.JaxRuntimeError as error:
            processes.on_runtime_error(error)
            raise
        finally:
            processes.leave()
            logger.close()
    return state, step - start_step


class ProcessHooks:
    """What the loop asks of the other processes; with one process there is nothing to ask.

    `DistributedRLTask.process_hooks` answers for several processes (ksim.task.processes).
    """

    def start(self, run_dir: Path | None, checkpoint: Callable[[], tuple[int, str]]) -> Path | None:
        """Process 0's run folder, on every process; from here on a lost process stops the others, naming
        `checkpoint()`, the newest checkpoint."""
        return run_dir

    def wait_for_others(self) -> None:
        """Returns once every process is ready to launch the first train step."""

    def finished(self) -> None:
        """This process ended its train steps (all of them, or stopped by a signal), not by an error."""

    def leave(self) -> None:
        """This process stops watching the others (after `finished`, or on an error)."""

    def agree_to_stop(self, requested: bool) -> bool:
        """Whether to stop before the next step (SIGINT/SIGTERM), the same answer on every process."""
        return requested

    def on_runtime_error(self, error: BaseException) -> None:
        """Called when a device program failed; returning re-raises the error."""


class BestEvaluation:
    """Keeps the checkpoint of the run's best evaluation as ckpt_best.bin (on the process that writes the run):
    evaluations swing between train steps, and the one to deploy is the best one, not the last."""

    def __init__(self, task: TrainingTask, run_dir: Path) -> None:
        self.task, self.run_dir = task, run_dir
        self.score = best_score(run_dir)

    def consider(self, state: TrainState, step: int, env_steps: int, scalars: dict[str, float]) -> None:
        """Saves this train step's checkpoint as the best if its evaluation scores higher than every earlier one."""
        score = self.task.evaluation_score(scalars)
        if self.score is not None and score <= self.score:
            return
        self.score = score
        path = self.task.checkpoints.save_best(self.run_dir, state, step, env_steps, {"score": score, **scalars})
        print(f"best evaluation so far (score {score:.4g}): {path}", flush=True)


class LastCheckpoint:
    """The newest checkpoint of this run, known on every process: (step, path; "" before the first one).

    Only process 0 writes; the others know its folder (`ProcessHooks.start`) and that every process saves
    at the same steps, so they can name it too.
    """

    def __init__(self, step: int, path: str) -> None:
        self.run_dir: Path | None = None
        self.last = (step, path)

    def saved(self, step: int, path: Path | None) -> None:
        if path is None and self.run_dir is not None:
            path = numbered_checkpoint(self.run_dir, step)
        self.last = (step, str(path or ""))
