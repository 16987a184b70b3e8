"""vLLM's block objects and read-only views over kvindex's block pool.

vLLM's scheduler, its KV connectors and its tests read ``KVCacheBlock`` objects and a
few ``BlockPool`` / coordinator members. Here one block object per block id is made
once and reused; its ``ref_cnt`` and hash are read from the Rust pool when asked, never
kept in Python. The views answer what vLLM reads (the free queue, the hash map, the
request tables); they do not mutate, except ``BlockPoolView.free_blocks`` /
``evict_blocks`` / ``reset_prefix_cache`` / ``take_events``, which go through the
manager like the scheduler's own calls.

Writes to a block's fields do what they do to vLLM's block where vLLM's own code makes
them on a block it holds: ``block.ref_cnt += 1`` / ``-= 1`` on a held block takes / drops
one reference in the Rust pool (vLLM's copy-on-write pins), and a write of the value a
field already has changes nothing. Every other write (a hash, a free-queue link, the
block id, a count moved otherwise) would corrupt the index and raises
:class:`~kvindex.integrations.vllm.errors.BlockFieldWriteError` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from vllm.v1.core.kv_cache_utils import KVCacheBlock

from .errors import BlockFieldWriteError, UnsupportedVllmConfigError

if TYPE_CHECKING:
    from kvindex._core import _VllmManager


class ManagerSide(Protocol):
    """What the views read of the drop-in manager (``manager.KVCacheManager``), named
    here so that this module does not depend on the manager that builds the views."""

    enable_caching: bool
    enable_kv_cache_events: bool
    use_eagle: bool
    metrics_collector: Any
    _events: list[Any]

    @property
    def block_pool(self) -> BlockPoolView: ...

    def evict_blocks(self, block_ids: set[int]) -> None: ...

    def _take_loose_blocks(self, num_blocks: int) -> list[KVCacheBlock]: ...

    def _cache_loose(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None: ...

    def _cache_partial_loose(
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None: ...

    def _reset_pool(self) -> bool: ...

    def _take_raw_events(self) -> list[Any]: ...


_GROUP0 = (0).to_bytes(4, "big")

_MISSING: Any = object()
#: Fields compared by value for a write that changes nothing (the others by identity).
_VALUE_FIELDS = frozenset(
    {"block_id", "is_null", "_block_hash", "block_hash", "_block_hash_num_tokens",
     "block_hash_num_tokens"}
)  # fmt: skip
_HASH_FIELDS = frozenset(
    {"_block_hash", "block_hash", "_block_hash_num_tokens", "block_hash_num_tokens"}
)
_LINK_FIELDS = frozenset({"prev_free_block", "next_free_block"})


class _Block(KVCacheBlock):
    """A ``KVCacheBlock`` whose ref count and hash live in the Rust pool."""

    def __init__(self, block_id: int, view: BlockPoolView) -> None:
        # vLLM's dataclass __init__ would assign ref_cnt / hash fields; these are
        # read-through properties here, so only the plain slots are set (attribute
        # writes go through __setattr__ below, which refuses them).
        object.__setattr__(self, "block_id", block_id)
        object.__setattr__(self, "pool", view)
        object.__setattr__(self, "is_null", block_id == 0)
        object.__setattr__(self, "_core", view._core)
        object.__setattr__(self, "_view", view)

    if TYPE_CHECKING:
        _core: _VllmManager
        _view: BlockPoolView

    @property
    def ref_cnt(self) -> int:
        if self.block_id == 0:
            return 0
        return self._core.ref_count(self.block_id)

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        # What vLLM's own code does to a block it holds: ``ref_cnt += 1`` pins it for
        # one more owner (a copy-on-write source or target until the worker copied
        # it), ``ref_cnt -= 1`` drops such a pin while another reference remains; the
        # pool's touch / free do the same to the Rust count. Any other write (a free
        # block's count raised without leaving the free queue, a last reference
        # dropped without entering it, a jump) would corrupt the pool: refused.
        current = self.ref_cnt
        if isinstance(value, bool) or not isinstance(value, int):
            raise BlockFieldWriteError(
                f"KVCacheBlock.ref_cnt must be an int, got {type(value).__name__}",
                name="ref_cnt",
            )
        if value == current:
            return
        if self.block_id != 0 and current >= 1:
            if value == current + 1:
                self._core.touch([self.block_id])
                return
            if value == current - 1 and value >= 1:
                self._core.free_blocks([self.block_id])
                return
        raise BlockFieldWriteError(
            f"KVCacheBlock.ref_cnt of block {self.block_id}: {current} -> {value} would corrupt "
            "kvindex's pool (only a held block's count moves, by one, while it stays held); "
            "take and release references with block_pool.touch / block_pool.free_blocks",
            name="ref_cnt",
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ref_cnt":
            object.__setattr__(self, name, value)
            return
        try:
            current = getattr(self, name)
        except AttributeError:
            current = _MISSING
        if current is value or (name in _VALUE_FIELDS and current == value):
            return  # a write of the value already there changes nothing, as in vLLM
        if current is _MISSING:
            what = "is not a KVCacheBlock field"
        elif name in _HASH_FIELDS:
            what = "is owned by kvindex's Rust pool (blocks are cached and evicted by the manager)"
        elif name in _LINK_FIELDS:
            what = "is kvindex's free queue, which the Rust pool owns"
        else:
            what = "is fixed for the pool's life"
        raise BlockFieldWriteError(
            f"KVCacheBlock.{name} of block {self.block_id} {what}: writing it would corrupt "
            "kvindex's index, so the block is left unchanged",
            name=name,
        )

    @property
    def _block_hash(self) -> bytes | None:
        h = self._core.block_hash(self.block_id)
        return None if h is None else h + _GROUP0

    @property
    def block_hash(self) -> bytes | None:
        return self._block_hash

    @property
    def _block_hash_num_tokens(self) -> int | None:
        return self._core.hash_tokens(self.block_id)

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._core.hash_tokens(self.block_id)

    @property
    def prev_free_block(self) -> KVCacheBlock | None:
        return self._view.free_block_queue._neighbour(self.block_id, -1)

    @property
    def next_free_block(self) -> KVCacheBlock | None:
        return self._view.free_block_queue._neighbour(self.block_id, 1)

    def set_block_hash(self, block_hash: Any, num_tokens: int | None = None) -> None:
        raise BlockFieldWriteError(
            f"KVCacheBlock.set_block_hash on block {self.block_id}: the _block_hash field is "
            "owned by kvindex's Rust pool (the manager caches blocks in cache_blocks)",
            name="_block_hash",
        )

    def reset_hash(self) -> None:
        if self._block_hash is None:
            return  # nothing to reset, as on vLLM's block
        raise BlockFieldWriteError(
            f"KVCacheBlock.reset_hash on block {self.block_id}: the _block_hash field is owned "
            "by kvindex's Rust pool (drop cached blocks with evict_blocks or reset_prefix_cache)",
            name="_block_hash",
        )

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, "
            f"_block_hash_num_tokens={self._block_hash_num_tokens})"
        )


class _GroupBlock(_Block):
    """A block of a pool shared by several KV cache groups: its hash carries the group it
    is cached for, as vLLM's ``BlockHashWithGroupId``."""

    @property
    def _block_hash(self) -> bytes | None:
        h = self._core.block_hash(self.block_id)
        if h is None:
            return None
        group = self._core.block_group(self.block_id)
        return h + (group or 0).to_bytes(4, "big")

    @property
    def block_hash(self) -> bytes | None:
        return self._block_hash


class FreeQueueView:
    """vLLM's ``FreeKVCacheBlockQueue``, read-only: the Rust pool's free queue."""

    def __init__(self, view: BlockPoolView) -> None:
        self._view = view
        self.fake_free_list_head = _Sentinel(self, "head")
        self.fake_free_list_tail = _Sentinel(self, "tail")

    @property
    def num_free_blocks(self) -> int:
        return self._view._core.num_free_blocks

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks = self._view.blocks
        return [blocks[i] for i in self._view._core.free_queue()]

    def _neighbour(self, block_id: int, step: int) -> KVCacheBlock | None:
        q = self._view._core.free_queue()
        try:
            i = q.index(block_id)
        except ValueError:
            return None
        j = i + step
        if 0 <= j < len(q):
            return self._view.blocks[q[j]]
        return self.fake_free_list_head if j < 0 else self.fake_free_list_tail

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.get_all_free_blocks())


class _Sentinel:
    """The free queue's fake head / tail: their neighbours are the queue's ends."""

    def __init__(self, queue: FreeQueueView, end: str) -> None:
        self._queue = queue
        self._end = end
        self.block_id = -1

    @property
    def next_free_block(self) -> Any:
        if self._end == "tail":
            return None
        q = self._queue._view._core.free_queue()
        return self._queue._view.blocks[q[0]] if q else self._queue.fake_free_list_tail

    @property
    def prev_free_block(self) -> Any:
        if self._end == "head":
            return None
        q = self._queue._view._core.free_queue()
        return self._queue._view.blocks[q[-1]] if q else self._queue.fake_free_list_head


class _CacheDict(dict[bytes, Any]):
    """A snapshot of the pool's hash map (vLLM's ``cached_block_hash_to_block._cache``).
    Removing a key (``pop`` / ``del``) drops it from the Rust pool without an event, as
    vLLM's dict edit does; assigning a key puts back blocks popped from under it (how vLLM's
    tests fake an eviction and undo it). Any other edit raises."""

    def __init__(self, view: CachedHashView, entries: dict[bytes, Any]) -> None:
        super().__init__(entries)
        self._view = view

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedVllmConfigError(
            "kvindex's KVCacheManager supports no edits of the block pool's hash map "
            "(cached_block_hash_to_block._cache) beyond removing a key and putting back "
            "what was removed: the Rust pool owns it; evict blocks with evict_blocks"
        )

    popitem = clear = update = setdefault = _refuse

    def __copy__(self) -> dict[bytes, Any]:
        """A plain dict of the snapshot (a backup to put entries back from)."""
        return dict(self)

    def pop(self, key: bytes, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = super().pop(key)
        for b in _blocks_of(value):
            self._view._drop(key, b)
        return value

    def __delitem__(self, key: bytes) -> None:
        self.pop(key)

    def __setitem__(self, key: bytes, value: Any) -> None:
        blocks = _blocks_of(value)
        if not blocks or not all(self._view._can_restore(key, b) for b in blocks):
            self._refuse()
        for b in blocks:
            self._view._restore(key, b)
        super().__setitem__(key, value)


def _blocks_of(value: Any) -> list[KVCacheBlock]:
    """The blocks under one key of vLLM's map: a block, or a dict of id -> block."""
    return list(value.values()) if isinstance(value, dict) else [value]


class CachedHashView(Mapping[bytes, KVCacheBlock]):
    """vLLM's ``cached_block_hash_to_block``, read-only: hash (with group id) -> first block."""

    def __init__(self, view: BlockPoolView) -> None:
        self._view = view
        # Entries dropped by a key removal, for putting back: key -> block id -> (own
        # hash or partial entry, tokens its hash covered).
        self._popped: dict[bytes, dict[int, tuple[bool, int]]] = {}

    def _drop(self, key: bytes, block: KVCacheBlock) -> None:
        split = self._split(key)
        if split is None:
            return
        core = self._view._core
        own = block.block_hash == key
        tokens = core.hash_tokens(block.block_id) if own else 0
        if core.pop_cached_key(*split, block.block_id):
            self._popped.setdefault(key, {})[block.block_id] = (own, tokens or 0)

    def _can_restore(self, key: bytes, block: KVCacheBlock) -> bool:
        return block.block_id in self._popped.get(key, {})

    def _restore(self, key: bytes, block: KVCacheBlock) -> None:
        split = self._split(key)
        own, tokens = self._popped[key].pop(block.block_id)
        if not self._popped[key]:
            del self._popped[key]
        if split is not None:
            self._view._core.restore_cached_key(*split, block.block_id, own, tokens)

    def _split(self, key: object) -> tuple[bytes, int] | None:
        """``(hash, group)`` of a key with group id, or None for one no block can hold."""
        if not isinstance(key, bytes) or len(key) < 4:
            return None
        group = int.from_bytes(key[-4:], "big")
        if group >= (self._view._core.num_groups if self._view._groups else 1):
            return None
        return key[:-4], group

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        split = self._split(key)
        if split is None:
            return None
        b = self._view._core.cached_block(*split)
        return None if b is None else self._view.blocks[b]

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """vLLM's ``pop``: drop the block's entry under ``key`` (no event), return the
        block, or None when it had none. kvindex's block then has no hash under ``key``
        (vLLM's keeps a stale ``block_hash``)."""
        split = self._split(key)
        if split is None or not 0 < block_id < len(self._view.blocks):
            return None
        if not self._view._core.holds_key(*split, block_id):
            return None
        block = self._view.blocks[block_id]
        self._drop(key, block)
        return block

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """vLLM's ``insert``, for putting back an entry :meth:`pop` removed (kvindex's pool
        caches blocks itself; any other insertion raises)."""
        if not self._can_restore(key, block):
            raise UnsupportedVllmConfigError(
                "kvindex's KVCacheManager caches blocks itself: cached_block_hash_to_block "
                "only takes back an entry removed from it"
            )
        self._restore(key, block)

    @property
    def _cache(self) -> dict[bytes, Any]:
        """vLLM's underlying dict (a snapshot): hash -> block, or -> {id: block} for
        copies; removing a key drops it from the pool, assigning puts back what was
        removed."""
        out: dict[bytes, Any] = {}
        for b, h in self._entries():
            prev = out.get(h)
            if prev is None:
                out[h] = b
            elif isinstance(prev, dict):
                prev[b.block_id] = b
            else:
                out[h] = {prev.block_id: prev, b.block_id: b}
        return _CacheDict(self, out)

    def _entries(self) -> list[tuple[KVCacheBlock, bytes]]:
        """Every (block, key): the blocks' own hashes by block id, then the partial-block
        prefix entries blocks hold beside them."""
        blocks = self._view.blocks
        out = [(b, h) for b in blocks[1:] if (h := b.block_hash) is not None]
        if self._view._groups:
            out.extend(
                (blocks[b], h + g.to_bytes(4, "big")) for h, g, b in self._view._core.extra_keys()
            )
        return out

    def contain(self, key: bytes, block_id: int) -> bool:
        split = self._split(key)
        if split is None or not 0 <= block_id < len(self._view.blocks):
            return False
        return bool(self._view._core.holds_key(*split, block_id))

    def __getitem__(self, key: bytes) -> KVCacheBlock:
        b = self.get_one_block(key)
        if b is None:
            raise KeyError(key)
        return b

    def _keys(self) -> list[bytes]:
        seen: dict[bytes, None] = {}
        for _b, h in self._entries():
            seen.setdefault(h)
        return list(seen)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._keys())

    def __len__(self) -> int:
        return self._view._core.num_cached_hashes


class BlockPoolView:
    """The members of vLLM's ``BlockPool`` that the scheduler, KV connectors and
    vLLM's tests read, over kvindex's Rust pool."""

    def __init__(
        self, manager: ManagerSide, core: _VllmManager, hash_block_size: int, groups: bool = False
    ) -> None:
        self._manager = manager
        self._core = core
        # Several KV cache groups: hashes are keyed by group (``_GroupBlock``).
        self._groups = groups
        self.num_gpu_blocks = core.num_blocks
        self.enable_caching = manager.enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = manager.enable_kv_cache_events
        block_cls = _GroupBlock if groups else _Block
        self.blocks: list[KVCacheBlock] = [block_cls(i, self) for i in range(core.num_blocks)]
        self.null_block = self.blocks[0]
        self.free_block_queue = FreeQueueView(self)
        self.cached_block_hash_to_block = CachedHashView(self)
        self.metrics_collector = manager.metrics_collector

    @property
    def kv_event_queue(self) -> list[Any]:
        return self._manager._events

    def get_num_free_blocks(self) -> int:
        return self._core.num_free_blocks

    def get_usage(self) -> float:
        return self._core.usage

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        group_ids = list(kv_cache_group_ids)
        if not self._groups:
            if group_ids != [0]:
                return None
            b = self._core.cached_block(block_hash)
            return None if b is None else [self.blocks[b]]
        out = []
        for g in group_ids:
            if not 0 <= g < self._core.num_groups:
                return None
            b = self._core.cached_block(block_hash, g)
            if b is None:
                return None
            out.append(self.blocks[b])
        return out

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Takes ``num_blocks`` blocks off the free queue's head, held by no request (the
        caller frees them through :meth:`free_blocks`)."""
        return self._manager._take_loose_blocks(num_blocks)

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Caches ``blocks[num_cached_blocks:num_full_blocks]`` for one group under the
        request's hashes (null and masked-out blocks skipped), with its ``BlockStored``
        event: what a group's caching step does, on a caller's block list."""
        self._manager._cache_loose(
            request,
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        )

    def cache_partial_block(
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """Registers the request's first ``num_tokens`` tokens (a hash boundary) as a
        prefix-cache entry of ``block`` in one group — its own hash when it has none, else
        beside it — with its ``BlockStored`` event; every key the block had is dropped first
        with ``replace_existing_hashes`` or when its hash covers fewer tokens. Returns the
        entry's key (None for the null block)."""
        return self._manager._cache_partial_loose(
            request, block, num_tokens, kv_cache_group_id, block_size, replace_existing_hashes
        )

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Takes one reference on each block (KV connectors pin what they read); the
        metrics collector hears each non-null one accessed, as vLLM's."""
        touched = list(blocks)
        self._core.touch([b.block_id for b in touched])
        collector = self.metrics_collector
        if collector is not None:
            for b in touched:
                if not b.is_null:
                    collector.on_block_accessed(b)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        self._core.free_blocks([b.block_id for b in ordered_blocks])

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._manager.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        return self._manager._reset_pool()

    def take_events(self) -> list[Any]:
        return self._manager._take_raw_events()


class GroupManagerView:
    """vLLM's single-type manager of one group, as the scheduler and tests read it
    (``group``: its index in a manager of several groups; None for the one group)."""

    def __init__(
        self, manager: ManagerSide, core: _VllmManager, spec: Any, group: int | None = None
    ) -> None:
        self._core = core
        self._blocks = manager.block_pool.blocks
        self.kv_cache_spec = spec
        self.block_size = core.block_size if group is None else spec.block_size
        self.kv_cache_group_id = group or 0
        self.block_pool = manager.block_pool
        self.enable_caching = manager.enable_caching
        self.use_eagle = manager.use_eagle
        self.req_to_blocks = _ReqTables(core, self._blocks, group)
        self.num_cached_block = _NumCached(core, group)
        self._null_block = manager.block_pool.null_block
        self.retains_longer_hit = False
        # Where hits land (vLLM's coordinator sets it on every manager).
        self.cache_hit_alignment_tokens: int = self.block_size
        self._group = group
        # Copy-on-write block pairs queued from Python (vLLM's partial-hit copies are
        # queued in Rust and drained after these).
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        pending = self._pending_cow_copies
        self._pending_cow_copies = []
        if self._group is not None:
            blocks = self._blocks
            pending.extend(
                (blocks[s], blocks[d]) for s, d in self._core.take_cow_copies(self._group)
            )
        return pending

    @property
    def _checkpoints(self) -> dict[str, tuple[int, int]]:
        """vLLM's Mamba ``_checkpoints``: request -> (prefill checkpoint position, reserved
        index), a snapshot."""
        if self._group is None:
            return {}
        return {rid: (p, i) for rid, p, i in self._core.mamba_checkpoints(self._group)}

    @property
    def records_new_block_ids(self) -> bool:
        return self._core.records_new_ids(self.kv_cache_group_id)

    def take_new_block_ids(self) -> list[int]:
        return list(self._core.take_new_ids_group(self.kv_cache_group_id))


class _LiveTable(list[KVCacheBlock]):
    """A request's blocks in one group as vLLM's ``req_to_blocks`` list, read from the
    manager at every access: it follows the request's later allocations, and keeps its last
    blocks once the request is freed. Writes are refused: the Rust manager owns the table."""

    def __init__(self, tables: _ReqTables, rid: str) -> None:
        super().__init__()
        self._tables = tables
        self._rid = rid
        self._last: list[KVCacheBlock] = tables._read(rid)

    def _now(self) -> list[KVCacheBlock]:
        # Once the request is freed, its last blocks (vLLM's popped list keeps them).
        if self._tables._core.has_request(self._rid):
            self._last = self._tables._read(self._rid)
        return self._last

    def __getitem__(self, i: Any) -> Any:
        return self._now()[i]

    def __len__(self) -> int:
        return len(self._now())

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self._now())

    def __reversed__(self) -> Iterator[KVCacheBlock]:
        out: Iterator[KVCacheBlock] = reversed(self._now())
        return out

    def __contains__(self, block: object) -> bool:
        return block in self._now()

    def __eq__(self, other: object) -> bool:
        return self._now() == (list(other) if isinstance(other, list) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._now())

    def __add__(self, other: Any) -> Any:
        return self._now() + list(other)

    def index(self, block: Any, *args: Any) -> int:
        return self._now().index(block, *args)

    def count(self, block: Any) -> int:
        return self._now().count(block)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a request's block table is kvindex's: it cannot be written")

    __setitem__ = __delitem__ = __iadd__ = append = extend = insert = pop = remove = _refuse
    clear = sort = reverse = _refuse


class _ReqTables(Mapping[str, list[KVCacheBlock]]):
    """``req_to_blocks``: request id -> its blocks in the group (a live view per read)."""

    def __init__(self, core: _VllmManager, blocks: list[KVCacheBlock], group: int | None) -> None:
        self._core = core
        self._blocks = blocks
        self._group = group

    def _read(self, rid: str) -> list[KVCacheBlock]:
        if not self._core.has_request(rid):
            return []
        blocks = self._blocks
        if self._group is None:
            return [blocks[i] for i in self._core.blocks(rid)]
        return [blocks[i] for i in self._core.group_blocks(rid)[self._group].tolist()]

    def __getitem__(self, rid: str) -> list[KVCacheBlock]:
        if not self._core.has_request(rid):
            raise KeyError(rid)
        return _LiveTable(self, rid)

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._core.has_request(rid)

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.request_ids())

    def __len__(self) -> int:
        return len(self._core.request_ids())


class _NumCached(Mapping[str, int]):
    """``num_cached_block``: request id -> cached blocks of the group (present as in vLLM)."""

    def __init__(self, core: _VllmManager, group: int | None) -> None:
        self._core = core
        self._group = group

    def _get(self, rid: object) -> int | None:
        if not isinstance(rid, str):
            return None
        if self._group is None:
            return self._core.num_cached(rid)
        return self._core.num_cached_groups(rid)[self._group]

    def __getitem__(self, rid: str) -> int:
        n = self._get(rid)
        if n is None:
            raise KeyError(rid)
        return n

    def __contains__(self, rid: object) -> bool:
        return self._get(rid) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.request_ids(cached_only=True))

    def __len__(self) -> int:
        return len(self._core.request_ids(cached_only=True))
