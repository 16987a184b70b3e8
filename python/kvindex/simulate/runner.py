"""Runs a report's replays — theoretical maximum, ceilings, scheduled runs — on several cores.

Every replay is independent (its own cache, its own exact matcher) and deterministic, so the
replays of one ``kvindex simulate`` invocation run in separate processes, one replay per
process at a time, and the figures are the same whatever the number of processes. Workers
are forked after the workload is built, so they inherit it instead of receiving a copy; where
``fork`` is not available the replays run one after another in this process. Progress
(finished requests) comes back through a shared counter.

The measured index times of parallel runs share the machine with each other; they are the
only figures that depend on ``jobs``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvindex.simulate.ledger import HitTally
from kvindex.simulate.progress import Progress
from kvindex.simulate.reference import replay_in_order, theoretical_max
from kvindex.simulate.scheduler import RunResult, RunSpec, simulate_run
from kvindex.simulate.workloads import Workload

__all__ = ["Task", "default_jobs", "run_tasks"]


@dataclass(frozen=True)
class Task:
    """One replay: ``max`` (radix, page 1, in order, no losses), ``ceiling`` (a design in
    order, infinite pool) or ``run`` (the scheduled :class:`RunSpec`)."""

    kind: str
    design: str
    block_size: int
    spec: RunSpec | None = None
    cache_kw: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """What the progress bar shows."""
        if self.kind == "max":
            return "theoretical maximum (radix bs=1, inf, in order)"
        if self.kind == "ceiling":
            return f"ceiling {self.design} bs={self.block_size}"
        assert self.spec is not None
        return self.spec.label()

    def cost(self) -> float:
        """A rough relative cost, to start the slowest replays first: the hash chain at
        block size 1 hashes every token as a block; scheduled runs cost more than replays."""
        weight = {"max": 0.5, "ceiling": 1.0, "run": 1.5}[self.kind]
        return weight * (5.0 if self.design == "hash_chain" and self.block_size == 1 else 1.0)


def run_task(
    workload: Workload, task: Task, progress: Callable[[int], None] | None = None
) -> HitTally | RunResult:
    """Runs one task in this process."""
    if task.kind == "run":
        assert task.spec is not None
        return simulate_run(workload, task.spec, progress=progress)
    if task.kind == "max":
        return theoretical_max(workload, progress)
    return replay_in_order(
        workload, task.design, task.block_size, losses=False, progress=progress, **task.cache_kw
    )


def default_jobs(tasks: int) -> int:
    """One process per task, at most one per usable CPU core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks))


# Worker state, set in the parent before forking (inherited, never pickled).
_WORKLOAD: Workload | None = None
_COUNTER: Any = None


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the parent handles it (and terminates the
    # workers), so a worker must not turn it into a task result and carry on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_progress(n: int) -> None:
    with _COUNTER.get_lock():
        _COUNTER.value += n


def _worker(task: Task) -> HitTally | RunResult:
    assert _WORKLOAD is not None
    return run_task(_WORKLOAD, task, _worker_progress)


def run_tasks(
    workload: Workload, tasks: list[Task], *, jobs: int, progress: Progress | None = None
) -> list[HitTally | RunResult]:
    """Results of ``tasks`` in their order; ``jobs > 1`` runs them in forked processes.

    An exception in a task (or Ctrl-C) terminates the workers and is raised here.
    """
    global _WORKLOAD, _COUNTER
    advance = progress.advance if progress is not None else None
    if jobs <= 1 or len(tasks) <= 1 or "fork" not in mp.get_all_start_methods():
        out: list[HitTally | RunResult] = []
        for i, t in enumerate(tasks, 1):
            if progress is not None:
                progress.set_label(f"{i}/{len(tasks)} {t.label()}")
            out.append(run_task(workload, t, advance))
        return out
    ctx = mp.get_context("fork")
    _WORKLOAD = workload
    _COUNTER = ctx.Value("q", 0)
    procs = min(jobs, len(tasks))
    pool = ctx.Pool(procs, initializer=_worker_init)
    try:
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cost())
        pending = {i: pool.apply_async(_worker, (tasks[i],)) for i in order}
        results: dict[int, HitTally | RunResult] = {}
        seen = 0
        while pending:
            next(iter(pending.values())).wait(0.1)
            for i in [i for i, r in pending.items() if r.ready()]:
                results[i] = pending.pop(i).get()  # raises the task's exception
            if progress is not None:
                progress.set_label(f"{len(results)}/{len(tasks)} replays done, {procs} processes")
                value = int(_COUNTER.value)
                progress.advance(value - seen)
                seen = value
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _WORKLOAD = None
        _COUNTER = None
    return [results[i] for i in range(len(tasks))]
