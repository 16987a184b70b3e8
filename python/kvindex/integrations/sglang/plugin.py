"""The ``sglang.srt.plugins`` entry point: registers kvindex's cache as SGLang's radix-cache
backend ``kvindex``.

SGLang runs every installed general plugin at start-up in each of its processes
(``SGLANG_PLUGINS=kvindex`` restricts it to this one); :func:`register` then makes
``--radix-cache-backend kvindex`` select
:class:`~kvindex.integrations.sglang.cache.KvindexRadixCache`.
It checks the SGLang release first (:class:`UnsupportedSglangVersionError` names the
supported ones) and registers once per process.
"""

from __future__ import annotations

from .version import check_sglang_version

__all__ = ["BACKEND_NAME", "register"]

#: The name ``--radix-cache-backend`` selects kvindex's cache by.
BACKEND_NAME = "kvindex"


def register() -> None:
    """Registers the ``kvindex`` radix-cache backend with SGLang (idempotent)."""
    check_sglang_version()
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )

    if BACKEND_NAME in registered_radix_cache_backends():
        return
    from .cache import kvindex_cache_factory

    register_radix_cache_backend(BACKEND_NAME, kvindex_cache_factory)
