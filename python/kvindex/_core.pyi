"""Native core of kvindex (Rust, PyO3). Import from :mod:`kvindex`, not from here.

Conventions: token arrays are 1-D C-contiguous ``int32`` or ``int64`` numpy arrays;
id arrays are ``int64``. Both caches take token ids in int32 (``-2**31 <= id < 2**31``):
ids index a model's vocabulary, which vLLM and SGLang hold in int32 tensors (vLLM's
server rejects out-of-vocabulary ids before hashing), so a wider id in an ``int64``
array raises ``InvalidArgumentError``, nothing changed. ``block_hashes`` alone hashes
any ``int64`` id, as vLLM's hashing of a Python int does. A wrong dtype, rank or layout
raises ``DTypeError`` (a ``TypeError``) instead of being copied silently. Input arrays
are read in place for the duration of a call (never kept); returned arrays are new and
the caller's.
Caller errors raise
``KvIndexError`` subclasses and leave the object unchanged; an expected shortfall
(out of blocks) is a return value (``None`` / ``False``). A constructor or an output
array whose size this machine cannot allocate raises ``CapacityError`` (a
``MemoryError``); the object stays usable.

Integer parameters (sizes, counts, ids, handles, priorities) take ``int`` or any
object with ``__index__`` (numpy integer scalars); ``bool`` raises ``DTypeError``, a
value outside the parameter's range raises ``InvalidArgumentError`` (never a bare
``OverflowError``), and an exception raised by the object's own ``__index__`` reaches
the caller unchanged. A ``str`` argument with a lone surrogate (which has no UTF-8
form) raises ``InvalidArgumentError``. Request-id arrays (``request_ids``) and ``query_lens`` /
``offsets`` are 1-D C-contiguous ``int64`` arrays; ``block_ids`` takes a token-like
array (``int32`` or ``int64``) or a list / tuple of ints.

Arrays only on the scheduler's hot path: ``admit``, ``lookup``, ``append``,
``append_batch``, ``free_batch``, ``block_tables``, ``slot_mapping`` and the radix tree's
``match_prefix`` / ``probe`` / ``insert`` take numpy arrays (a list raises ``DTypeError``:
no per-call conversion hides in a scheduler step). Off it, where a copy costs nothing
that matters, a list or tuple of ints is accepted too (copied): ``block_hashes``'s
tokens, ``evict_blocks``'s ``block_ids``, and ``ClusterIndex``'s tokens, ``hashes``
(uint64) and ``load`` (floats).

KV events are buffered between two ``take_events`` calls up to ``max_events``
(default 100,000); when the buffer is full the oldest event is dropped and counted in
``stats["events_dropped"]`` (``RadixTree.events_dropped``): a consumer that sees a
non-zero count has missed events.

Threading: cache objects belong to one scheduler thread. A method converts all its
arguments first (an ``__index__`` or an ``mm_items`` generator may run Python code and
release the GIL) and only then works on the object, without releasing the GIL (each
runs for microseconds): on a GIL build, concurrent calls from several threads are
serialised; on a free-threaded interpreter a concurrent second call raises
``RuntimeError`` ("already borrowed") instead of corrupting state. ``block_hashes`` is
pure and releases the GIL for prompts of 4096 tokens or more.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Self, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__version__: str
HASH_ALGOS: list[str]

_Tokens = npt.NDArray[np.int32] | npt.NDArray[np.int64]
_Lora = tuple[str, str] | None
_MmItems = Sequence[tuple[str, int, int]] | None
_BlockIds = npt.NDArray[np.int64] | npt.NDArray[np.int32] | list[int] | tuple[int, ...]
# Off the hot path (hashing helpers, cluster routing) token arrays may also be lists / tuples.
_TokensOrSeq = _Tokens | list[int] | tuple[int, ...]
_Hashes = npt.NDArray[np.uint64] | list[int] | tuple[int, ...]
_Load = npt.NDArray[np.float64] | list[float] | tuple[float, ...]
_GroupTuple = tuple[str, int, int, str]

def block_hashes(
    tokens: _TokensOrSeq,
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

def explain_layout(
    groups: Sequence[_GroupTuple],
    prompt_tokens: int,
    *,
    chunk: int | None = None,
    use_eagle: bool | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The figures of `kvindex explain` for `groups` (`(kind, block_size, size,
    mamba_mode)` tuples in group order) and a prompt of `prompt_tokens` tokens
    seen twice (the first time prefilled in chunks of `chunk` tokens; None: at
    once). Keys: `hash_block_size`, `scheduler_block_size`, `alignment`, `sets`
    (per spec set: `kind`, `block_size`, `group_ids`, `window_blocks` for a
    sliding window, `hit` (its rule alone), `cached`, `nulls`, `reused`
    (blocks)), `hit` (tokens the repeat reuses) and `min_prompt` (the shortest
    prompt whose repeat hits, up to `limit` tokens (default 2**17), or None)."""

@final
class _GroupReplay:
    """A stream of requests through one engine's cache under a group layout, nothing
    evicted (``kvindex simulate --model``): each request hits what earlier ones left
    cached, by the core's hybrid fixed point, then leaves its own blocks cached.
    ``groups`` as ``explain_layout`` takes them; with ``enable_caching=False`` (what a
    Mamba group in ``"none"`` mode leaves) nothing hits."""

    def __new__(
        cls, groups: Sequence[_GroupTuple], *, enable_caching: bool | None = None
    ) -> Self: ...
    @property
    def hash_block_size(self) -> int:
        """Tokens per block hash (the gcd of the block sizes)."""
    @property
    def sets(self) -> list[tuple[str, int, list[int]]]:
        """Per spec set: `(kind, block_size, group_ids)`."""
    @property
    def cached_blocks(self) -> list[int]:
        """Per spec set: blocks cached."""
    def request(
        self,
        hashes: npt.NDArray[np.uint64],
        prompt_tokens: int,
        total_tokens: int,
        chunk: int | None = None,
    ) -> tuple[int, list[int]]:
        """Runs one request: a prompt of `prompt_tokens` tokens ending with `total_tokens`
        (prompt and output); `hashes` (uint64) are the block hashes of all its tokens at
        the hash block size; the prompt is prefilled in chunks of `chunk` tokens (None:
        at once). Returns `(hit tokens, per spec set: the tokens its rule alone reuses)`."""

def _force_panic_for_tests() -> None:
    """Test hook: panics inside Rust (surfaces as ``pyo3_runtime.PanicException``)."""

def none_hash(*, algo: str = "xxh3_128", seed: str | None = None) -> bytes:
    """The chain's root parent ``H(serialize(seed))`` for ``algo``."""

@final
class Admission:
    """A successful ``admit`` (either cache); unpacks as ``(num_cached_tokens, block_ids)``."""

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
    """A run of consecutive blocks became cached (vLLM ``BlockStored``; hashes: low 64 bits
    of the digest, big-endian). Fields in vLLM 0.33's order; equal when all fields are;
    picklable."""

    def __new__(
        cls,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_id: int | None = None,
        medium: str | None = None,
        lora_name: str | None = None,
        extra_keys: Sequence[Sequence[Any] | None] | None = None,
        group_idx: int | None = None,
        kv_cache_spec_kind: str | None = None,
        kv_cache_spec_sliding_window: int | None = None,
        locality: Any = None,
        ownership: Any = None,
        session_id: Any = None,
        lookahead_token_ids: Sequence[int] | None = None,
    ) -> Self: ...
    @property
    def block_hashes(self) -> list[int]: ...
    @property
    def parent_block_hash(self) -> int | None: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def lora_id(self) -> int | None: ...
    @property
    def medium(self) -> str | None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def extra_keys(self) -> list[tuple[Any, ...] | None] | None:
        """Per block: untagged extra keys (LoRA name, salt, ``(mm identifier, offset)``) or None."""
    @property
    def group_idx(self) -> int | None: ...
    @property
    def kv_cache_spec_kind(self) -> str | None: ...
    @property
    def kv_cache_spec_sliding_window(self) -> int | None: ...
    @property
    def locality(self) -> Any: ...
    @property
    def ownership(self) -> Any: ...
    @property
    def session_id(self) -> Any: ...
    @property
    def lookahead_token_ids(self) -> list[int] | None: ...
    def to_dict(self) -> dict[str, Any]:
        """The event as a dict: ``type`` first, then every field in vLLM's order."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@final
class BlockRemoved:
    """Blocks stopped being cached (vLLM ``BlockRemoved``; one event per evicted physical
    block from the hash-chain cache, one per evicted leaf from the radix cache)."""

    def __new__(
        cls,
        block_hashes: Sequence[int],
        medium: str | None = None,
        group_idx: int | None = None,
        locality: Any = None,
        ownership: Any = None,
    ) -> Self: ...
    @property
    def block_hashes(self) -> list[int]: ...
    @property
    def medium(self) -> str | None: ...
    @property
    def group_idx(self) -> int | None: ...
    @property
    def locality(self) -> Any: ...
    @property
    def ownership(self) -> Any: ...
    def to_dict(self) -> dict[str, Any]:
        """The event as a dict: ``type`` first, then every field in vLLM's order."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@final
class AllBlocksCleared:
    """Every cached block was dropped (reset)."""

    def __new__(cls) -> Self: ...
    def to_dict(self) -> dict[str, Any]:
        """The event as a dict (``{"type": "AllBlocksCleared"}``)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@final
class VllmRequestHasher:
    """vLLM 0.33's ``request_block_hasher`` as one native call per request (see
    :mod:`kvindex.integrations.vllm.hashing`)."""

    def __new__(
        cls,
        block_size: int,
        algo: str,
        *,
        none_hash: Any,
        fallback: Callable[[Any], list[bytes]],
    ) -> Self: ...
    def __call__(self, request: Any) -> list[bytes]:
        """The hashes of ``request``'s blocks that became full since its last
        ``block_hashes`` entry (vLLM's ``request_block_hasher(request)``)."""
    @property
    def algo(self) -> str:
        """The algorithm, as vLLM names it."""
    @property
    def block_size(self) -> int:
        """Tokens per hashed block."""
    @property
    def fallback_calls(self) -> int:
        """How many calls went to the fallback so far."""

# The methods both request-level caches share are declared once, here.
@disjoint_base
class PrefixCache:
    """A request-level KV prefix cache over a pool of ``num_blocks`` blocks (block 0 is the
    null block; tables are padded with 0): the base class of :class:`HashChainCache` and
    :class:`RadixPrefixCache`, which share every method declared here.

    Owned by one scheduler thread; every method runs without releasing the GIL. Caller
    errors raise :class:`KvIndexError` subclasses and change nothing; running out of
    blocks is a return value (``None`` / ``False``). Not constructible itself
    (``InvalidArgumentError``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block 0 included."""
    @property
    def block_size(self) -> int:
        """Tokens per block (the radix cache's page size)."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks new work can get now: free blocks plus idle cached ones (the hash chain's
        cached blocks in the free queue, the radix tree's evictable pages).
        """
    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by running requests:
        ``1 - num_free_blocks / (num_blocks - 1)``.
        """
    @property
    def num_requests(self) -> int:
        """Running (admitted, not freed) requests."""
    @property
    def num_cached_blocks(self) -> int:
        """Cached blocks (distinct block hashes; tree pages for the radix cache)."""
    @property
    def num_common_prefix_blocks(self) -> int:
        """Blocks shared by every running request, counted from block 0 (what cascade
        attention can share); 0 when no request runs. O(shared blocks)."""
    @property
    def stats(self) -> dict[str, float]:
        """``requests``, ``queries`` (prompt tokens), ``hits`` (cached tokens), ``evictions``
        (cached blocks that lost their hash; pages for the radix cache), ``hit_rate``,
        ``events_dropped`` (KV events the full buffer dropped, oldest first)."""
    def take_stats(self) -> dict[str, float]:
        """Returns :attr:`stats` and zeroes the counters."""
    def __contains__(self, request_id: int, /) -> bool: ...
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
        """Starts a request: pins the longest cached prefix of the prompt (capped at
        ``num_tokens - 1`` and aligned to the block size, so the last prompt token is always
        computed) and allocates blocks for the rest. Returns ``None`` with nothing changed
        when free blocks run short (idle cached blocks count as available). The hash chain
        caches every full prompt block now; the radix cache inserts the sequence at ``free``
        or ``checkpoint``. With ``skip_reading`` (vLLM's prompt-logprobs requests) nothing is
        read from the cache but the prompt is still cached. The radix cache keys on
        ``cache_salt`` and ``lora`` and rejects ``mm_items``. Raises
        ``DuplicateRequestError`` for a running id and ``RequestTooLargeError`` (a
        ``CapacityError``) for a prompt that needs more blocks than the pool's usable
        ``num_blocks - 1``: ``None`` means "not now", the error "never". The hash chain
        keeps a refused prompt's hashes for the scheduler's retry of the same id (at most
        32 prompts, oldest dropped first; ``reset()`` releases them).
        """
    def lookup(
        self,
        tokens: _Tokens,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> int:
        """Tokens a prompt would hit now (as ``admit`` counts them). No side effects."""
    def append(self, request_id: int, tokens: _Tokens) -> bool:
        """Appends computed decode tokens; allocates a block when one fills (the hash chain
        caches every newly full block). ``False`` (nothing changed) when a needed block is
        not free.
        """
    def append_batch(
        self,
        request_ids: npt.NDArray[np.int64],
        tokens: _Tokens,
        offsets: npt.NDArray[np.int64] | None = None,
    ) -> bool:
        """One step's decode tokens for many requests, all or nothing: request ``i`` gets
        ``tokens[offsets[i]:offsets[i+1]]`` (one token each when ``offsets`` is None).
        Ids must be distinct. ``False`` (nothing changed) when blocks run short."""
    def checkpoint(self, request_id: int) -> None:
        """Makes the running request's full blocks hittable by other requests now
        (the radix cache inserts them, as SGLang ``cache_unfinished_req``; the
        hash chain caches full blocks as they fill, so only the id is checked).
        With the lifecycle calls both designs make the same blocks hittable: those
        of known ids up to the last step (a block a commit completes, from the next
        ``schedule``), none of a ``delay_cache`` admission before ``finish_transfer``.
        """
    def free(self, request_id: int) -> None:
        """Finishes a request. The hash chain returns its blocks to the free queue in reverse
        order (cached ones stay hittable); the radix cache inserts its full pages into the
        tree and returns the rest to the pool.
        """
    def free_batch(self, request_ids: npt.NDArray[np.int64]) -> None:
        """Finishes many requests, in order; all ids are checked first."""
    def admit_chunk(
        self,
        request_id: int,
        tokens: _Tokens,
        *,
        chunk: int | None = None,
        lookahead: int = 0,
        must_fit: bool = False,
        external_prefix: int = 0,
        delay_cache: bool = False,
        reserved_blocks: int = 0,
        watermark_blocks: int = 0,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
        skip_reading: bool = False,
    ) -> tuple[int, int, npt.NDArray[np.int32]] | None:
        """Admits a new request the way vLLM's scheduler admits a waiting one: looks the
        prompt up (hit capped at ``num_tokens - 1``, block aligned), takes the
        ``external_prefix`` tokens beyond the hit as computed elsewhere (an offload tier,
        a prefill worker), then allocates ``min(rest, chunk)`` tokens plus ``lookahead``
        slots and caches the full blocks of the scheduled tokens now (other requests hit
        them from this step on). With ``delay_cache`` and external tokens nothing is
        scheduled or cached until ``finish_transfer``. ``must_fit``: the whole sequence
        must fit in the free blocks; ``reserved_blocks`` must stay free;
        ``watermark_blocks`` (vLLM's watermark, 0 when nothing else is scheduled) counts
        as used. Returns ``(hit_tokens, scheduled_tokens, new_block_ids)``, or ``None``
        with nothing changed. ``admit(rid, prompt)`` is ``admit_chunk`` without a chunk.
        """
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
        """Resumes a preempted request with its prompt and outputs so far, as ``admit_chunk``
        admits a new one (its hits count in :attr:`resumed_stats`). Same answer.
        """
    def schedule(
        self,
        request_id: int,
        num_new_tokens: int,
        *,
        lookahead: int = 0,
        draft_tokens: _Tokens | None = None,
        reserved_blocks: int = 0,
    ) -> npt.NDArray[np.int32] | None:
        """Schedules a running request's next prefill chunk or decode step:
        ``num_new_tokens`` positions (the last ``len(draft_tokens)`` of them speculative
        drafts) plus ``lookahead`` slots that are never cached. Positions may run ahead of
        the known ids by the sampled placeholders (async scheduling); full blocks of known
        ids up to the scheduled positions are cached now. Returns the new block ids, or
        ``None`` (nothing changed) when blocks, less ``reserved_blocks``, run short.
        """
    def schedule_batch(
        self,
        request_ids: npt.NDArray[np.int64],
        num_new_tokens: npt.NDArray[np.int64],
        *,
        lookahead: int = 0,
        draft_tokens: _Tokens | None = None,
        draft_offsets: npt.NDArray[np.int64] | None = None,
    ) -> tuple[int, npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """``schedule`` for many running requests in order, one call per step: request ``i``
        gets ``num_new_tokens[i]`` positions and the drafts
        ``draft_tokens[draft_offsets[i]:draft_offsets[i+1]]``. Stops at the first request
        the blocks do not cover (preempt and call again with the rest). Returns
        ``(num_scheduled, block_ids, block_offsets)``: request ``i``'s new blocks are
        ``block_ids[block_offsets[i]:block_offsets[i+1]]``. Caller errors are checked for
        every request before any is scheduled.
        """
    def commit_tokens(self, request_id: int, tokens: _Tokens, num_rejected: int = 0) -> None:
        """Commits the ids sampled for a running request's step in flight: the accepted
        drafts first, then sampled ids filling the placeholders ``schedule`` reserved;
        ``num_rejected`` trailing drafts are rolled back (their slots stay in the table,
        the next step reuses them). A block whose last id is now known is cached at the
        request's next ``schedule``. Raises ``KvIndexError`` (nothing changed) for ids
        that do not fit the reserved placeholders.
        """
    def commit_batch(
        self,
        request_ids: npt.NDArray[np.int64],
        tokens: _Tokens,
        offsets: npt.NDArray[np.int64] | None = None,
        num_rejected: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """``commit_tokens`` for many requests, all or nothing: request ``i`` gets
        ``tokens[offsets[i]:offsets[i+1]]`` (one id each when ``offsets`` is None) and
        ``num_rejected[i]`` rejected drafts (none when None).
        """
    def preempt(self, request_id: int) -> None:
        """Preempts a request (vLLM's ``_preempt_request``): its blocks return to the pool,
        its computed positions, drafts and placeholders are dropped; its tokens stay for
        ``resume``.
        """
    def finish(self, request_id: int) -> None:
        """Finishes (or aborts) a request in any state: its blocks return to the pool and
        nothing more is cached (``free`` lets the radix cache insert the whole sequence).
        """
    def finish_transfer(self, request_id: int) -> None:
        """The external KV of a ``delay_cache`` admission landed: its computed positions are
        capped at ``num_tokens - 1``, the blocks up to there are cached, and the request
        continues with ``schedule``.
        """
    def request_state(self, request_id: int) -> dict[str, Any]:
        """A request's lifecycle counters: ``status`` (``running``, ``preempted``,
        ``waiting_for_remote_kvs``), ``num_computed`` (positions computed or scheduled),
        ``num_tokens`` (known ids), ``pending`` (sampled placeholders), ``drafts`` (of the
        step in flight), ``num_preemptions``.
        """
    @property
    def resumed_stats(self) -> dict[str, float]:
        """:attr:`stats` of admissions that resumed a preempted request (vLLM's
        ``preempted_*`` prefix-cache stats), counted apart; ``take_stats`` zeroes them too.
        """
    def reset(self) -> None:
        """Drops every cached block and the refused prompts kept for a retry.
        Raises ``BlockInUseError`` while requests run.
        """
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drains buffered KV events (empty unless ``enable_events``)."""
    def block_tables(
        self,
        request_ids: npt.NDArray[np.int64],
        max_blocks: int | None = None,
        out: npt.NDArray[np.int32] | None = None,
    ) -> npt.NDArray[np.int32]:
        """Block tables ``[len(request_ids), max_blocks]`` padded with the null block 0,
        written into ``out`` when given (no allocation in the steady state). An output this
        machine cannot allocate raises ``CapacityError``.
        """
    def slot_mapping(
        self, request_ids: npt.NDArray[np.int64], query_lens: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """``block * block_size + offset`` of each request's last ``query_lens[i]`` tokens,
        concatenated. An output this machine cannot allocate raises ``CapacityError``.
        """
    def num_tokens(self, request_id: int) -> int:
        """Tokens a running request holds KV positions for (prompt + appended tokens; with
        the lifecycle calls, the positions computed or scheduled, drafts included).
        """
    def request_blocks(self, request_id: int) -> npt.NDArray[np.int32]:
        """A running request's block table."""
    def free_blocks(self) -> npt.NDArray[np.int32]:
        """Blocks no request or cache entry holds, in the order the pool hands
        them out (the hash chain's free queue also holds idle cached blocks).
        """
    def ref_count(self, block_id: int) -> int:
        """References on a block (requests holding it, plus the radix tree)."""
    def check_invariants(self) -> None:
        """Raises ``InvariantViolation`` if any internal invariant is broken."""

@final
class HashChainCache(PrefixCache):
    """Prefix cache over chained block hashes and a ref-counted block pool (vLLM 0.33 semantics).

    Block 0 is the null block (never allocated; pads block tables). Free blocks form
    an LRU queue: new blocks come from its head; a finished request's blocks return in
    reverse table order, unhashed ones to the head and cached ones to the tail; a
    cached block keeps its hash until it is handed out again. A lookup hits the
    longest run of cached block hashes from block 0, capped at ``num_tokens - 1``
    (the last prompt token is always recomputed) and aligned to the block size.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        *,
        algo: str = "xxh3_128",
        seed: str | None = None,
        enable_events: bool = False,
        max_events: int = 100000,
    ) -> Self: ...
    @property
    def algo(self) -> str:
        """The hash algorithm (one of ``HASH_ALGOS``)."""
    def evict_blocks(self, block_ids: _BlockIds) -> int:
        """Drops the cached hashes of idle blocks (they keep their queue position).
        ``block_ids``: a 1-D C-contiguous ``int32``/``int64`` array or a list / tuple of
        ints (anything else raises ``DTypeError``). Raises ``BlockInUseError`` for a block
        a request holds. Returns blocks evicted."""
    def request_block_hashes(self, request_id: int) -> npt.NDArray[np.uint8]:
        """The chained hashes of a running request's full blocks, ``[n, digest_len]`` uint8."""
    def free_queue(self) -> npt.NDArray[np.int32]:
        """Alias of :meth:`free_blocks`."""
    def block_hash(self, block_id: int) -> bytes | None:
        """The block's cached hash, or None."""

# ---------------------------------------------------------------------------- radix tree

RADIX_POLICIES: list[str]

@final
class MatchResult:
    """Result of :meth:`RadixTree.match_prefix`; unpacks as ``(hit_len, slots, node)``."""

    @property
    def hit_len(self) -> int:
        """Matched tokens (a multiple of the page size)."""
    @property
    def slots(self) -> npt.NDArray[np.int32]:
        """KV slots of the matched tokens, one per token."""
    @property
    def node(self) -> int:
        """Handle of the last matched node (0, the root, on a miss); lock it to protect the hit."""
    def __iter__(self) -> Iterator[Any]: ...
    def __len__(self) -> int: ...

@final
class InsertResult:
    """Result of :meth:`RadixTree.insert`; unpacks as ``(prefix_len, to_free)``."""

    @property
    def prefix_len(self) -> int:
        """Leading tokens that were already in the tree (a multiple of the page size)."""
    @property
    def to_free(self) -> npt.NDArray[np.int32]:
        """Slots passed in that the tree did not take (duplicates of its prefix, and the
        unaligned tail when page_size > 1): the caller frees exactly these."""
    def __iter__(self) -> Iterator[Any]: ...
    def __len__(self) -> int: ...

@final
class RadixTree:
    """Radix tree over token ids with SGLang ``RadixCache`` semantics (the tree alone:
    the caller owns the slots; :class:`RadixPrefixCache` is the request-level cache).

    Edges hold token runs (a multiple of ``page_size``); values are KV slots. With
    ``page_size > 1`` queries are cut to a page multiple and each page's slots must be
    a page-aligned run. A match ending inside an edge splits it. Recency is a logical
    clock (one tick per match/insert). Node handles are ints naming the tree that
    issued them (``tag << 64 | generation << 32 | index``; the root is 0); a handle to
    an evicted node, any handle after ``reset()``, or a handle from another tree
    raises ``StaleHandleError``. Policies: ``RADIX_POLICIES``.
    """

    def __new__(
        cls,
        page_size: int = 1,
        *,
        policy: str = "lru",
        slru_threshold: int = 2,
        enable_events: bool = False,
        max_events: int = 100000,
        sliding_window: int | None = None,
        mamba: bool = False,
        groups: Sequence[tuple[str, int, int, str]] | None = None,
    ) -> Self: ...
    @property
    def page_size(self) -> int:
        """Tokens per page (edges and hits are multiples of it)."""
    @property
    def policy(self) -> str:
        """The eviction policy (one of ``RADIX_POLICIES``)."""
    @property
    def total_size(self) -> int:
        """Tokens in the tree (``evictable_size + protected_size``)."""
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
    @property
    def protected_size(self) -> int:
        """Tokens in locked nodes."""
    @property
    def num_nodes(self) -> int:
        """Live nodes, the root included."""
    @property
    def clock(self) -> int:
        """The logical clock (one tick per match/insert)."""
    def match_prefix(self, tokens: _Tokens, namespace: str | None = None) -> MatchResult:
        """Longest cached page-aligned prefix; stamps the path, may split an edge. int64 tokens
        are read in place (a token outside the int32 range matches nothing).
        """
    def probe(self, tokens: _Tokens, namespace: str | None = None) -> int:
        """Hit length a match would report now; changes nothing."""
    def insert(
        self,
        tokens: _Tokens,
        slots: _Tokens,
        namespace: str | None = None,
        *,
        priority: int = 0,
        swa_evicted_len: int = 0,
        mamba_state: int | None = None,
        inserted_len: int = 0,
    ) -> InsertResult:
        """Inserts a sequence with one slot per token; returns the present prefix and the
        slots the caller must free. Rejects (unchanged) a slot the tree holds elsewhere
        or one passed twice.

        ``inserted_len``: tokens this caller inserted before (SGLang's
        ``cache_inserted_len``); only nodes the path reaches past it count a hit."""
    def lock(self, node: int) -> None:
        """Protects the path root..node from eviction (the root: no-op)."""
    def unlock(self, node: int) -> None:
        """Releases a lock taken on this node; ``LockError`` if it holds none of its own."""
    def lock_ref(self, node: int) -> int:
        """Locks held on the node itself."""
    def path_slots(self, node: int) -> npt.NDArray[np.int32]:
        """Slots of the path root..node, in order."""
    def cached_page_hashes(self) -> npt.NDArray[np.uint64]:
        """The KV-event page hashes the tree holds (uint64, ascending, each once): the set a
        subscriber holds after applying every event the tree emitted (if the bounded
        event buffer dropped none). Read-only. ``InvalidArgumentError`` unless
        ``enable_events`` (the tree hashes no page then)."""
    def all_slots(self) -> npt.NDArray[np.int32]:
        """Every slot the tree holds."""
    def evict(self, num_tokens: int) -> npt.NDArray[np.int32]:
        """Evicts whole unlocked leaves in policy order until ``num_tokens`` are freed (may
        free more); returns the freed slots (the caller owns the slots, so the tree hands
        them back)."""
    def reset(self) -> npt.NDArray[np.int32]:
        """Drops every node (handles go stale); returns the slots the tree held."""
    def match_node(self, tokens: _Tokens, namespace: str | None = None) -> tuple[int, int]:
        """``match_prefix`` returning ``(hit_len, node)`` only: the same stamps and
        splits, no slot array (read it with :meth:`path_slots_i64` when needed)."""
    def path_slots_i64(self, node: int) -> npt.NDArray[np.int64]:
        """Slots of the path root..node as int64 (``path_slots`` in SGLang's index dtype)."""
    def insert_len(
        self,
        tokens: _Tokens,
        slots: _Tokens,
        namespace: str | None = None,
        *,
        priority: int = 0,
        inserted_len: int = 0,
    ) -> int:
        """Inserts ``tokens`` cut to whole pages with the first slots of ``slots`` (one per
        kept token; extra slots are ignored, not freed); returns the tokens already present.
        The caller frees its slots for ``[its hit, prefix)`` itself. Errors as ``insert``."""
    def evict_leaves(self, num_tokens: int, *, pages: bool = False) -> list[npt.NDArray[np.int64]]:
        """Evicts whole unlocked leaves in policy order until ``num_tokens`` are freed (may
        free more); returns one int64 array per leaf, in eviction order: its slots, or
        with ``pages=True`` its page ids (``slot // page_size`` of each page's first slot)."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drains buffered KV events (empty unless ``enable_events``)."""
    @property
    def events_dropped(self) -> int:
        """KV events the full buffer dropped (oldest first) since the tree was built."""
    def check_invariants(self) -> None:
        """Raises ``InvariantViolation`` if any internal invariant is broken."""
    def dump(self) -> str:
        """A human-readable dump, one line per node."""
    def __len__(self) -> int: ...
    @property
    def sliding_window(self) -> int | None:
        """The SWA window in tokens (``None``: no sliding-window component)."""
    @property
    def mamba(self) -> bool:
        """Whether the tree keeps a Mamba state per node."""
    @property
    def swa_evictable_size(self) -> int:
        """Tokens of live SWA KV held by no SWA lock."""
    @property
    def swa_protected_size(self) -> int:
        """Tokens of live SWA KV under an SWA (window) lock."""
    @property
    def mamba_evictable_size(self) -> int:
        """Mamba states held by no lock."""
    @property
    def mamba_protected_size(self) -> int:
        """Mamba states under a lock."""
    def evict_swa(self, num_tokens: int) -> npt.NDArray[np.int32]:
        """Evicts SWA KV until ``num_tokens`` SWA tokens are freed: the least recent
        SWA-unlocked node; a deletable leaf is deleted (its slots are returned), an
        inner node becomes a tombstone (its SWA slots, and Mamba state, wait in
        :meth:`take_component_frees`)."""
    def evict_mamba(self, num_states: int) -> npt.NDArray[np.int32]:
        """Evicts ``num_states`` Mamba states: the least recent unlocked one; a deletable
        leaf is deleted (its slots are returned), an inner node only loses its state."""
    def take_component_frees(
        self,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], list[int], bool]:
        """Drains the component frees of the operations since the last call:
        ``(swa_slots, full_only_slots, mamba_states, mamba_exist)``. ``swa_slots``: slots
        whose SWA KV was freed; ``full_only_slots``: slots to free without their SWA KV
        (a revived tombstone's old slots, or the caller's whose SWA a locked tombstone
        adopted); ``mamba_exist``: an insert ended on a node that already had a state
        (the caller frees its own)."""
    def node_components(self, node: int) -> tuple[bool, int, int | None, int]:
        """``(swa_live, swa_lock_ref, mamba_state, mamba_lock_ref)`` of a node."""
    def component_lru(self, component: str) -> list[int]:
        """Node handles of a component's recency list (``"swa"`` or ``"mamba"``), least
        recent first."""

#: The tree's former name.
RadixCache = RadixTree

@final
class RadixPrefixCache(PrefixCache):
    """Request-level prefix cache over the radix tree, driven like :class:`HashChainCache`.

    ``num_blocks`` pages of ``block_size`` slots (page 0 is the null page; tables pad
    with 0); block ids are page ids, so ``block_size=1`` gives token-level tables.
    Hits are capped at ``num_tokens - 1``. Sequences enter the tree at ``free`` (or
    ``checkpoint``); unlocked leaves are evicted inside ``admit``/``append`` when the
    pool runs short.

    Names: ``block_size`` is the one size (the tree's page size, which only
    :class:`RadixTree` calls ``page_size``); counts of blocks end in ``_blocks``; the
    tree's token counts keep SGLang's names (``cached_tokens``, ``evictable_size``,
    ``protected_size``).
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        *,
        policy: str = "lru",
        slru_threshold: int = 2,
        enable_events: bool = False,
        max_events: int = 100000,
        groups: Sequence[tuple[str, int, int, str]] | None = None,
        swa_blocks: int | None = None,
        mamba_states: int | None = None,
    ) -> Self: ...
    @property
    def policy(self) -> str:
        """The tree's eviction policy (one of ``RADIX_POLICIES``)."""
    @property
    def swa_blocks(self) -> tuple[int, int, int] | None:
        """Pages of the sliding-window pool: ``(free, used, capacity)``, or None without a
        sliding-window group. A page's SWA KV is freed once it leaves every window
        (a tombstone in the tree keeps its full KV)."""
    @property
    def mamba_states(self) -> tuple[int, int, int] | None:
        """Mamba state slots: ``(free, used, capacity)``, or None without a Mamba group.
        Each running request holds one; the tree holds the others."""
    @property
    def swa_sizes(self) -> tuple[int, int]:
        """``(evictable, protected)`` tokens of live sliding-window KV in the tree."""
    @property
    def mamba_sizes(self) -> tuple[int, int]:
        """``(evictable, protected)`` Mamba states in the tree."""
    @property
    def num_unused_blocks(self) -> int:
        """Blocks no request and no tree node holds (``num_free_blocks`` also counts the
        tree's evictable pages)."""
    @property
    def cached_tokens(self) -> int:
        """Tokens in the tree."""
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked tree nodes."""
    @property
    def protected_size(self) -> int:
        """Tokens in locked tree nodes."""
    def evict(self, num_tokens: int) -> int:
        """Evicts unlocked tree leaves until ``num_tokens`` are freed (may free more);
        returns the tokens evicted (their pages return to the cache's own pool)."""
    def num_cached_tokens(self, request_id: int) -> int:
        """Leading tokens of a running request served by cached tree pages."""
    def cached_page_hashes(self) -> npt.NDArray[np.uint64]:
        """The KV-event page hashes the tree holds (uint64, ascending, each once): the set a
        subscriber holds after applying every event the cache emitted (if the bounded
        event buffer dropped none). Read-only. ``InvalidArgumentError`` unless
        ``enable_events`` (the tree hashes no page then)."""
    def cached_blocks(self) -> npt.NDArray[np.int32]:
        """The pages the tree holds."""
    def dump(self) -> str:
        """A human-readable dump of the tree, one line per node."""

_Event = BlockStored | BlockRemoved | AllBlocksCleared
_Cache = PrefixCache | RadixTree

@final
class EventEncoder:
    """Encodes KV events as vLLM 0.33 ``KVEventBatch`` msgpack payloads
    (``[ts, events, data_parallel_rank]``, events map-tagged by ``"type"``, or with
    ``array_tagged`` the older ``[type, field, ...]`` form). ``medium``, ``group_idx``,
    ``kv_cache_spec_kind`` are written into a cache's own events (whose ``lora_id``
    is None: kvindex keys LoRA adapters by name)."""

    def __new__(
        cls,
        *,
        data_parallel_rank: int | None = 0,
        medium: str | None = "GPU",
        group_idx: int | None = 0,
        kv_cache_spec_kind: str | None = "full_attention",
        array_tagged: bool = False,
    ) -> Self: ...
    @property
    def data_parallel_rank(self) -> int | None: ...
    @property
    def array_tagged(self) -> bool: ...
    @property
    def medium(self) -> str | None: ...
    @property
    def group_idx(self) -> int | None: ...
    @property
    def kv_cache_spec_kind(self) -> str | None: ...
    def encode(self, cache: _Cache, ts: float, *, skip_empty: bool = True) -> bytes | None:
        """Drains ``cache``'s buffered events into one payload stamped ``ts``;
        with ``skip_empty``, ``None`` when there were none."""
    def encode_events(self, events: Iterable[_Event], ts: float) -> bytes:
        """Encodes event objects (as they are, ignoring this encoder's metadata)
        into one payload stamped ``ts``."""

def decode_event_batch(
    payload: bytes, *, block_size: int | None = None
) -> tuple[float, list[_Event], int | None, list[str]]:
    """Decodes a ``KVEventBatch`` payload (map- or array-tagged events; hashes as
    unsigned or signed ints or bytes) into ``(ts, events, data_parallel_rank,
    skipped_types)``. Raises ``InvalidArgumentError`` for malformed input."""

# ---------------------------------------------------------------- cluster index

@final
class ClusterIndex:
    """Prefix index of a cluster of workers (one per engine and data-parallel rank),
    fed by their KV-event batches. Thread-safe: one thread may apply batches while
    others query. Per-worker answers are int32 arrays of length :attr:`slots`.

    Queries by tokens hash the prompt as the workers' events do: ``algo`` names a
    hash-chain algorithm (``HashChainCache`` workers; ``seed`` is its chain seed) or
    ``"radix_xxh3_64"`` for ``RadixPrefixCache`` workers (the tree's page hashes,
    namespaced by ``lora`` and ``cache_salt``; no ``seed``; ``mm_items`` and ids
    outside int32 raise ``InvalidArgumentError`` as that cache does).

    ``apply`` outcomes: ``"applied"``; ``"duplicate"`` (sequence number already
    applied with the same payload, ignored); ``"gap"`` (not applied; the second
    element is the first missing sequence number: replay from it, or ``give_up``);
    ``"restarted"`` (sequence went back: the worker's blocks were dropped and this
    batch, sequence 0, applied); ``"malformed: <why>"`` (undecodable, another
    block size or data-parallel rank: counted, worker degraded, nothing applied);
    ``"unknown_worker"`` (counted in
    :attr:`unknown_worker_batches`)."""

    def __new__(
        cls, block_size: int, *, algo: str = "xxh3_128", seed: str | None = None
    ) -> Self: ...
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def algo(self) -> str:
        """The workers' hash scheme (for queries by tokens): a hash-chain algorithm or
        ``"radix_xxh3_64"`` (the radix tree's page hashes)."""
    @property
    def seed(self) -> str | None:
        """The workers' chain seed (None: the algorithm's default)."""
    @property
    def slots(self) -> int:
        """Number of worker slots: the length of every per-worker answer."""
    @property
    def num_blocks(self) -> int:
        """Distinct blocks in the index."""
    @property
    def num_pairs(self) -> int:
        """(block, worker) pairs in the index."""
    @property
    def memory_bytes(self) -> int:
        """Bytes held by the index's tables."""
    @property
    def membership(self) -> int:
        """A counter bumped by every worker added or removed."""
    @property
    def unknown_worker_batches(self) -> int:
        """Batches addressed to a slot without a worker."""
    def add_worker(self, name: str, dp_rank: int = 0) -> int:
        """Adds a worker (one event stream); returns its slot. Resyncing until its first batch."""
    def remove_worker(self, worker: int) -> None:
        """Removes a worker and its blocks; its slot may be reused."""
    def apply(self, worker: int, seq: int | None, payload: bytes) -> tuple[str, int]:
        """Applies one batch payload of `worker` with sequence number `seq`.
        Returns `(outcome, expected_seq)`; outcomes are listed in the class docstring."""
    def give_up(self, worker: int, seq: int) -> None:
        """Gives up on `worker`'s batches before `seq`: degraded, stream continues at `seq`."""
    def store_hashes(self, worker: int, hashes: _Hashes) -> None:
        """Records `hashes` (uint64) as held by `worker`, without a stream."""
    def remove_hashes(self, worker: int, hashes: _Hashes) -> int:
        """Drops one reference of `worker` to each of `hashes`; returns how many were not held."""
    def hashes(
        self,
        tokens: _TokensOrSeq,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> npt.NDArray[np.uint64]:
        """The prompt's block hashes as events carry them (uint64)."""
    def overlaps(
        self,
        tokens: _TokensOrSeq,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> npt.NDArray[np.int32]:
        """Per worker slot: leading blocks of the prompt it holds (int32)."""
    def overlaps_for_hashes(self, hashes: _Hashes) -> npt.NDArray[np.int32]:
        """Per worker slot: leading `hashes` (uint64) it holds (int32)."""
    def set_worker_layout(
        self, worker: int, groups: Sequence[_GroupTuple] | None, *, use_eagle: bool | None = None
    ) -> None:
        """Declares `worker`'s KV cache groups (None: forgets them): a list of
        `(kind, block_size, size, mamba_mode)` tuples in group order (`kind` as events
        spell `kv_cache_spec_kind`; `size` the window or chunk, else 0; `mamba_mode`
        "none"/"align" for Mamba, else ""). Its events must then carry each group's
        block size, and `scores`/`route` give it the hit its engine would give over
        those groups. The layout's hash block size (the gcd) must be the index's."""
    def scores(
        self,
        tokens: _TokensOrSeq,
        *,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> tuple[npt.NDArray[np.int32], list[str]]:
        """Per worker slot: the prompt's blocks its engine would reuse (int32), and how
        each was scored: `"layout"` (its declared groups' hybrid hit, bounded at
        `len(tokens) - 1` as vLLM bounds a hit), `"full_only"` (no layout: the leading
        blocks of its full-attention group), `"full_only_hybrid_events"` (the same, but
        its events named other groups, whose rules the score ignores) or `""` (no worker)."""
    def route(
        self,
        tokens: _TokensOrSeq,
        load: _Load,
        *,
        overlap_weight: float = 1.0,
        start: int = 0,
        cache_salt: str | None = None,
        lora: _Lora = None,
        mm_items: _MmItems = None,
    ) -> tuple[int, int, int]:
        """Picks the worker of lowest `overlap_weight * (blocks - overlap) + load`
        (`load`: float64 per slot, NaN = not eligible). Returns `(slot or -1,
        its overlap in blocks, the prompt's full blocks)`."""
    def statuses(self) -> list[str]:
        """Per slot: `"live"`, `"resyncing"`, `"degraded"` or `""` (no worker)."""
    def status(self, worker: int) -> str:
        """One slot's status: `"live"`, `"resyncing"`, `"degraded"` or `""` (no worker)."""
    def incarnations(self) -> list[int]:
        """Per slot: the worker's incarnation (a number no earlier worker of any slot had),
        0 for an empty slot."""
    def worker_info(self, worker: int) -> dict[str, Any]:
        """One worker's name, dp rank, status, block count, next sequence number,
        incarnation and counters."""
    def worker_blocks(self, worker: int) -> npt.NDArray[np.uint64]:
        """Every block hash `worker` holds, sorted (uint64); a block of KV cache group
        `g > 0` appears as its group key (the hash xor `g * 0x9E3779B97F4A7C15`).
        O(blocks in the index)."""
    def snapshot_worker(self, worker: int) -> tuple[npt.NDArray[np.uint64], int]:
        """One worker's state: every block hash it holds (group keys for groups > 0, as
        `worker_blocks` gives them), once per announcement, sorted (uint64), and the
        sequence number its stream continues from."""
    def restore_worker(self, worker: int, hashes: _Hashes, next_seq: int) -> None:
        """Replaces a worker's state by a snapshot: it holds `hashes` (uint64; a repeat is
        one more reference), its stream continues at `next_seq`, status live."""
    def check_invariants(self) -> None:
        """Raises `InvariantViolation` if the index is inconsistent."""

# ------------------------------------------------------------ vLLM manager (private)

@final
class _VllmManager:
    """vLLM 0.33's block manager (one or several KV cache groups) over kvindex's block pool."""

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        log_removed: bool = False,
        log_new: bool = False,
        groups: Sequence[tuple[str, int, int, str]] | None = None,
        hash_block_size: int | None = None,
        use_eagle: bool = False,
        max_in_flight_tokens: int | None = None,
        max_model_len: int | None = None,
        allow_partial_hash_hits: bool = False,
        eagle_groups: Sequence[bool] | None = None,
        spec_classes: Sequence[int] | None = None,
    ) -> Self: ...
    @property
    def num_groups(self) -> int:
        """Number of KV cache groups."""
    @property
    def hash_block_size(self) -> int:
        """Tokens per request block hash (the gcd of the group block sizes)."""
    @property
    def scheduler_block_size(self) -> int:
        """The scheduler block size (hybrid hits are multiples of it)."""
    @property
    def group_block_sizes(self) -> list[int]:
        """Each group's block size, in group order."""
    @property
    def spec_sets(self) -> list[tuple[list[int], bool]]:
        """The spec sets the hit lookup walks (vLLM's coordinator ``attention_groups``),
        full attention first: ``(member group ids, drops the EAGLE block)`` each; groups
        that are not prefix-cacheable are in none."""
    @property
    def group_eagle_flags(self) -> list[bool]:
        """Per group, whether its hits and caching drop the EAGLE block (vLLM's
        single-type ``use_eagle``: its spec set's flag), in group order."""
    @property
    def last_cached_runs(
        self,
    ) -> list[tuple[int, int, int, npt.NDArray[np.int32], int, int, int]]:
        """The runs the last ``allocate_slots_groups`` / ``cache_groups`` call cached."""
    def find_hit_groups(
        self, hashes: Sequence[bytes], max_tokens: int
    ) -> tuple[int, int, list[npt.NDArray[np.int32]]]:
        """vLLM's ``find_longest_cache_hit`` over all groups: ``(hit tokens, uncached
        common prefix tokens, per-group hit blocks)``; ``hashes`` are the request's
        ``block_hashes`` (at :attr:`hash_block_size`)."""
    def find_hit_per_group(
        self, hashes: Sequence[bytes], max_tokens: int
    ) -> tuple[list[npt.NDArray[np.int32]], list[int]]:
        """vLLM's ``find_longest_cache_hit_per_group`` (for KV connectors that accept
        diverging hybrid hits): ``(per-group hit blocks, per-group hit tokens)`` with each
        spec set looked up on its own; a group in no spec set hits nothing."""
    def num_blocks_to_allocate_groups(
        self,
        request_id: str,
        num_tokens: int,
        new_computed: Sequence[Sequence[int] | npt.NDArray[np.int32]] | None,
        total_computed: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: int | None = None,
        num_encoder_tokens: int = 0,
        num_local_computed: int | None = None,
    ) -> int:
        """vLLM's coordinator ``get_num_blocks_to_allocate`` (the sum over groups).
        ``num_tokens_main_model`` (default ``num_tokens``) is what align-mode Mamba
        groups count, ``num_encoder_tokens`` what cross-attention groups count; the
        sum may be negative, as in vLLM. ``num_local_computed`` (default
        ``total_computed``) is the local hit's length: one ending inside a block
        counts the block's copy."""
    def new_step_starts(self) -> None:
        """vLLM's ``new_step_starts``: forgets the Mamba state blocks cached in the
        step that ended."""
    def allocate_slots_groups(
        self,
        request_id: str,
        new_computed: Sequence[Sequence[int] | npt.NDArray[np.int32]] | None,
        num_tokens_need_slot: int,
        num_local_computed: int,
        num_external_computed: int,
        full_sequence_tokens: int | None,
        full_sequence_computed: int | None,
        processed_tokens: int | None,
        reserved_blocks: int,
        watermark_blocks: int,
        adopt: bool,
        skip_zeroing: Sequence[int] = ...,
        hashes: Sequence[bytes] | None = None,
        cache_tokens: int | None = None,
        reprefillable: int = 0,
        num_tokens_main_model: int | None = None,
        num_encoder_tokens: int = 0,
    ) -> list[npt.NDArray[np.int32]] | None:
        """vLLM's ``allocate_slots`` over all groups: each group's new block ids, or
        None. ``full_sequence_computed`` is the gate's (capped) computed count,
        ``processed_tokens`` the position ``remove_skipped_blocks`` runs at first,
        ``skip_zeroing`` the groups whose external blocks are not logged as new,
        ``num_encoder_tokens`` the slots cross-attention groups hold.
        With ``hashes`` and ``cache_tokens`` the caching step follows (as
        :meth:`cache_groups`; runs in :attr:`last_cached_runs`)."""
    def cache_groups(
        self, request_id: str, hashes: Sequence[bytes], num_tokens: int, reprefillable: int = 0
    ) -> list[tuple[int, int, int, npt.NDArray[np.int32], int, int, int]]:
        """Caches every group's full blocks for ``num_tokens`` computed tokens (less
        ``reprefillable``) under the request's ``hashes``, and the prompt tails of
        full-attention groups larger than the hash block. Returns the runs ``(group_idx,
        start, end, stored table indices, block_size, removed_start, removed_end)``, one
        per vLLM ``BlockStored`` event, in vLLM's order; a prompt tail's entry counts in
        hash blocks. ``removed_start:removed_end`` are the keys (in the next
        :meth:`take_removed_groups`) vLLM reports just before the run's event."""
    def remove_skipped_blocks(self, request_id: str, processed_tokens: int) -> None:
        """vLLM's ``remove_skipped_blocks``: frees and nulls each group's blocks that
        fell out of its window for ``processed_tokens`` computed tokens."""
    def group_blocks(self, request_id: str) -> list[npt.NDArray[np.int32]]:
        """Each group's table of the request."""
    def estimate_cached_tokens(self, request_id: str) -> int:
        """vLLM's ``estimate_cached_tokens``: the fewest tokens any prefix-cacheable
        group's table (cross-attention aside) holds a cached block for; 0 for an
        unknown request."""
    def num_cached_groups(self, request_id: str) -> list[int | None]:
        """Each group's ``num_cached_block`` entry of the request."""
    @property
    def registers_prompt_tails(self) -> bool:
        """Whether some group registers partial-block prefix entries for prompt tails
        (a full-attention group larger than the hash block, or an align-mode Mamba
        group under partial hash hits): the caller then gives the prompt length to
        :meth:`set_cache_context` before each caching call."""
    def extra_keys(self) -> list[tuple[bytes, int, int]]:
        """The partial-block prefix entries blocks hold beside their own hash:
        ``(hash, group, block id)``, by block id."""
    def log_metrics(self, on: bool) -> None:
        """Starts (``True``) or stops the log of what vLLM's KV cache metrics collector
        hears (see :meth:`take_metrics`)."""
    def take_metrics(self) -> list[tuple[int, int]]:
        """Drains the metrics log: ``(block id, event)`` in call order; event 0: an
        allocation handed it out (``on_block_allocated``, after ``on_block_evicted`` with
        prefix caching), 1: a hit adopted it (``on_block_accessed``), 2: its hashes were
        dropped in place (``on_block_evicted``)."""
    def take_removed_groups(self) -> list[tuple[bytes, int]]:
        """Drains the hashes dropped since the last call with their group, in order."""
    def block_group(self, block_id: int) -> int | None:
        """The group the block's cached hash belongs to, or None without a hash."""
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block 0 included."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def num_free_blocks(self) -> int:
        """Free blocks (idle cached ones included)."""
    @property
    def usage(self) -> float:
        """``1 - free / (num_blocks - 1)``."""
    @property
    def num_cached_hashes(self) -> int:
        """Distinct cached hashes."""
    @property
    def last_cached_run(self) -> tuple[int, int] | None:
        """The run ``(start, end)`` the last ``allocate_slots`` / ``cache`` call cached,
        or None."""
    def find_hit(self, hashes: Sequence[bytes], max_blocks: int, drop_last: bool) -> list[int]:
        """The longest cached run of ``hashes[:max_blocks]``; its last block dropped with
        ``drop_last`` (EAGLE)."""
    def num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed: Sequence[int]
    ) -> int:
        """vLLM's ``get_num_blocks_to_allocate``."""
    def allocate_slots(
        self,
        request_id: str,
        new_computed: Sequence[int],
        num_tokens_need_slot: int,
        num_local_computed: int,
        num_external_computed: int,
        full_sequence_tokens: int | None,
        reserved_blocks: int,
        watermark_blocks: int,
        adopt: bool,
        hashes: Sequence[bytes] | None = None,
        cache_tokens: int | None = None,
    ) -> tuple[list[int], int, int] | None:
        """vLLM's ``allocate_slots``: ``(new block ids, table length, cached blocks)``
        (the last two as :meth:`table_state` would give them next), or None (nothing
        changed).

        With ``hashes`` and ``cache_tokens``, the caching step follows in the same call
        (as :meth:`cache`; its run is :attr:`last_cached_run`)."""
    def cache(
        self, request_id: str, hashes: Sequence[bytes], num_tokens: int
    ) -> tuple[int, int] | None:
        """Caches the request's full blocks up to ``num_tokens`` under ``hashes`` (its
        ``block_hashes``; only the new ones are read). Returns the cached run
        ``(start, end)`` in blocks, or None when nothing was cached."""
    def request_ids(self, cached_only: bool = False) -> list[str]:
        """Ids of the requests holding a table (``cached_only``: those with a cached count)."""
    def num_cached(self, request_id: str) -> int | None:
        """vLLM's ``num_cached_block`` entry (None: none)."""
    def has_request(self, request_id: str) -> bool:
        """Whether the request holds a block table."""
    def blocks(self, request_id: str) -> list[int]:
        """The request's block table."""
    def num_request_blocks(self, request_id: str) -> int:
        """The request's table length."""
    def table_state(self, request_id: str) -> tuple[int, int] | None:
        """``(table length, cached blocks)`` of the request (its ``num_cached_block`` entry,
        0 when it has none), or None when it holds no table."""
    def pop_blocks(self, request_id: str) -> list[int]:
        """Pops the request's tables without freeing them (each group's without its
        leading null blocks, in group order)."""
    def free(self, request_id: str) -> None:
        """Frees the request's blocks: each group's table in reverse order, group 0 first."""
    def free_blocks(self, ordered: Sequence[int]) -> None:
        """Releases one reference on each block, in order (null blocks skipped)."""
    def touch(self, ids: Sequence[int]) -> None:
        """Takes one reference on each block (null blocks skipped)."""
    def evict_blocks(self, ids: Sequence[int]) -> int:
        """Drops the hashes of blocks (held or not); returns how many had one."""
    def reset(self) -> bool:
        """Drops every cached hash; False (nothing changed) while blocks are held."""
    def take_removed(self) -> list[bytes]:
        """Drains the hashes dropped since the last call, in order."""
    def take_new_ids(self) -> list[int]:
        """Drains the block ids allocated since the last call."""
    def record_for_zeroing(self, request_id: str, start: int) -> None:
        """Logs the request's blocks from table index ``start`` as new (for zeroing)."""
    def set_zeroing_groups(self, groups: Sequence[int]) -> None:
        """Logs the blocks the listed groups allocate (KV cache zeroing); the other
        groups log nothing."""
    def records_new_ids(self, group: int) -> bool:
        """Whether group ``group`` logs its new blocks for zeroing."""
    def take_new_ids_group(self, group: int) -> list[int]:
        """Drains group ``group``'s zeroing log alone."""
    @property
    def partial_hits(self) -> bool:
        """Whether hits may end at hash-block boundaries inside blocks (vLLM's
        ``enable_partial_hash_hits``): an align-mode Mamba group is larger than the
        hash block."""
    @property
    def mamba_shared_prefix_checkpoint(self) -> bool:
        """vLLM's ``mamba_shared_prefix_checkpoint`` as the manager narrows it: Mamba
        prompt tails register at the scheduler's shared-prefix junction too (off
        without an align-mode Mamba group larger than the hash block)."""
    def set_mamba_shared_prefix_checkpoint(self, on: bool) -> None:
        """Sets vLLM's ``mamba_shared_prefix_checkpoint`` (as the manager narrows
        ``enable_mamba_shared_prefix_checkpoint``); ignored without an align-mode Mamba
        group larger than the hash block."""
    def take_cow_copies(self, group: int) -> list[tuple[int, int]]:
        """Drains group ``group``'s queued block copies ``(source, copy)``, oldest
        first. Each endpoint holds one reference for the copy; free both once it ran."""
    def take_cow_offers(self) -> list[tuple[str, int, int, int]]:
        """Drains the copies producers of a prompt tail offered as boundary states:
        ``(request_id, group, block_id, boundary_tokens)``, oldest first."""
    def finalize_partial_tails(
        self, request_id: str, num_computed: int, num_in_flight: int
    ) -> list[tuple[int, int, int]]:
        """vLLM's ``finalize_partial_tail_offloads`` for a finishing request: each
        Mamba group's prompt tail it produced, ``(group, block_id, boundary_tokens)``,
        when nothing past the boundary was computed (``num_computed``) or is in
        flight; its tails are forgotten either way."""
    def record_for_zeroing_groups(self, request_id: str, start_token: int) -> None:
        """vLLM's ``record_blocks_for_zeroing``: each logging group logs the request's
        blocks from token ``start_token`` on (a multiple of its block size)."""
    def set_mamba_speculative_blocks(self, counts: Sequence[int]) -> None:
        """Sets each group's ``num_speculative_blocks`` (MTP / EAGLE beside Mamba: state
        blocks for the draft tokens), one count per group, 0 outside Mamba groups;
        before any request."""
    def set_mamba_prefill_checkpoints(self, alignments: Sequence[int | None]) -> None:
        """Sets each group's prefill checkpoints: the ``prefill_checkpoint_alignment`` of an
        align-mode Mamba group with ``num_prefill_checkpoint_blocks > 0``, else None; one
        entry per group, before any request."""
    def mamba_checkpoints(self, group: int) -> list[tuple[str, int, int]]:
        """Group ``group``'s prefill checkpoints: ``{request_id: (position, reserved index)}``
        (vLLM's ``MambaManager._checkpoints``)."""
    def set_hash_lookahead(self, tokens: int) -> None:
        """Sets vLLM's ``num_hash_lookahead_tokens`` (tokens each hash covers past its
        block): Mamba prompt tails and prefill checkpoints stop that many tokens short of
        the end."""
    def set_retention_interval(self, interval: int | None) -> None:
        """Sets vLLM's ``prefix_cache_retention_interval`` (None: dense caching)."""
    @property
    def retention_interval(self) -> int | None:
        """The retention interval (None: dense)."""
    def set_cache_context(
        self,
        num_prompt_tokens: int,
        shared_prefix_boundary: int,
        num_computed_tokens: int = 0,
        num_tokens: int = 0,
    ) -> None:
        """The prompt length and shared-prefix junction the next caching steps use
        (a retention interval, prompt tails), the request's computed tokens before the
        step being cached (a Mamba tail at the junction needs it) and its tokens so far
        (under retention interval 0 a Mamba prefill checkpoint needs its prefill end)."""
    def take_loose(self, num_blocks: int) -> list[int]:
        """Takes ``num_blocks`` free blocks held by no request (``free_blocks`` them)."""
    def cache_loose(
        self, blocks: Sequence[int], group: int, start: int, end: int, hashes: Sequence[bytes]
    ) -> list[int]:
        """vLLM's ``block_pool.cache_full_blocks`` for group ``group`` over the
        caller's ``blocks`` (indices ``start..end``) under the request's
        ``hashes``; returns the indices cached."""
    def free_queue(self) -> list[int]:
        """The free queue, head (next handed out) first."""
    def ref_count(self, block_id: int) -> int:
        """References on a block."""
    def block_hash(self, block_id: int) -> bytes | None:
        """The block's cached hash (vLLM's, without its group), or None."""
    def hash_tokens(self, block_id: int) -> int | None:
        """Tokens the block's hash covers (None without a hash)."""
    def cached_block(self, block_hash: bytes, group: int = 0) -> int | None:
        """The first block cached for ``group`` under ``block_hash``, or None."""
    def holds_key(self, block_hash: bytes, group: int, block_id: int) -> bool:
        """Whether the block is cached for ``group`` under ``block_hash`` (its own hash or a
        partial-block prefix entry)."""
    def restore_cached_key(
        self, block_hash: bytes, group: int, block_id: int, own: bool, tokens: int
    ) -> bool:
        """Gives the block back an entry :meth:`pop_cached_key` dropped, without reporting
        it: its own hash covering ``tokens`` tokens (``own``) or a partial-block prefix
        entry; False (nothing changed) where the block cannot hold it."""
    def pop_cached_key(self, block_hash: bytes, group: int, block_id: int) -> bool:
        """Drops the block's entry for ``group`` under ``block_hash`` without reporting it
        (vLLM's ``cached_block_hash_to_block.pop(key, block_id)``); whether it had one."""
    def check_invariants(self) -> None:
        """Raises ``InvariantViolation`` if the pool's or the tables' invariants are broken."""

@final
class _VllmFront:
    """The native per-step calls of one `KVCacheManager` (module doc)."""

    def __new__(
        cls,
        core: _VllmManager,
        *,
        allocate: Callable[..., Any],
        cache: Callable[..., Any],
        empty: Any,
        blocks_cls: Callable[..., Any],
        blocks: list[Any],
        tables: dict[str, Any],
        admitting: tuple[Any, Any],
        block_size: int,
        reprefill: int,
        max_model_len: int,
        caching: bool,
        cache_only: bool,
        events: bool,
        watermark: bool,
    ) -> Self: ...
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """vLLM's ``allocate_slots`` (the manager's; a running request's plain step is
        answered here, module doc)."""
    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """vLLM's ``cache_blocks`` (the manager's, answered here when it caches nothing, or
        caches without KV events to build)."""
    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens the request's table holds cached blocks for (vLLM's
        ``estimate_cached_tokens``)."""
