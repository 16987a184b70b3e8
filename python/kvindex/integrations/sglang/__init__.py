"""kvindex inside SGLang 0.5.23: a radix-cache backend (:mod:`.cache`) registered as
``kvindex`` through SGLang's ``sglang.srt.plugins`` entry point (:mod:`.plugin`), so

    SGLANG_PLUGINS=kvindex python -m sglang.launch_server --model-path ... \\
        --radix-cache-backend kvindex

runs SGLang's scheduler on kvindex's Rust radix tree.

Importing this package does not import SGLang. The SGLang-facing names load on first use,
after the installed SGLang release is checked
(:class:`~kvindex.integrations.sglang.version.UnsupportedSglangVersionError` names the
supported ones otherwise):

- ``KvindexRadixCache``: SGLang's ``BasePrefixCache`` on :class:`kvindex.RadixTree`;
- ``kvindex_cache_factory``: the ``register_radix_cache_backend`` factory;
- ``UnsupportedSglangFeatureError``: raised at construction for what the backend lacks
  (hybrid SWA / Mamba models, EAGLE bigram keys, HiCache, session caches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import (
    SUPPORTED_SGLANG_VERSIONS,
    UnsupportedSglangVersionError,
    check_sglang_version,
    is_supported_sglang_version,
)

if TYPE_CHECKING:
    from .cache import KvindexRadixCache, UnsupportedSglangFeatureError, kvindex_cache_factory

__all__ = [
    "SUPPORTED_SGLANG_VERSIONS",
    "KvindexRadixCache",
    "UnsupportedSglangFeatureError",
    "UnsupportedSglangVersionError",
    "check_sglang_version",
    "is_supported_sglang_version",
    "kvindex_cache_factory",
]

_LAZY = {
    "KvindexRadixCache": "cache",
    "UnsupportedSglangFeatureError": "cache",
    "kvindex_cache_factory": "cache",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    check_sglang_version()
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value
