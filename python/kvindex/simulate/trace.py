"""Mooncake JSONL traces (FAST'25 release format) as a :class:`Workload`.

One JSON object a line: ``timestamp`` (ms), ``input_length`` and ``output_length``
(tokens), ``hash_ids`` (one id per 512-token block of the prompt; the last block is usually
partial). Equal ids at the same position mean a reusable prefix, so an id names a whole
prefix: the reader checks that every id keeps its position and its parent id.

Tokens: block id ``h`` (renumbered densely, in order of first appearance, as ``d``) holds
tokens ``d*512 .. d*512+511``, cut to length in a prompt's last block; output tokens are
unique to the request. Distinct blocks thus share no token, so a token-exact match never
runs past the hash-id match. Arrival: ``timestamp // step_ms`` steps.

A malformed line raises :class:`TraceFormatError` ``"FILE:LINE: what is wrong"`` and
nothing is simulated. Blank lines are skipped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex.simulate.errors import TraceFormatError
from kvindex.simulate.workloads import OUTPUT_BASE, Request, Tokens, Workload

__all__ = ["TRACE_BLOCK", "TraceWorkload", "read_mooncake_trace"]

#: Tokens per hash id in Mooncake traces.
TRACE_BLOCK = 512
_ARANGE = np.arange(TRACE_BLOCK, dtype=np.int32)
_MAX_BLOCKS = OUTPUT_BASE // TRACE_BLOCK


class TraceWorkload(Workload):
    """A trace: prompts are materialised from their block ids on demand."""

    def __init__(
        self,
        name: str,
        requests: list[Request],
        blocks: list[npt.NDArray[np.int32]],
        output_offsets: npt.NDArray[np.int64],
        params: dict[str, Any],
        hash_ids: list[list[int]],
    ) -> None:
        super().__init__(name, requests, output_offsets, params)
        self._blocks = blocks
        #: The original hash ids of each request (for checks against the trace itself).
        self.hash_ids = hash_ids

    def prompt(self, rid: int) -> Tokens:
        """Prompt tokens of request ``rid``, built from its block ids."""
        b = self._blocks[rid]
        toks = (b[:, None] * TRACE_BLOCK + _ARANGE[None, :]).ravel()
        return np.ascontiguousarray(toks[: self.requests[rid].prompt_len])


def _int_field(rec: dict[str, Any], key: str, lo: int, where: str) -> int:
    if key not in rec:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceFormatError(f"{where}: {key} must be an integer, got {v!r}")
    if v < lo:
        raise TraceFormatError(f"{where}: {key} must be >= {lo}, got {v}")
    return v


def read_mooncake_trace(
    path: str | Path, *, step_ms: float = 20.0, limit: int | None = None
) -> TraceWorkload:
    """Reads a Mooncake JSONL trace; ``limit`` keeps the first requests only.

    Raises :class:`TraceFormatError` (with file and line) for unreadable JSON, a missing or
    mistyped field, ``hash_ids`` that do not cover ``input_length`` in 512-token blocks, a
    timestamp that goes back, or a hash id seen at another position or after another parent.
    """
    if step_ms <= 0:
        raise TraceFormatError(f"step_ms must be > 0, got {step_ms}")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read the trace: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{p}: not UTF-8 text ({e.reason})") from None
    requests: list[Request] = []
    blocks: list[npt.NDArray[np.int32]] = []
    hash_ids: list[list[int]] = []
    offsets: list[int] = []
    dense: dict[int, int] = {}
    where_seen: dict[int, tuple[int, int, int]] = {}  # id -> (position, parent id, line)
    out_next = 0
    last_ts: float = -1.0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(rec, dict):
            raise TraceFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        if "timestamp" not in rec:
            raise TraceFormatError(f"{where}: missing field 'timestamp'")
        ts = rec["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise TraceFormatError(f"{where}: timestamp must be a number, got {ts!r}")
        if ts < 0:
            raise TraceFormatError(f"{where}: timestamp must be >= 0, got {ts}")
        if ts < last_ts:
            raise TraceFormatError(f"{where}: timestamp {ts} goes back (previous {last_ts})")
        last_ts = float(ts)
        n_in = _int_field(rec, "input_length", 1, where)
        n_out = _int_field(rec, "output_length", 0, where)
        if "hash_ids" not in rec:
            raise TraceFormatError(f"{where}: missing field 'hash_ids'")
        ids = rec["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
        ):
            raise TraceFormatError(f"{where}: hash_ids must be a list of non-negative integers")
        need = -(-n_in // TRACE_BLOCK)
        if len(ids) != need:
            raise TraceFormatError(
                f"{where}: hash_ids has {len(ids)} blocks but input_length {n_in} needs "
                f"{need} ({TRACE_BLOCK} tokens per block)"
            )
        row = np.empty(len(ids), dtype=np.int32)
        parent = -1
        for pos, h in enumerate(ids):
            seen = where_seen.get(h)
            if seen is None:
                where_seen[h] = (pos, parent, lineno)
                if len(dense) >= _MAX_BLOCKS:
                    raise TraceFormatError(f"{where}: more than {_MAX_BLOCKS} distinct blocks")
                dense[h] = len(dense)
            elif seen[0] != pos or seen[1] != parent:
                raise TraceFormatError(
                    f"{where}: hash id {h} at block {pos} after {parent} was first seen at "
                    f"block {seen[0]} after {seen[1]} (line {seen[2]}); a hash id must name "
                    "one prefix"
                )
            row[pos] = dense[h]
            parent = h
        rid = len(requests)
        requests.append(Request(rid, n_in, n_out, int(ts // step_ms), -1, "trace"))
        blocks.append(row)
        hash_ids.append(list(ids))
        offsets.append(out_next)
        out_next += n_out
    if not requests:
        raise TraceFormatError(f"{p}: the trace has no requests")
    params: dict[str, Any] = {"path": str(p), "step_ms": step_ms, "limit": limit}
    return TraceWorkload(
        p.name, requests, blocks, np.array(offsets, dtype=np.int64), params, hash_ids
    )
