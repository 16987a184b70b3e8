"""One typed interface over both prefix-index designs.

:class:`PrefixCache` is the request-level API a scheduler drives; both
:class:`kvindex.HashChainCache` (vLLM-style chained block hashes) and
:class:`kvindex.RadixPrefixCache` (SGLang-style radix tree) satisfy it, so a
caller switches design with one argument to :func:`make_cache`::

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

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["DESIGNS", "AdmissionLike", "PrefixCache", "make_cache"]

Tokens = npt.NDArray[np.int32] | npt.NDArray[np.int64]
Ids = npt.NDArray[np.int64]
MmItems = Sequence[tuple[str, int, int]] | None

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


@runtime_checkable
class PrefixCache(Protocol):
    """A request-level KV prefix cache over a pool of ``num_blocks`` blocks
    (block 0 is the null block; tables are padded with 0).

    Owned by one scheduler thread; every method runs without releasing the GIL.
    Caller errors raise :class:`kvindex.KvIndexError` subclasses and change
    nothing; running out of blocks is a return value (``None`` / ``False``).
    """

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per block (the radix cache's page size)."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks new work can get now (idle cached blocks included)."""
        ...

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by running requests."""
        ...

    @property
    def num_requests(self) -> int:
        """Running requests."""
        ...

    @property
    def num_common_prefix_blocks(self) -> int:
        """Blocks shared by every running request, from block 0 (what cascade attention shares)."""
        ...

    @property
    def num_cached_blocks(self) -> int:
        """Cached blocks (distinct block hashes; tree pages for the radix cache)."""
        ...

    @property
    def stats(self) -> dict[str, float]:
        """``requests``, ``queries`` (prompt tokens), ``hits``, ``evictions``, ``hit_rate``,
        ``events_dropped``."""
        ...

    def __contains__(self, request_id: int, /) -> bool:
        """Whether the request is running."""
        ...

    def take_stats(self) -> dict[str, float]:
        """Returns :attr:`stats` and zeroes the counters."""
        ...

    def admit(
        self,
        request_id: int,
        tokens: Tokens,
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        mm_items: MmItems = None,
        skip_reading: bool = False,
    ) -> AdmissionLike | None:
        """Starts a request: hit the cache, allocate the rest; ``None`` if out of blocks now,
        ``RequestTooLargeError`` if the prompt needs more than the pool's usable blocks."""
        ...

    def lookup(
        self,
        tokens: Tokens,
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        mm_items: MmItems = None,
    ) -> int:
        """Tokens a prompt would hit now, without side effects."""
        ...

    def append(self, request_id: int, tokens: Tokens) -> bool:
        """Extends a request by computed tokens; ``False`` (no change) if out of blocks."""
        ...

    def append_batch(self, request_ids: Ids, tokens: Tokens, offsets: Ids | None = None) -> bool:
        """All-or-nothing :meth:`append` over a CSR batch."""
        ...

    def checkpoint(self, request_id: int) -> None:
        """Makes the running request's full blocks hittable by other requests now."""
        ...

    def free(self, request_id: int) -> None:
        """Finishes a request."""
        ...

    def free_batch(self, request_ids: Ids) -> None:
        """Finishes several requests (all ids checked first)."""
        ...

    def admit_chunk(
        self,
        request_id: int,
        tokens: Tokens,
        *,
        chunk: int | None = None,
        lookahead: int = 0,
        must_fit: bool = False,
        external_prefix: int = 0,
        delay_cache: bool = False,
        reserved_blocks: int = 0,
        watermark_blocks: int = 0,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        mm_items: MmItems = None,
        skip_reading: bool = False,
    ) -> tuple[int, int, npt.NDArray[np.int32]] | None:
        """Admits a request's first chunk: ``(hit, scheduled, new_block_ids)`` or ``None``."""
        ...

    def resume(
        self,
        request_id: int,
        *,
        chunk: int | None = None,
        lookahead: int = 0,
        must_fit: bool = False,
        external_prefix: int = 0,
        delay_cache: bool = False,
        reserved_blocks: int = 0,
        watermark_blocks: int = 0,
    ) -> tuple[int, int, npt.NDArray[np.int32]] | None:
        """Resumes a preempted request as :meth:`admit_chunk` admits a new one."""
        ...

    def schedule(
        self,
        request_id: int,
        num_new_tokens: int,
        *,
        lookahead: int = 0,
        draft_tokens: Tokens | None = None,
        reserved_blocks: int = 0,
    ) -> npt.NDArray[np.int32] | None:
        """A running request's next chunk or decode step: new block ids or ``None``."""
        ...

    def schedule_batch(
        self,
        request_ids: Ids,
        num_new_tokens: Ids,
        *,
        lookahead: int = 0,
        draft_tokens: Tokens | None = None,
        draft_offsets: Ids | None = None,
    ) -> tuple[int, npt.NDArray[np.int32], Ids]:
        """:meth:`schedule` over a CSR batch, stopping at the first refusal."""
        ...

    def commit_tokens(self, request_id: int, tokens: Tokens, num_rejected: int = 0) -> None:
        """Sampled ids (accepted drafts first) for the step in flight."""
        ...

    def commit_batch(
        self,
        request_ids: Ids,
        tokens: Tokens,
        offsets: Ids | None = None,
        num_rejected: Ids | None = None,
    ) -> None:
        """All-or-nothing :meth:`commit_tokens` over a CSR batch."""
        ...

    def preempt(self, request_id: int) -> None:
        """Releases a request's blocks; its tokens stay for :meth:`resume`."""
        ...

    def finish(self, request_id: int) -> None:
        """Finishes a request in any state; nothing more is cached."""
        ...

    def finish_transfer(self, request_id: int) -> None:
        """The external KV of a ``delay_cache`` admission landed: cache it, run."""
        ...

    def request_state(self, request_id: int) -> dict[str, Any]:
        """A request's lifecycle counters."""
        ...

    @property
    def resumed_stats(self) -> dict[str, float]:
        """Statistics of resumed admissions, counted apart."""
        ...

    def block_tables(
        self,
        request_ids: Ids,
        max_blocks: int | None = None,
        out: npt.NDArray[np.int32] | None = None,
    ) -> npt.NDArray[np.int32]:
        """Block tables ``[len(request_ids), max_blocks]``, padded with 0."""
        ...

    def slot_mapping(self, request_ids: Ids, query_lens: Ids) -> npt.NDArray[np.int64]:
        """KV slots of each request's last ``query_lens[i]`` tokens, concatenated."""
        ...

    def num_tokens(self, request_id: int) -> int:
        """Tokens a running request holds."""
        ...

    def request_blocks(self, request_id: int) -> npt.NDArray[np.int32]:
        """A running request's block table."""
        ...

    def free_blocks(self) -> npt.NDArray[np.int32]:
        """Blocks no request or cache entry holds, in the order the pool hands them out."""
        ...

    def ref_count(self, block_id: int) -> int:
        """References on a block."""
        ...

    def check_invariants(self) -> None:
        """Raises :class:`kvindex.InvariantViolation` if internal state is inconsistent."""
        ...

    def take_events(self) -> list[Any]:
        """Drains buffered KV events (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``)."""
        ...

    def reset(self) -> None:
        """Drops every cached block and the refused prompts kept for a retry (refused
        while requests run)."""
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
