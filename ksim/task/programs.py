"""A task's device programs by name: compiled on first use, or ahead of time with the compile report.

`Programs` takes the task's `compile` (jax.jit on one device, jax.pmap in DistributedRLTask) and the per-shard
functions it turns into programs; it knows nothing else of the task.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax

Program = Any  # a jitted or pmapped function: callable, and `.lower(...)` compiles it ahead of time
# How a task turns a per-shard function into a program: (function, donated argument numbers) -> program.
Compile = Callable[[Callable[..., Any], tuple[int, ...]], Program]
# A program to compile ahead of time: (what the log calls it, a function that traces and lowers it).
AheadOfTimeProgram = tuple[str, Callable[[], Any]]

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"


class CacheEvents:
    """Counts persistent-compilation-cache hits and misses reported through `jax.monitoring`, per thread."""

    _instance: CacheEvents | None = None

    def __init__(self) -> None:
        self._counts: dict[int, list[int]] = {}  # thread id -> [hits, misses]
        jax.monitoring.register_event_listener(self._on_event)

    @classmethod
    def get(cls) -> CacheEvents:
        if cls._instance is None:  # listeners cannot be removed: register one per process
            cls._instance = cls()
        return cls._instance

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event in (CACHE_HIT_EVENT, CACHE_MISS_EVENT):  # reported on the thread that compiles
            counts = self._counts.setdefault(threading.get_ident(), [0, 0])
            counts[event == CACHE_MISS_EVENT] += 1

    def this_thread(self) -> tuple[int, int]:
        """(hits, misses) so far on the calling thread."""
        hits, misses = self._counts.get(threading.get_ident(), (0, 0))
        return hits, misses


@dataclass(frozen=True)
class CompileReport:
    """One program compiled ahead of time: how long from the start of its tracing, and the cache's answers."""

    seconds: float
    cache_hits: int
    cache_misses: int

    def __str__(self) -> str:
        if not self.cache_hits and not self.cache_misses:
            return f"{self.seconds:.1f} s (cache off)"
        return f"{self.seconds:.1f} s (cache: {self.cache_hits} hit(s), {self.cache_misses} miss(es))"


def _compile(lowered: Any, started: float) -> tuple[Any, CompileReport]:
    events = CacheEvents.get()
    hits, misses = events.this_thread()
    compiled = lowered.compile()
    new_hits, new_misses = events.this_thread()
    return compiled, CompileReport(time.perf_counter() - started, new_hits - hits, new_misses - misses)


def compile_programs(programs: dict[str, AheadOfTimeProgram], verbose: bool) -> dict[str, Any]:
    """Compiles programs ahead of time: {name: (what the log calls it, a function lowering it)} -> {name: executable}.

    Tracing and lowering are Python and run here, one program after another; each program's XLA compile (or
    its load from the persistent cache) runs on a worker thread, which releases the GIL, so it overlaps the
    tracing of the programs after it. One line names them all, then one line per program says how long it
    took from the start of its tracing and what the cache had.
    """
    if verbose:
        print(f"compiling {', '.join(what for what, _ in programs.values())} ...", flush=True)
    with ThreadPoolExecutor(max_workers=max(len(programs), 1), thread_name_prefix="ksim-compile") as pool:
        futures = {}
        for name, (_, lower) in programs.items():
            started = time.perf_counter()
            futures[name] = pool.submit(_compile, lower(), started)
        executables = {}
        for name, future in futures.items():
            executables[name], report = future.result()
            if verbose:
                print(f"  {programs[name][0]}: {report}", flush=True)
    return executables


class Programs:
    """Per-shard functions as device programs: `programs[name]` is the one compiled ahead of time (`precompile`)
    where there is one, else the jit (or pmap, by `compile`) function, which compiles on its first call."""

    def __init__(
        self, compile: Compile, shard_functions: dict[str, tuple[Callable[..., Any], tuple[int, ...]]]
    ) -> None:
        self._compile = compile
        self._shard_functions = shard_functions  # name -> (function, donated argument numbers)
        self._programs: dict[str, Program] = {}
        self._ahead_of_time: dict[str, Program] = {}

    def __getitem__(self, name: str) -> Program:
        """The program `name`: the one `precompile` compiled, else the function (which compiles on first call)."""
        return self.get(name, self.function(name))

    def function(self, name: str) -> Program:
        """The jitted (or pmapped) function of `name`, whose `.lower(...)` compiles it ahead of time."""
        if name not in self._programs:
            function, donate_argnums = self._shard_functions[name]
            self._programs[name] = self._compile(function, donate_argnums)
        return self._programs[name]

    def get(self, name: str, fallback: Program) -> Program:
        """The ahead-of-time compiled program `name`, else `fallback` (which compiles on call).

        With several processes pmap's outputs are process-local arrays, which a compiled executable refuses;
        there `precompile` only fills the persistent cache and the call goes through pmap (tracing only).
        """
        if name in self._ahead_of_time and jax.process_count() == 1:
            return self._ahead_of_time[name]
        return fallback

    def precompile(self, programs: dict[str, AheadOfTimeProgram], verbose: bool = True) -> None:
        """Compiles `programs` before the first train step; `get` returns them from here on."""
        self._ahead_of_time |= compile_programs(programs, verbose)
