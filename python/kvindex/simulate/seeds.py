"""``--workload seeds``: the worked examples of the vLLM hash-chain and radix-tree design
notes, replayed through both designs.

Each example is a short sequence of requests replayed one at a time
(:func:`~kvindex.simulate.reference.replay_in_order`); the figure reported is what the
**last** request hits, with its exact match split as in :mod:`kvindex.simulate.ledger`.
Columns: the hash chain at the example's block size ``B``, the radix tree at page size 1
(SGLang's default) and at page size ``B``. ``expected`` holds the notes' numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvindex.simulate.ledger import RequestHit
from kvindex.simulate.reference import replay_in_order
from kvindex.simulate.workloads import Tokens

__all__ = ["COLUMNS", "EXAMPLES", "Example", "run_example", "run_seeds"]

#: (label, design, page size: ``None`` means the example's block size).
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("hash_chain@B", "hash_chain", None),
    ("radix@1", "radix", 1),
    ("radix@B", "radix", None),
)


def _t(*parts: range | list[int]) -> Tokens:
    return np.concatenate([np.asarray(list(p), dtype=np.int32) for p in parts])


_EMPTY = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class Example:
    """A worked example: requests replayed in order; the last one is measured."""

    key: str
    title: str
    block_size: int
    requests: tuple[tuple[Tokens, Tokens], ...]
    expected: dict[str, int]
    note: str
    capacity_tokens: int | None = None


def _prefix_pair(shared: int) -> tuple[tuple[Tokens, Tokens], ...]:
    return (
        (_t(range(shared), range(100_000, 100_050)), _EMPTY),
        (_t(range(shared), range(200_000, 200_050)), _EMPTY),
    )


EXAMPLES: tuple[Example, ...] = (
    Example(
        "partial-block",
        "80-token prompt whose first 30 tokens are cached",
        16,
        ((_t(range(80)), _EMPTY), (_t(range(30), range(1000, 1050)), _EMPTY)),
        {"hash_chain@B": 16, "radix@1": 30, "radix@B": 16},
        "hash-chain note: 30 tokens match, 16 hit, 14 recomputed (block granularity)",
    ),
    Example(
        "full-hit",
        "identical 80-token prompt (fully cached)",
        16,
        ((_t(range(80)), _EMPTY), (_t(range(80)), _EMPTY)),
        {"hash_chain@B": 64, "radix@1": 79, "radix@B": 64},
        "hash-chain note: the last token is recomputed, so its whole block is "
        "(79 // 16 = 4 blocks)",
    ),
    Example(
        "shared-100",
        "two prompts sharing 100 tokens",
        16,
        _prefix_pair(100),
        {"hash_chain@B": 96, "radix@1": 100, "radix@B": 96},
        "radix-tree note: 100 = 6 x 16 + 4, so 96 hit vs 100",
    ),
    Example(
        "abc-split",
        "A B C D E F, then A B C X Y Z",
        16,
        ((_t([1, 2, 3, 4, 5, 6]), _EMPTY), (_t([1, 2, 3, 7, 8, 9]), _EMPTY)),
        {"hash_chain@B": 0, "radix@1": 3, "radix@B": 0},
        "radix-tree note: the radix tree splits [A B C] off and hits it; no full block is shared",
    ),
    Example(
        "chained-parent",
        "CCBB AAAA then CCBC AAAA (block 4)",
        4,
        ((_t([3, 3, 2, 2, 1, 1, 1, 1]), _EMPTY), (_t([3, 3, 2, 3, 1, 1, 1, 1]), _EMPTY)),
        {"hash_chain@B": 0, "radix@1": 3, "radix@B": 0},
        "radix-tree note: block AAAA has another parent hash, so it is not a hit",
    ),
    Example(
        "next-turn",
        "next turn: 20 prompt + 12 generated + 10 new tokens",
        16,
        (
            (_t(range(20)), _t(range(200, 212))),
            (_t(range(20), range(200, 212), range(300, 310)), _EMPTY),
        ),
        {"hash_chain@B": 32, "radix@1": 32, "radix@B": 32},
        "hash-chain note: the decode block is cached when it fills; radix inserts it at finish",
    ),
    Example(
        "shared-6448",
        "two prompts sharing a 6,448-token prefix",
        16,
        _prefix_pair(6448),
        {"hash_chain@B": 6448, "radix@1": 6448, "radix@B": 6448},
        "radix-tree note: 6,448 = 403 x 16, nothing lost",
    ),
    Example(
        "shared-6463",
        "two prompts sharing a 6,463-token prefix (worst case)",
        16,
        _prefix_pair(6463),
        {"hash_chain@B": 6448, "radix@1": 6463, "radix@B": 6448},
        "radix-tree note: at most 15 tokens lost, 0.23% of the prefix",
    ),
    Example(
        "evict-tail-first",
        "112-token pool: 80-token prompt, a 64-token one, the first again",
        16,
        ((_t(range(80)), _EMPTY), (_t(range(9000, 9064)), _EMPTY), (_t(range(80)), _EMPTY)),
        {"hash_chain@B": 48, "radix@1": 0, "radix@B": 0},
        "hash-chain note: chain tails are evicted first, a prefix survives; the tree evicts a "
        "leaf whole",
        capacity_tokens=112,
    ),
)


def run_example(ex: Example, label: str) -> RequestHit:
    """Replays ``ex`` through column ``label``'s cache; the last request's hit split."""
    design, page = next((d, p) for lab, d, p in COLUMNS if lab == label)
    bs = ex.block_size if page is None else page
    blocks = None if ex.capacity_tokens is None else ex.capacity_tokens // bs
    tally = replay_in_order(list(ex.requests), design, bs, num_blocks=blocks, per_request=True)
    assert tally.per_request is not None
    return tally.per_request[-1]


def run_seeds() -> list[dict[str, Any]]:
    """Every example through every column: rows for the report and ``--json``."""
    rows: list[dict[str, Any]] = []
    for ex in EXAMPLES:
        cells: dict[str, Any] = {}
        for label, _, _ in COLUMNS:
            rh = run_example(ex, label)
            cells[label] = {
                "hit": rh.hit,
                "exact_match": rh.exact,
                "prompt_tokens": rh.prompt_tokens,
                "lost_granularity": rh.lost_granularity,
                "lost_full_hit": rh.lost_full_hit,
                "not_cached": rh.not_cached,
                "expected": ex.expected[label],
            }
        rows.append(
            {
                "key": ex.key,
                "title": ex.title,
                "block_size": ex.block_size,
                "note": ex.note,
                "results": cells,
            }
        )
    return rows
