"""kvindex inside vLLM 0.33: a drop-in ``KVCacheManager`` (:mod:`.manager`) and the
schedulers that run on it (:mod:`.schedulers`).

Importing this package does not import vLLM. The vLLM-facing names load on first use,
after the installed vLLM release is checked
(:class:`~kvindex.integrations.vllm.version.UnsupportedVllmVersionError` names the supported
ones otherwise):

- ``KVCacheManager``: vLLM's ``KVCacheManager`` interface on kvindex's Rust pool;
- ``Scheduler`` / ``AsyncScheduler``: vLLM's classes with only the manager swapped, for
  ``vllm serve ... --scheduler-cls kvindex.integrations.vllm.AsyncScheduler``;
- ``plugin.register``: the ``vllm.general_plugins`` hook, active only with ``KVINDEX_VLLM=1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import (
    SUPPORTED_VLLM_VERSIONS,
    UnsupportedVllmVersionError,
    check_vllm_version,
    is_supported_vllm_version,
)

if TYPE_CHECKING:
    from .manager import KVCacheManager
    from .schedulers import AsyncScheduler, Scheduler

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
    "AsyncScheduler",
    "KVCacheManager",
    "Scheduler",
    "UnsupportedVllmVersionError",
    "check_vllm_version",
    "is_supported_vllm_version",
]

_LAZY = {"KVCacheManager": "manager", "Scheduler": "schedulers", "AsyncScheduler": "schedulers"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    check_vllm_version()
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value
