"""Allocation failure inside calls whose work grows with a caller's input: in a child
interpreter whose address space is capped just above what it already uses, every such
call either succeeds or raises ``CapacityError`` (a ``MemoryError``), and the object stays
usable with its invariants intact. No call may abort the process.

Regression case: hashing a huge prompt in ``HashChainCache.admit`` / ``lookup`` grew its
hash buffers infallibly and aborted the interpreter (``memory allocation of ... bytes
failed``); so did ``check_invariants`` re-hashing a huge refused prompt kept for a retry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/statm are Linux's"
)

CHILD = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import kvindex
    from kvindex import CapacityError, HashChainCache, RadixPrefixCache, RadixTree

    case, headroom_mb = sys.argv[1], int(sys.argv[2])
    # Tokens; with block size 1, one block hash (up to 32 bytes) per token.
    n = 2_000_000 if case == "hc_check" else 8_000_000
    toks = np.zeros(n, dtype=np.int32)
    cache = None
    # Pools that could hold the prompt (a prompt no pool can hold is refused before
    # anything is allocated: RequestTooLargeError), so the allocations are reached.
    if case.startswith("hc"):
        cache = HashChainCache(n + 1, 1)
    elif case.startswith("rp"):
        cache = RadixPrefixCache(n + 1, 1)
    tree = RadixTree(1)
    if case == "hc_check":
        # A refused huge prompt (out of blocks now: another request holds some) is kept,
        # with its hashes, for the retry; the invariant check re-hashes it.
        assert cache.admit(0, np.arange(10, dtype=np.int32)) is not None
        assert cache.admit(1, toks) is None
    page = resource.getpagesize()
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * page
    limit = used + headroom_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    outcome = "ok"
    try:
        if case == "hc_lookup" or case == "rp_lookup":
            cache.lookup(toks)
        elif case == "hc_admit" or case == "rp_admit":
            cache.admit(1, toks)
        elif case == "block_hashes":
            kvindex.block_hashes(toks, 1)
        elif case == "tree_match":
            tree.match_prefix(toks)
        elif case == "hc_check":
            cache.check_invariants()
    except CapacityError:
        outcome = "capacity"
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    if cache is not None:
        cache.check_invariants()
        if outcome == "ok" and case.endswith("admit"):
            cache.free(1)  # the pool was big enough and the memory too
        assert cache.admit(2, np.arange(9, dtype=np.int32)) is not None
        cache.free(2)
        cache.check_invariants()
    tree.check_invariants()
    print(outcome)
    """
)


@pytest.mark.parametrize(
    "case",
    ["hc_lookup", "hc_admit", "hc_check", "rp_lookup", "rp_admit", "block_hashes", "tree_match"],
)
@pytest.mark.parametrize("headroom_mb", [16, 120])
def test_huge_prompt_under_a_memory_cap(case: str, headroom_mb: int) -> None:
    env = dict(os.environ, RUST_BACKTRACE="0")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(headroom_mb)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() in ("ok", "capacity"), r.stdout
