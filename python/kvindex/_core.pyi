"""Native core of kvindex (Rust, PyO3). Import from :mod:`kvindex`, not from here.

Conventions: token arrays are 1-D C-contiguous ``int32`` or ``int64`` numpy arrays;
id arrays are ``int64``. A wrong dtype, rank or layout raises ``DTypeError`` (a
``TypeError``) instead of being copied silently. Caller errors raise
``KvIndexError`` subclasses and leave the object unchanged; an expected shortfall
(out of blocks) is a return value (``None`` / ``False``).

Threading: cache objects belong to one scheduler thread. Their methods never
release the GIL (each runs for microseconds); on a free-threaded interpreter a
concurrent second call raises ``RuntimeError`` ("already borrowed") instead of
corrupting state. ``block_hashes`` is pure and releases the GIL for prompts of
4096 tokens or more.
"""

from collections.abc import Iterator, Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
HASH_ALGOS: list[str]

_Tokens = npt.NDArray[np.int32] | npt.NDArray[np.int64]
_Lora = tuple[str, str] | None
_MmItems = Sequence[tuple[str, int, int]] | None

def block_hashes(
    tokens: _Tokens,
    block_size: int,
    *,
    algo: str = "xxh3_128",
    seed: str | None = None,
    cache_salt: str | None = None,
    lora: _Lora = None,
    mm_items: _MmItems = None,
) -> npt.NDArray[np.uint8]:
    """Chained hashes of the full blocks of ``tokens``, shape ``[len(tokens) // block_size, d]``.

    ``h_i = H(serialize(h_{i-1} or NONE_HASH, tokens of block i, extra keys of block i))``
    with ``NONE_HASH = H(serialize(seed))``. ``algo`` is one of :data:`HASH_ALGOS`:
    ``xxh3_128`` (default, fastest) and ``sha256`` use kvindex's compact encoding;
    ``vllm_sha256_cbor``, ``vllm_xxhash_cbor``, ``vllm_sha256`` (pickle, vLLM's default)
    and ``vllm_xxhash`` are bit-exact with vLLM 0.33. Extra keys as vLLM tags them:
    ``("lora", name, path)`` on every block, ``("mm", identifier, offset - block_start)``
    per overlapping multimodal item ``(identifier, offset, length)``, and
    ``("cache_salt", salt)`` on block 0 for a non-empty salt. ``seed`` defaults to
    ``"kvindex"`` (compact modes) or ``"vllm-none-hash"`` (vLLM modes).
    Releases the GIL for 4096 tokens or more.
    """

def none_hash(*, algo: str = "xxh3_128", seed: str | None = None) -> bytes:
    """The chain's root parent ``H(serialize(seed))`` for ``algo``."""

@final
class Admission:
    """Result of :meth:`HashChainCache.admit`; unpacks as ``(num_cached_tokens, block_ids)``."""

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the cache (a multiple of the block size)."""
    @property
    def block_ids(self) -> npt.NDArray[np.int32]:
        """The request's block table."""
    def __iter__(self) -> Iterator[Any]: ...
    def __len__(self) -> int: ...

@final
class BlockStored:
    """A run of consecutive blocks became cached (hashes: low 64 bits, big-endian)."""

    @property
    def block_hashes(self) -> list[int]: ...
    @property
    def parent_block_hash(self) -> int | None: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def extra_keys(self) -> list[tuple[Any, ...] | None]:
        """Per block: untagged extra keys (LoRA name, salt, ``(mm identifier, offset)``) or None."""

@final
class BlockRemoved:
    """Blocks stopped being cached (one event per evicted physical block)."""

    @property
    def block_hashes(self) -> list[int]: ...

@final
class AllBlocksCleared:
    """Every cached block was dropped (reset)."""

@final
class HashChainCache:
    """Prefix cache over chained block hashes and a ref-counted block pool (vLLM 0.33 semantics).

    Block 0 is the null block (never allocated; pads block tables). Free blocks form
    an LRU queue: new blocks come from its head; a finished request's blocks return in
    reverse table order, unhashed ones to the head and cached ones to the tail; a
    cached block keeps its hash until it is handed out again. A lookup hits the
    longest run of cached block hashes from block 0, capped at ``num_tokens - 1``
    (the last prompt token is always recomputed) and aligned to the block size.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        algo: str = "xxh3_128",
        seed: str | None = None,
        enable_events: bool = False,
    ) -> None: ...
    @property
    def num_blocks(self) -> int:
        """Pool size, the null block included."""
    @property
    def block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...
    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached-but-idle ones included."""
    @property
    def usage(self) -> float:
        """``1 - num_free_blocks / (num_blocks - 1)``."""
    @property
    def num_requests(self) -> int:
        """Running (admitted, not freed) requests."""
    @property
    def num_cached_blocks(self) -> int:
        """Distinct cached block hashes."""
    @property
    def num_common_prefix_blocks(self) -> int:
        """Blocks shared by every running request, counted from block 0 (what cascade
        attention can share); 0 when no request runs. O(shared blocks)."""
    @property
    def stats(self) -> dict[str, float]:
        """``requests``, ``queries`` (prompt tokens), ``hits`` (cached tokens), ``evictions``
        (cached blocks that lost their hash), ``hit_rate``."""
    def take_stats(self) -> dict[str, float]:
        """Returns :attr:`stats` and zeroes the counters."""
    def __contains__(self, request_id: int) -> bool: ...
    def admit(
        self,
        request_id: int,
        tokens: _Tokens,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
        skip_reading: bool = False,
    ) -> Admission | None:
        """Hashes the prompt, pins the longest cached prefix, allocates blocks for the rest
        and caches every full prompt block. Returns ``None`` with nothing changed when free
        blocks run short (hit blocks in the free queue count as available). With
        ``skip_reading`` (vLLM's prompt-logprobs requests) nothing is read from the cache
        but the prompt is still cached. Raises ``DuplicateRequestError`` for a running id.
        """
    def lookup(
        self,
        tokens: _Tokens,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> int:
        """Tokens a prompt would hit now. No side effects."""
    def append(self, request_id: int, tokens: _Tokens) -> bool:
        """Appends computed decode tokens; allocates a block when one fills and caches every
        newly full block. ``False`` (nothing changed) when a needed block is not free."""
    def append_batch(
        self,
        request_ids: npt.NDArray[np.int64],
        tokens: _Tokens,
        offsets: npt.NDArray[np.int64] | None = None,
    ) -> bool:
        """One step's decode tokens for many requests, all or nothing: request ``i`` gets
        ``tokens[offsets[i]:offsets[i+1]]`` (one token each when ``offsets`` is None).
        Ids must be distinct. ``False`` (nothing changed) when blocks run short."""
    def free(self, request_id: int) -> None:
        """Finishes a request; its blocks return to the free queue in reverse order."""
    def free_batch(self, request_ids: npt.NDArray[np.int64]) -> None:
        """Finishes many requests, in order; all ids are checked first."""
    def evict_blocks(
        self, block_ids: npt.NDArray[np.int64] | npt.NDArray[np.int32] | Sequence[int]
    ) -> int:
        """Drops the cached hashes of idle blocks (they keep their queue position).
        Raises ``BlockInUseError`` for a block a request holds. Returns blocks evicted."""
    def reset(self) -> None:
        """Drops every cached hash. Raises ``BlockInUseError`` while requests run."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drains buffered KV events (empty unless ``enable_events``)."""
    def block_tables(
        self,
        request_ids: npt.NDArray[np.int64],
        max_blocks: int | None = None,
        out: npt.NDArray[np.int32] | None = None,
    ) -> npt.NDArray[np.int32]:
        """Block tables ``[len(request_ids), max_blocks]`` padded with the null block 0,
        written into ``out`` when given (no allocation in the steady state)."""
    def slot_mapping(
        self, request_ids: npt.NDArray[np.int64], query_lens: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """``block * block_size + offset`` of each request's last ``query_lens[i]`` tokens."""
    def num_tokens(self, request_id: int) -> int: ...
    def request_blocks(self, request_id: int) -> npt.NDArray[np.int32]: ...
    def request_block_hashes(self, request_id: int) -> npt.NDArray[np.uint8]: ...
    def free_queue(self) -> npt.NDArray[np.int32]:
        """Free blocks from head (next victim) to tail."""
    def block_hash(self, block_id: int) -> bytes | None: ...
    def ref_count(self, block_id: int) -> int: ...
    def check_invariants(self) -> None:
        """Raises ``InvariantViolation`` if any internal invariant is broken."""
