"""``kvindex simulate``: replay workloads through both index designs and compare them.

Python API (the CLI is a thin layer over it)::

    from kvindex.simulate import RunSpec, chat_workload, parse_capacity, simulate_run

    wl = chat_workload(1000, seed=0)
    res = simulate_run(wl, RunSpec("radix", 1, parse_capacity("128k")))
    print(res.tally.hit_rate, res.evicted_blocks, res.waits)

Modules: :mod:`~kvindex.simulate.workloads` (requests, the chat generator),
:mod:`~kvindex.simulate.trace` (Mooncake JSONL), :mod:`~kvindex.simulate.seeds` (the
worked examples of the vLLM hash-chain and radix-tree design notes),
:mod:`~kvindex.simulate.capacity` (``--capacity`` values),
:mod:`~kvindex.simulate.scheduler` (the continuous-batching model),
:mod:`~kvindex.simulate.ledger` (hit and granularity-loss accounting),
:mod:`~kvindex.simulate.reference` (one-at-a-time replays, the theoretical maximum),
:mod:`~kvindex.simulate.runner` (replays on several cores),
:mod:`~kvindex.simulate.report` (tables, JSON), :mod:`~kvindex.simulate.plot`,
:mod:`~kvindex.simulate.outputs` (output paths checked up front),
:mod:`~kvindex.simulate.options` (option values the CLI and the cluster mode share),
:mod:`~kvindex.simulate.cli`; the cluster mode (``--cluster``: engines behind a router, over
real KV-event streams) in :mod:`~kvindex.simulate.cluster`, its figures in
:mod:`~kvindex.simulate.cluster_report`, its plot in :mod:`~kvindex.simulate.cluster_plot`.
"""

from __future__ import annotations

from kvindex.simulate.capacity import Capacity, parse_capacities, parse_capacity
from kvindex.simulate.errors import SimulationError, TraceFormatError
from kvindex.simulate.ledger import ExactMatcher, HitTally, RequestHit
from kvindex.simulate.reference import replay_in_order, theoretical_max_hit_rate
from kvindex.simulate.scheduler import RunResult, RunSpec, infinite_blocks, simulate_run
from kvindex.simulate.trace import TraceWorkload, read_mooncake_trace
from kvindex.simulate.workloads import ArrayWorkload, Request, Workload, chat_workload

__all__ = [
    "ArrayWorkload",
    "Capacity",
    "ExactMatcher",
    "HitTally",
    "Request",
    "RequestHit",
    "RunResult",
    "RunSpec",
    "SimulationError",
    "TraceFormatError",
    "TraceWorkload",
    "Workload",
    "chat_workload",
    "infinite_blocks",
    "parse_capacities",
    "parse_capacity",
    "read_mooncake_trace",
    "replay_in_order",
    "simulate_run",
    "theoretical_max_hit_rate",
]
