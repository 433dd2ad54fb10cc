"""DistributedRLTask: the RLTask programs under `jax.pmap`, envs sharded and shared state replicated.

Nothing here re-implements a rollout or an update: `compile` turns the same per-shard functions into
pmapped programs, and the cross-device hooks become collectives over `pmap_axis_name`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import numpy as np
import xax

from ksim.config import ConfigError, require_choice, require_divisible, require_non_negative
from ksim.task import processes
from ksim.task.devices import (
    LeafDivergence,
    find_divergences,
    get_device_info,
    lapack_parallel_batch_threshold,
    make_broadcast_from_first,
    make_replica_check,
    put_sharded,
    replicate,
    split_keys_per_device,
    unreplicate,
)
from ksim.task.processes import ManyProcesses, StopVote, Timeouts, check_timeouts
from ksim.task.programs import AheadOfTimeProgram
from ksim.task.rl import Program, RLConfig, RLTask, TrainState
from ksim.xla_setup import cpu_thread_pool_size, lapack_splits_batches

Array = jax.Array


@dataclass
class DistributedRLConfig(RLConfig):
    pmap_axis_name: str = xax.field("i", help="Name of the pmap axis that collectives reduce over.")
    grad_sync_period: int = xax.field(
        1, help="1: average gradients every minibatch. k>1: local SGD, average params every k train steps."
    )
    num_devices: int | None = xax.field(None, help="Devices to use in each process (default: all local ones).")
    consistency_check_every_n_steps: int = xax.field(
        100, help="Check that replicated state is identical on every device every N steps (0 disables)."
    )
    consistency_tolerance: float = xax.field(0.0, help="Largest allowed |replica - device 0| difference.")
    on_divergence: str = xax.field("raise", help="'raise' or 'resync' (copy device 0's state and warn).")
    debug: bool = xax.field(False, help="Print per-device loss, grad norm and episode stats (jax.debug.print).")
    cluster: str = xax.field(
        "auto",
        help="Several machines started by a cluster launcher: 'auto' joins the SLURM (srun) or Open MPI (mpirun) job "
        "this process runs in, found by jax.distributed's cluster detection; 'slurm' or 'ompi' only that one; 'none' "
        "never. coordinator_address, when set, wins.",
    )
    coordinator_address: str = xax.field(
        "", help="Several machines: host:port of process 0 (empty: one process, or the cluster's job)."
    )
    num_processes: int = xax.field(1, help="Several machines: how many processes take part.")
    process_id: int = xax.field(0, help="Several machines: this process's index, 0 .. num_processes - 1.")
    heartbeat_timeout_s: int = xax.field(
        60, help="Several machines: a process silent this long is declared lost and the others stop."
    )
    initialization_timeout_s: int = xax.field(300, help="Several machines: how long to wait for every process to join.")
    shutdown_timeout_s: int = xax.field(300, help="Several machines: how long a finished process waits for the others.")
    startup_timeout_s: int = xax.field(
        3600, help="Several machines: how long to wait for every process to load and compile before training."
    )


TIMEOUT_SETTINGS = ("heartbeat_timeout_s", "initialization_timeout_s", "shutdown_timeout_s", "startup_timeout_s")


def check_timeout_settings(config: DistributedRLConfig) -> None:
    check_timeouts({name: getattr(config, name) for name in TIMEOUT_SETTINGS})


def timeouts(config: DistributedRLConfig) -> Timeouts:
    return Timeouts(
        initialization=config.initialization_timeout_s,
        peer=config.heartbeat_timeout_s,
        shutdown=config.shutdown_timeout_s,
        startup=config.startup_timeout_s,
    )


DistributedConfigT = TypeVar("DistributedConfigT", bound=DistributedRLConfig)


class ReplicaDivergenceError(RuntimeError):
    """Replicated state differs between devices (or holds NaN/Inf) at a consistency check."""


class DistributedRLTask(RLTask[DistributedConfigT]):
    """Runs every per-shard program of RLTask on all devices in use (of every process) with `jax.pmap`."""

    def __init__(self, config: DistributedConfigT) -> None:
        self.join_processes(config)
        super().__init__(config)
        self.devices = self.devices_in_use()
        self._check_due = False
        if self.hang_hazard:
            raise ConfigError(self.hang_diagnosis())

    @staticmethod
    def join_processes(config: DistributedRLConfig) -> None:
        """Connects to the other processes (before JAX's backends start): those `coordinator_address` names, or
        else those of the cluster job this process runs in (`cluster`)."""
        if jax.distributed.is_initialized():
            return
        require_choice(config, "cluster", ("auto", "none", *processes.CLUSTERS))
        if config.coordinator_address:
            if config.num_processes < 1 or not 0 <= config.process_id < config.num_processes:
                rule = f"must be in 0 .. num_processes - 1 (num_processes={config.num_processes})"
                raise ConfigError(f"process_id={config.process_id} {rule}")
            check_timeout_settings(config)
            processes.join(config.coordinator_address, config.num_processes, config.process_id, timeouts(config))
            return
        if config.cluster == "none":
            return
        job = processes.detected_cluster_job(config.cluster, config.initialization_timeout_s)
        if job is None or job.num_processes == 1:
            return
        check_timeout_settings(config)
        print(job.line(), flush=True)
        processes.join(
            job.coordinator_address, job.num_processes, job.process_id, timeouts(config), job.local_device_ids
        )

    @property
    def num_local_devices(self) -> int:
        requested = self.config.num_devices
        return jax.local_device_count() if requested is None else requested

    @property
    def num_devices(self) -> int:
        """Devices in use over all processes."""
        return self.num_local_devices * jax.process_count()

    @property
    def envs_per_device(self) -> int:
        return self.config.num_envs // self.num_devices

    @property
    def axis_name(self) -> str:
        return self.config.pmap_axis_name

    def devices_in_use(self) -> list[jax.Device]:
        """The first `num_local_devices` devices of every process, in process order."""
        by_process: dict[int, list[jax.Device]] = {}
        for device in jax.devices():
            by_process.setdefault(device.process_index, []).append(device)
        return [device for process in sorted(by_process) for device in by_process[process][: self.num_local_devices]]

    def validate_config(self) -> None:
        super().validate_config()
        config = self.config
        _, _, available = get_device_info()
        if not 1 <= self.num_local_devices <= available:
            raise ConfigError(
                f"num_devices={self.num_local_devices} must be between 1 and the {available} local devices"
            )
        in_use = f"the {self.num_devices} devices in use"
        require_divisible("num_envs", config.num_envs, self.num_devices, in_use)
        require_divisible("batch_size", config.batch_size, self.num_devices, in_use)
        if config.grad_sync_period < 1:
            raise ConfigError(f"grad_sync_period={config.grad_sync_period} must be >= 1")
        if not config.pmap_axis_name.strip():
            raise ConfigError("pmap_axis_name must be a non-empty name")
        require_non_negative(config, "consistency_check_every_n_steps", "consistency_tolerance")
        require_choice(config, "on_divergence", ("raise", "resync"))
        check_timeout_settings(config)

    @property
    def hang_hazard(self) -> bool:
        """Whether this run meets jax >= 0.10's CPU LAPACK deadlock (README, "Known issue")."""
        return (
            jax.default_backend() == "cpu"
            and lapack_splits_batches()
            and self.num_local_devices >= cpu_thread_pool_size()
            and self.envs_per_device > lapack_parallel_batch_threshold(self.engine.mj_model.nv)
        )

    def hang_diagnosis(self) -> str:
        return (
            f"Known issue: with jax >= 0.10 on CPU, {self.num_local_devices} devices stepping MJX batches of more than "
            f"{lapack_parallel_batch_threshold(self.engine.mj_model.nv)} envs per device deadlock when the CPU "
            f"thread pool ({cpu_thread_pool_size()} threads) is not larger than the device count. Import ksim "
            f"before JAX starts (it sets PJRT_NPROC), or set PJRT_NPROC={self.num_local_devices + 1} yourself, or use "
            f"fewer envs per device, or one device: forced CPU devices share the same cores anyway."
        )

    # ----- the RLTask hooks, as collectives and device placement ------------------------------------------------

    def compile(self, fn: Callable[..., Any], donate_argnums: tuple[int, ...] = ()) -> Program:
        on_cpu = jax.default_backend() == "cpu"
        return jax.pmap(
            fn,
            axis_name=self.axis_name,
            devices=self.devices,
            donate_argnums=() if on_cpu else donate_argnums,
        )

    def cross_device_mean(self, tree: Any) -> Any:
        return jax.lax.pmean(tree, self.axis_name)

    def cross_device_sum(self, tree: Any) -> Any:
        return jax.lax.psum(tree, self.axis_name)

    def shard_env_offset(self, num_envs: int) -> Array:
        return jax.lax.axis_index(self.axis_name) * num_envs

    def place_replicated(self, tree: Any) -> Any:
        return replicate(tree, self.devices, self.axis_name)

    def place_env_keys(self, rng: Array) -> Array:
        keys = split_keys_per_device(rng, self.num_devices, self.envs_per_device)
        return put_sharded(keys, self.devices, self.axis_name)

    def fetch_replicated(self, tree: Any) -> Any:
        return unreplicate(tree)

    def debug_print(self, tag: str, values: dict[str, Array]) -> None:
        if not self.config.debug:
            return
        fields = " ".join(f"{name}={{{name}}}" for name in values)
        kwargs: dict[str, Any] = {"device": jax.lax.axis_index(self.axis_name), **values}
        jax.debug.print(f"[device {{device}}] {tag}: {fields}", **kwargs)

    def log_fields(self, env_steps_per_s: float) -> dict[str, float]:
        return {
            "env_steps_per_s": env_steps_per_s,
            "env_steps_per_s_per_device": env_steps_per_s / self.num_devices,
            "num_devices": float(self.num_devices),
        }

    # ----- local SGD and the replicated-state check ----------------------------------------------------------

    @functools.cached_property
    def _average_shared_program(self) -> Program:
        def average(state: TrainState) -> TrainState:
            shared = state.shared
            params, opt_state, average_params = jax.tree.map(
                lambda x: jax.lax.pmean(x, self.axis_name) if np.issubdtype(x.dtype, np.floating) else x,
                (shared.params, shared.opt_state, shared.average_params),
            )
            shared = shared.replace(params=params, opt_state=opt_state, average_params=average_params)
            return state.replace(shared=shared)

        return self.compile(average, donate_argnums=(0,))

    @functools.cached_property
    def _replica_check_program(self) -> Program:
        return make_replica_check(self.axis_name, self.devices)

    @functools.cached_property
    def _stop_vote_program(self) -> Program:
        return self.compile(lambda flag: jax.lax.psum(flag, self.axis_name))

    @functools.cached_property
    def process_hooks(self) -> ManyProcesses | None:
        """How the training loop coordinates with the other processes (None: this is the only one)."""
        if jax.process_count() == 1:
            return None
        vote = StopVote(self._stop_vote_program, self.devices, self.axis_name)
        return ManyProcesses(vote, timeouts(self.config))

    def ahead_of_time_programs(self, state: TrainState) -> dict[str, AheadOfTimeProgram]:
        """Also the replica check, the local-SGD average and the stop vote, so nothing compiles mid-training."""
        programs = super().ahead_of_time_programs(state)
        if self.process_hooks is not None:
            flags = self.process_hooks.vote.flags(False)
            programs["stop_vote"] = ("stop vote", lambda: self._stop_vote_program.lower(flags))
        if self.config.consistency_check_every_n_steps:
            tree = {"shared": state.shared, "rng": state.rng}
            programs["replica_check"] = ("replica check", lambda: self._replica_check_program.lower(tree))
        if self.config.grad_sync_period > 1:
            programs["average"] = ("local-SGD average", lambda: self._average_shared_program.lower(state))
        return programs

    def is_sync_point(self, step: int) -> bool:
        return step % self.config.grad_sync_period == 0

    def after_train_step(self, state: TrainState, step: int) -> TrainState:
        if self.config.grad_sync_period > 1 and self.is_sync_point(step):
            state = self.programs.get("average", self._average_shared_program)(state)
        period = self.config.consistency_check_every_n_steps
        self._check_due = self._check_due or (period > 0 and step % period == 0)
        if self._check_due and self.is_sync_point(step):  # between sync points replicas differ by design
            self._check_due = False
            state = self.check_replicas(state, step)
        return state

    @functools.cached_property
    def _broadcast_program(self) -> Program:
        return make_broadcast_from_first(self.axis_name, self.devices)

    def replica_divergences(self, state: TrainState) -> list[LeafDivergence]:
        """Leaves whose copies differ from device 0's (or hold NaN/Inf), over every device in use."""
        check = self.programs.get("replica_check", self._replica_check_program)
        diffs, non_finite = check({"shared": state.shared, "rng": state.rng})
        # All-gathered, so the first local replica holds every device's numbers.
        diffs, non_finite = self.fetch_replicated((diffs, non_finite))
        return find_divergences(diffs, non_finite, self.config.consistency_tolerance)

    def check_replicas(self, state: TrainState, step: int) -> TrainState:
        """Raises, or with on_divergence='resync' copies device 0's replicated state to all devices."""
        divergences = self.replica_divergences(state)
        if not divergences:
            return state
        listed = "; ".join(d.describe() for d in divergences[:8])
        more = f" (and {len(divergences) - 8} more)" if len(divergences) > 8 else ""
        message = f"replicated state diverged at step {step}: {listed}{more}"
        if self.config.on_divergence == "raise":
            raise ReplicaDivergenceError(message)
        warnings.warn(f"{message}; resynchronising from device 0", stacklevel=2)
        shared, rng = self._broadcast_program((state.shared, state.rng))
        return state.replace(shared=shared, rng=rng)
