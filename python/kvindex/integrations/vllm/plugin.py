"""The opt-in ``vllm.general_plugins`` hook: kvindex's manager under every vLLM scheduler,
and kvindex's request block hasher in vLLM's engine.

kvindex declares the entry point ``kvindex = kvindex.integrations.vllm.plugin:register``
in the ``vllm.general_plugins`` group, which vLLM calls in each of its processes at start-up.
Installing kvindex changes nothing: :func:`register` acts only when the environment
variable ``KVINDEX_VLLM`` is ``1`` (or ``true`` / ``yes`` / ``on``). Then it checks the
installed vLLM release (:class:`~kvindex.integrations.vllm.version.UnsupportedVllmVersionError`
on any other) and

- makes the name ``KVCacheManager`` in ``vllm.v1.core.sched.scheduler`` (what vLLM's
  ``Scheduler.__init__`` builds, and so every scheduler class derived from it) kvindex's
  :class:`~kvindex.integrations.vllm.manager.KVCacheManager`;
- makes the name ``get_request_block_hasher`` in ``vllm.v1.engine.core`` (the factory
  ``EngineCore.__init__`` calls with the hash block size, the hash function of
  ``--prefix-caching-hash-algo`` and the lookahead token count) :func:`request_block_hasher`,
  which returns kvindex's native, bit-exact hasher
  (:func:`~kvindex.integrations.vllm.hashing.make_request_block_hasher`) for vLLM's four
  algorithms (sha256, sha256_cbor, xxhash, xxhash_cbor). ``KVINDEX_VLLM_HASHER=vllm``
  keeps vLLM's own hasher (``kvindex``, the default, or unset: kvindex's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENV_VAR",
    "HASHER_ENV_VAR",
    "enabled",
    "hasher_enabled",
    "register",
    "request_block_hasher",
]

#: The environment variable that turns the plugin on.
ENV_VAR = "KVINDEX_VLLM"
#: The environment variable that picks the engine's request block hasher under the plugin:
#: ``kvindex`` (the default) or ``vllm``.
HASHER_ENV_VAR = "KVINDEX_VLLM_HASHER"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_HASHERS = {"": True, "kvindex": True, "vllm": False}


def enabled() -> bool:
    """Whether ``KVINDEX_VLLM`` asks for kvindex's manager. A value that is neither a
    yes nor a no word raises :class:`~kvindex.exceptions.InvalidArgumentError`, so a typo
    cannot silently leave vLLM's manager in place."""
    from kvindex.exceptions import InvalidArgumentError

    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidArgumentError(
        f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected 1/true/yes/on to enable kvindex's "
        "KV cache manager in vLLM, or 0/false/no/off (or unset) to leave vLLM's"
    )


def hasher_enabled() -> bool:
    """Whether the plugin installs kvindex's request block hasher (``KVINDEX_VLLM_HASHER``
    unset or ``kvindex``) or keeps vLLM's (``vllm``); any other value raises
    :class:`~kvindex.exceptions.InvalidArgumentError`."""
    from kvindex.exceptions import InvalidArgumentError

    value = os.environ.get(HASHER_ENV_VAR, "").strip().lower()
    choice = _HASHERS.get(value)
    if choice is None:
        raise InvalidArgumentError(
            f"{HASHER_ENV_VAR}={os.environ[HASHER_ENV_VAR]!r}: expected 'kvindex' (kvindex's "
            "native request block hasher, the default) or 'vllm' (vLLM's own)"
        )
    return choice


def request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
) -> Callable[[Any], list[bytes]]:
    """vLLM's ``get_request_block_hasher`` with kvindex's hasher behind it: the same
    arguments, the same hashes
    (:func:`~kvindex.integrations.vllm.hashing.make_request_block_hasher`).
    A hash function that is not one of vLLM's four gets vLLM's own hasher, as does EAGLE
    lookahead hashing (``num_hash_lookahead_tokens > 0``)."""
    from vllm.v1.core import kv_cache_utils

    from .hashing import VLLM_HASH_ALGOS, make_request_block_hasher

    name = getattr(caching_hash_fn, "__name__", None)
    module = getattr(caching_hash_fn, "__module__", None)
    if name not in VLLM_HASH_ALGOS or module != "vllm.utils.hashing":
        vllm_hasher: Callable[[Any], list[bytes]] = kv_cache_utils.get_request_block_hasher(
            hash_block_size, caching_hash_fn, num_hash_lookahead_tokens
        )
        return vllm_hasher
    return make_request_block_hasher(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens)


def register() -> None:
    """vLLM's plugin hook; idempotent (vLLM may call it more than once per process)."""
    if not enabled():
        return
    use_kvindex_hasher = hasher_enabled()
    from .version import check_vllm_version

    check_vllm_version()
    import vllm.v1.core.sched.scheduler as scheduler_module
    import vllm.v1.engine.core as engine_core_module
    from vllm.v1.core import kv_cache_utils

    from .manager import KVCacheManager

    scheduler_module.KVCacheManager = KVCacheManager
    engine_core_module.get_request_block_hasher = (
        request_block_hasher if use_kvindex_hasher else kv_cache_utils.get_request_block_hasher
    )
