"""One typed interface over both prefix-index designs.

:class:`PrefixCache` (the native base class ``kvindex._core.PrefixCache``) is the
request-level API a scheduler drives; both :class:`kvindex.HashChainCache`
(vLLM-style chained block hashes) and :class:`kvindex.RadixPrefixCache`
(SGLang-style radix tree) derive from it, so ``isinstance(cache, PrefixCache)``
is a real class check and a caller switches design with one argument to
:func:`make_cache`::

    cache = make_cache("radix", num_blocks=4096, block_size=16)
    adm = cache.admit(rid, prompt)          # None: out of blocks, nothing changed
    ...
    cache.append(rid, np.array([tok], np.int32))
    tables = cache.block_tables(np.array([rid], np.int64))
    cache.free(rid)

Where the two designs differ (same calls, different answers):

* **When blocks become shareable.** The hash chain registers a prompt's full
  blocks at ``admit`` and every block that fills during ``append``; the radix
  cache inserts a sequence at ``free`` (finish), as SGLang does, or earlier on
  an explicit ``RadixPrefixCache.checkpoint(rid)``.
* **Eviction.** The hash chain keeps freed blocks hittable until they are
  handed out again (LRU over the free queue, block by block, tails first);
  the radix cache evicts whole unlocked leaves by its policy, only when the
  pool runs short, and ``num_free_blocks`` counts evictable tree pages as free.
* **Granularity.** ``block_size`` is the radix cache's page size; with
  ``block_size=1`` its hits and tables are token-exact.
* **Hit cap.** Both match at most ``num_tokens - 1`` prompt tokens (vLLM's
  cap; SGLang's scheduler matches at most ``input_len - 1``), so the last
  prompt token is always computed.
* **Keys.** The radix cache namespaces by ``cache_salt`` / ``lora`` and rejects
  ``mm_items`` (it keys on token ids only). Different ``(lora, cache_salt)`` keys never
  share a cached block in either design.
* **Checkpoint.** ``checkpoint(rid)`` inserts a running request's full pages into the
  radix tree now; the hash chain caches full blocks as they fill, so there it only
  checks the id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from kvindex._core import PrefixCache

__all__ = ["DESIGNS", "AdmissionLike", "PrefixCache", "make_cache"]

#: Designs :func:`make_cache` builds.
DESIGNS: tuple[str, ...] = ("hash_chain", "radix")


class AdmissionLike(Protocol):
    """What ``admit`` returns on success (:class:`kvindex.Admission`, shared by both caches).

    Iterable as ``(num_cached_tokens, block_ids)``.
    """

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the cache (a multiple of the block size)."""
        ...

    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """The request's block table."""
        ...

    def __iter__(self) -> Iterator[Any]:
        """Yields ``num_cached_tokens`` then ``block_ids``."""
        ...

    def __len__(self) -> int:
        """2."""
        ...


def make_cache(
    design: Literal["hash_chain", "radix"] | str,
    num_blocks: int,
    block_size: int,
    **kw: Any,
) -> PrefixCache:
    """Builds a :class:`PrefixCache` of the given design.

    ``design="hash_chain"`` gives :class:`kvindex.HashChainCache` (keywords
    ``algo``, ``seed``, ``enable_events``, ``max_events``); ``design="radix"`` gives
    :class:`kvindex.RadixPrefixCache` (keywords ``policy``, ``slru_threshold``,
    ``enable_events``, ``max_events``). Unknown designs raise :class:`kvindex.InvalidArgumentError`.
    """
    from kvindex._core import HashChainCache, RadixPrefixCache
    from kvindex.exceptions import InvalidArgumentError

    cache: PrefixCache
    if design == "hash_chain":
        cache = HashChainCache(num_blocks, block_size, **kw)
    elif design == "radix":
        cache = RadixPrefixCache(num_blocks, block_size, **kw)
    else:
        raise InvalidArgumentError(f"unknown cache design {design!r}; expected one of {DESIGNS}")
    return cache
