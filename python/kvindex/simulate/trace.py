"""Mooncake JSONL traces (FAST'25 release format) as a :class:`Workload`.

One JSON object a line: ``timestamp`` (ms), ``input_length`` and ``output_length``
(tokens), ``hash_ids`` (one id per block of ``tokens_per_hash`` prompt tokens — 512 in the
Mooncake release; the last block is usually partial). The file is read line by line, never
whole. Equal ids at the same position mean a reusable prefix, so an id names a whole
prefix: the reader checks that every id keeps its position and its parent id.

Tokens: block id ``h`` (renumbered densely, in order of first appearance, as ``d``) holds
tokens ``d*T .. d*T+T-1`` (``T = tokens_per_hash``), cut to length in a prompt's last
block; output tokens are unique to the request. Distinct blocks thus share no token, so a
token-exact match never runs past the hash-id match. Arrival: ``timestamp // step_ms`` steps.

A malformed line raises :class:`TraceFormatError` ``"FILE:LINE: what is wrong"`` and
nothing is simulated (timestamps must not decrease: requests are replayed in file order).
Blank lines are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvindex.simulate.errors import TraceFormatError
from kvindex.simulate.workloads import OUTPUT_BASE, Request, Tokens, Workload

__all__ = ["TRACE_BLOCK", "TraceWorkload", "read_mooncake_trace"]

#: Tokens per hash id in the Mooncake trace release (the default of ``tokens_per_hash``).
TRACE_BLOCK = 512


class TraceWorkload(Workload):
    """A trace: prompts are materialised from their block ids on demand.

    Prompt tokens stay below the output range and outputs do not overlap, so no prompt
    holds an output token (:attr:`Workload.outputs_only_in_followers`)."""

    outputs_only_in_followers = True

    def __init__(
        self,
        name: str,
        requests: list[Request],
        blocks: list[npt.NDArray[np.int32]],
        output_offsets: npt.NDArray[np.int64],
        params: dict[str, Any],
        hash_ids: list[list[int]],
        tokens_per_hash: int = TRACE_BLOCK,
    ) -> None:
        super().__init__(name, requests, output_offsets, params)
        self._blocks = blocks
        self.tokens_per_hash = tokens_per_hash
        self._arange = np.arange(tokens_per_hash, dtype=np.int32)
        #: The original hash ids of each request (for checks against the trace itself).
        self.hash_ids = hash_ids

    def prompt(self, rid: int) -> Tokens:
        """Prompt tokens of request ``rid``, built from its block ids."""
        b = self._blocks[rid]
        toks = (b[:, None] * self.tokens_per_hash + self._arange[None, :]).ravel()
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


def _lines(p: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of ``p``, read as they are needed."""
    try:
        with p.open(encoding="utf-8") as f:
            lineno = 0
            try:
                for lineno, line in enumerate(f, start=1):
                    yield lineno, line
            except UnicodeDecodeError as e:
                raise TraceFormatError(f"{p}:{lineno + 1}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read the trace: {e.strerror or e}") from None


def read_mooncake_trace(
    path: str | Path,
    *,
    step_ms: float = 20.0,
    limit: int | None = None,
    tokens_per_hash: int = TRACE_BLOCK,
) -> TraceWorkload:
    """Reads a Mooncake JSONL trace line by line; ``limit`` keeps the first requests only.

    Raises :class:`TraceFormatError` (with file and line) for unreadable JSON, a missing or
    mistyped field, ``hash_ids`` that do not cover ``input_length`` in blocks of
    ``tokens_per_hash`` tokens, a timestamp smaller than the one before, or a hash id seen
    at another position or after another parent.
    """
    if step_ms <= 0:
        raise TraceFormatError(f"step_ms must be > 0, got {step_ms}")
    if tokens_per_hash < 1:
        raise TraceFormatError(f"tokens_per_hash must be >= 1, got {tokens_per_hash}")
    block = tokens_per_hash
    max_blocks = OUTPUT_BASE // block
    p = Path(path)
    if p.is_dir():
        raise TraceFormatError(f"{p}: cannot read the trace: is a directory")
    requests: list[Request] = []
    blocks: list[npt.NDArray[np.int32]] = []
    hash_ids: list[list[int]] = []
    offsets: list[int] = []
    dense: dict[int, int] = {}
    where_seen: dict[int, tuple[int, int, int]] = {}  # id -> (position, parent id, line)
    out_next = 0
    last_ts: float = -1.0
    last_line = 0
    for lineno, line in _lines(p):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        except RecursionError:
            raise TraceFormatError(f"{where}: invalid JSON: nested too deeply") from None
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
            raise TraceFormatError(
                f"{where}: timestamp {ts:g} ms is earlier than {last_ts:g} ms on line "
                f"{last_line}: timestamps must not decrease (requests are replayed in file "
                "order; sort the trace by timestamp)"
            )
        last_ts = float(ts)
        last_line = lineno
        n_in = _int_field(rec, "input_length", 1, where)
        n_out = _int_field(rec, "output_length", 0, where)
        if "hash_ids" not in rec:
            raise TraceFormatError(f"{where}: missing field 'hash_ids'")
        ids = rec["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
        ):
            raise TraceFormatError(f"{where}: hash_ids must be a list of non-negative integers")
        need = -(-n_in // block)
        if len(ids) != need:
            raise TraceFormatError(
                f"{where}: hash_ids has {len(ids)} blocks but input_length {n_in} needs "
                f"{need} ({block} tokens per hash id; see --tokens-per-hash)"
            )
        row = np.empty(len(ids), dtype=np.int32)
        parent = -1
        for pos, h in enumerate(ids):
            seen = where_seen.get(h)
            if seen is None:
                where_seen[h] = (pos, parent, lineno)
                if len(dense) >= max_blocks:
                    raise TraceFormatError(f"{where}: more than {max_blocks} distinct blocks")
                dense[h] = len(dense)
            elif seen[0] != pos or seen[1] != parent:
                raise TraceFormatError(
                    f"{where}: hash id {h} at {_place(pos, parent)} was first seen at "
                    f"{_place(seen[0], seen[1])} (line {seen[2]}); a hash id must name one prefix"
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
    params: dict[str, Any] = {
        "path": str(p),
        "step_ms": step_ms,
        "limit": limit,
        "tokens_per_hash": block,
    }
    return TraceWorkload(
        p.name, requests, blocks, np.array(offsets, dtype=np.int64), params, hash_ids, block
    )


def _place(pos: int, parent: int) -> str:
    """Where a hash id stands: ``block 0 (the first)`` or ``block 3, after hash id 17``."""
    if parent < 0:
        return f"block {pos} (the first)"
    return f"block {pos}, after hash id {parent}"
