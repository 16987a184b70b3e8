"""Writes to the fields of kvindex's ``KVCacheBlock`` objects (needs vLLM 0.33).

The writes vLLM's own code makes on a block it holds (``ref_cnt += 1`` to pin a
copy-on-write endpoint, ``ref_cnt -= 1`` to drop such a pin while another reference
remains) do to kvindex's Rust pool what they do to vLLM's pool: checked side by side with
vLLM's manager, ref counts and free queue after each step. Every other write raises
``BlockFieldWriteError`` (a ``KvIndexError`` and an ``AttributeError``) naming the field,
and leaves the block and the pool unchanged; a write of the value already there changes
nothing, as on vLLM's block.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_manager as vllm_manager
    from vllm.v1.core.kv_cache_utils import (
        KVCacheBlock,
        get_request_block_hasher,
        init_none_hash,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

from kvindex.exceptions import KvIndexError
from kvindex.integrations.vllm.errors import BlockFieldWriteError
from kvindex.integrations.vllm.manager import KVCacheManager

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BS = 4
VllmManager = vllm_manager.KVCacheManager
init_none_hash(sha256)


def config(num_blocks: int) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )


def make_manager(cls: Any, num_blocks: int = 12) -> Any:
    return cls(
        config(num_blocks),
        max_model_len=1024,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_caching=True,
    )


def make_request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=100)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(rid, tokens, params, None, block_hasher=get_request_block_hasher(BS, sha256))


def admit(m: Any, rid: str, tokens: list[int]) -> tuple[Request, list[KVCacheBlock]]:
    r = make_request(rid, tokens)
    hit, n, _ = m.get_computed_blocks(r)
    assert m.allocate_slots(r, len(tokens) - n, n, hit) is not None
    return r, list(m.get_blocks(rid).blocks[0])


def state(m: Any) -> tuple[list[int], list[int], list[bool]]:
    pool = m.block_pool
    return (
        [b.ref_cnt for b in pool.blocks[1:]],
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [b.block_hash is None for b in pool.blocks],
    )


@pytest.mark.skipif(VllmManager is KVCacheManager, reason="vLLM's manager is swapped out")
def test_pin_writes_match_vllms_blocks() -> None:
    """A copy-on-write style pin: the request's block gets one more reference, the request
    is freed (the block stays held), the pin is raised and dropped again, then released
    through the pool; both pools agree after every step."""
    ref, kvi = make_manager(VllmManager), make_manager(KVCacheManager)
    prompt = list(range(13))
    pairs = [admit(m, "a", prompt) for m in (ref, kvi)]
    assert state(ref) == state(kvi)
    pinned = [blocks[1] for _, blocks in pairs]
    for b in pinned:
        b.ref_cnt += 1
    assert [b.ref_cnt for b in pinned] == [2, 2]
    assert state(ref) == state(kvi)
    for b in pinned:
        b.ref_cnt += 1
        b.ref_cnt -= 1  # back to 2: a pin dropped while others remain
    assert state(ref) == state(kvi)
    for m, (r, _) in zip((ref, kvi), pairs, strict=True):
        m.free(r)
    assert [b.ref_cnt for b in pinned] == [1, 1]
    assert state(ref) == state(kvi)
    # The pinned block is still held: a new request hitting the prefix shares it.
    for m in (ref, kvi):
        admit(m, "b", prompt)
    assert state(ref) == state(kvi)
    for m, b in zip((ref, kvi), pinned, strict=True):
        m.block_pool.free_blocks([b])
        m.free(make_request("b", prompt))
    assert state(ref) == state(kvi)
    assert [b.ref_cnt for b in pinned] == [0, 0]
    kvi.block_pool._core.check_invariants()


def refused_writes(block: Any, other: Any) -> list[tuple[str, Any]]:
    """Writes that would change ``block`` (``other`` is another block)."""
    writes: list[tuple[str, Any]] = [
        ("_block_hash", b"x" * 36),
        ("block_hash", b"y" * 36),
        ("_block_hash_num_tokens", 7),
        ("block_hash_num_tokens", 9),
        ("prev_free_block", other),
        ("next_free_block", other),
        ("block_id", block.block_id + 1),
        ("is_null", not block.is_null),
        ("pool", None),
        ("not_a_field", 1),
        ("ref_cnt", block.ref_cnt + 2),
        ("ref_cnt", "2"),
        ("ref_cnt", True),
    ]
    if block.ref_cnt:
        writes.append(("ref_cnt", 0))  # the last reference, without entering the free queue
    if block.block_hash is not None:
        writes.append(("_block_hash", None))
    return writes


def test_refused_writes_raise_one_error_naming_the_field_and_change_nothing() -> None:
    m = make_manager(KVCacheManager)
    _, blocks = admit(m, "a", list(range(13)))
    held, free = blocks[0], m.block_pool.free_block_queue.get_all_free_blocks()[0]
    assert held.block_hash is not None and held.ref_cnt == 1
    before = state(m)
    for block in (held, free):
        for field, value in refused_writes(block, blocks[1]):
            with pytest.raises(BlockFieldWriteError, match=field) as info:
                setattr(block, field, value)
            assert isinstance(info.value, KvIndexError) and isinstance(info.value, AttributeError)
            assert info.value.name == field
            assert state(m) == before, field
    # A free block's count cannot be raised without leaving the free queue.
    with pytest.raises(BlockFieldWriteError, match="ref_cnt"):
        free.ref_cnt += 1
    with pytest.raises(BlockFieldWriteError, match="_block_hash"):
        held.set_block_hash(b"z" * 36)
    with pytest.raises(BlockFieldWriteError, match="_block_hash"):
        held.reset_hash()
    null = m.block_pool.null_block
    with pytest.raises(BlockFieldWriteError, match="ref_cnt"):
        null.ref_cnt = 1
    assert state(m) == before
    m.block_pool._core.check_invariants()


def test_writes_of_the_value_already_there_change_nothing() -> None:
    m = make_manager(KVCacheManager)
    _, blocks = admit(m, "a", list(range(13)))
    free = m.block_pool.free_block_queue.get_all_free_blocks()[0]
    before = state(m)
    for b in (blocks[0], blocks[-1], free, m.block_pool.null_block):
        b.ref_cnt = b.ref_cnt
        b.block_id = b.block_id
        b.is_null = b.is_null
        b.pool = b.pool
        b._block_hash = b._block_hash
        b._block_hash_num_tokens = b._block_hash_num_tokens
        b.prev_free_block = b.prev_free_block
        b.next_free_block = b.next_free_block
    blocks[-1].reset_hash()  # the partial last block has no hash: nothing to reset
    assert state(m) == before
