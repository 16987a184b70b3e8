"""vLLM 0.33's request block hasher in Rust, bit for bit.

vLLM's engine hashes every prompt before its scheduler sees it
(``get_request_block_hasher`` in ``vllm/v1/core/kv_cache_utils.py``): for each request,
on arrival and after every appended output token, the blocks that became full are
hashed in Python, chained from the request's last hash. :func:`make_request_block_hasher`
returns a callable with the same signature (``Request -> list[BlockHash]``) and the same
results, whose work is one native call per request: it reads the request's token list
from its last hashed block on, computes the extra keys (LoRA, multimodal items, cache
salt) and hashes only the new full blocks.

Requests whose hash bytes the native path does not reproduce (prompt embeddings, token
ids that are not plain ints, unusual multimodal placements, pickle payloads that depend
on Python object identity) are handed to vLLM's own hasher, so the result is always
vLLM's; :attr:`VllmRequestHasher.fallback_calls` counts them. EAGLE lookahead hashing
(``num_hash_lookahead_tokens > 0``) is vLLM's own hasher throughout.

To use it in an engine, replace the hasher vLLM's ``EngineCore`` builds::

    from kvindex.integrations.vllm.hashing import make_request_block_hasher
    engine_core.request_block_hasher = make_request_block_hasher(
        block_size, vllm_config.cache_config.prefix_caching_hash_algo)

Importing this module does not import vLLM; calling :func:`make_request_block_hasher`
without ``fallback`` and ``none_hash`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvindex._core import VllmRequestHasher

__all__ = ["VLLM_HASH_ALGOS", "VllmRequestHasher", "make_request_block_hasher"]

#: vLLM's ``--prefix-caching-hash-algo`` names the native hasher reproduces.
VLLM_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _algo_name(algo: str | Callable[[Any], bytes]) -> str:
    if isinstance(algo, str):
        return algo
    # A vLLM hash function (``get_hash_fn_by_name``'s result): its name is vLLM's.
    name = getattr(algo, "__name__", None)
    module = getattr(algo, "__module__", "")
    if name in VLLM_HASH_ALGOS and module == "vllm.utils.hashing":
        return str(name)
    from kvindex.exceptions import InvalidArgumentError

    raise InvalidArgumentError(
        f"algo must be one of {', '.join(VLLM_HASH_ALGOS)} or vLLM's function of that name, "
        f"got {algo!r}"
    )


def make_request_block_hasher(
    block_size: int,
    algo: str | Callable[[Any], bytes] = "sha256",
    num_hash_lookahead_tokens: int = 0,
    *,
    none_hash: bytes | None = None,
    fallback: Callable[[Any], list[bytes]] | None = None,
) -> Callable[[Any], list[bytes]]:
    """vLLM's ``get_request_block_hasher(block_size, hash_fn, num_hash_lookahead_tokens)``,
    computed natively.

    ``algo`` is vLLM's algorithm name (``sha256`` — vLLM's default —, ``sha256_cbor``,
    ``xxhash``, ``xxhash_cbor``) or vLLM's hash function itself. The chain starts at
    ``none_hash`` when given, else at ``vllm.v1.core.kv_cache_utils.NONE_HASH``, read when a
    request gets its first hash (as vLLM's hasher reads it, so ``init_none_hash`` may run
    later). ``fallback`` takes the requests the native path does not reproduce; by default
    it is vLLM's own hasher for the same arguments. With ``num_hash_lookahead_tokens > 0``
    vLLM's own hasher is returned.
    """
    name = _algo_name(algo)
    root: Any = none_hash
    if num_hash_lookahead_tokens or fallback is None or root is None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils

        vllm_hasher: Callable[[Any], list[bytes]] = kv_cache_utils.get_request_block_hasher(
            block_size, get_hash_fn_by_name(name.removeprefix("vllm_")), num_hash_lookahead_tokens
        )
        if num_hash_lookahead_tokens:
            return vllm_hasher
        fallback = fallback if fallback is not None else vllm_hasher
        root = root if root is not None else kv_cache_utils
    return VllmRequestHasher(block_size, name, none_hash=root, fallback=fallback)
