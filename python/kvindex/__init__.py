"""kvindex: the KV-cache prefix index for LLM inference schedulers.

Two index designs over ref-counted block pools, in one Rust core:

- :class:`HashChainCache` — vLLM's chained block hashes (bit-compatible hash modes),
- :class:`RadixPrefixCache` — the same request-level API over SGLang's radix tree,
- :class:`RadixTree` — the radix tree alone (token-exact hits, LRU leaf eviction; the
  caller owns the slots); :class:`RadixCache` is its former name,

plus :func:`block_hashes` for hashing prompts, and Triton paged-attention kernels in
:mod:`kvindex.kernels` (install ``kvindex[kernels]``). Importing ``kvindex`` never
imports torch.
"""

from __future__ import annotations

from kvindex._core import (
    HASH_ALGOS,
    RADIX_POLICIES,
    Admission,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    HashChainCache,
    InsertResult,
    MatchResult,
    RadixCache,
    RadixPrefixCache,
    RadixTree,
    __version__,
    block_hashes,
    none_hash,
)
from kvindex._explain import explain
from kvindex.exceptions import (
    BlockInUseError,
    CapacityError,
    ClosedError,
    DTypeError,
    DuplicateRequestError,
    InvalidArgumentError,
    InvariantViolation,
    KvIndexError,
    LockError,
    RequestTooLargeError,
    StaleHandleError,
    UnknownRequestError,
)
from kvindex.protocol import PrefixCache, make_cache
from kvindex.sizing import kv_bytes_per_token, kv_pool_size

__all__ = [
    "HASH_ALGOS",
    "RADIX_POLICIES",
    "Admission",
    "AllBlocksCleared",
    "BlockInUseError",
    "CapacityError",
    "ClosedError",
    "BlockRemoved",
    "BlockStored",
    "DTypeError",
    "DuplicateRequestError",
    "HashChainCache",
    "InsertResult",
    "InvalidArgumentError",
    "InvariantViolation",
    "KvIndexError",
    "LockError",
    "MatchResult",
    "PrefixCache",
    "RadixCache",
    "RadixPrefixCache",
    "RadixTree",
    "RequestTooLargeError",
    "StaleHandleError",
    "UnknownRequestError",
    "__version__",
    "block_hashes",
    "explain",
    "kv_bytes_per_token",
    "kv_pool_size",
    "make_cache",
    "none_hash",
]
