"""Which vLLM releases the integration runs on, and the start-up check that enforces it.

The check reads the installed distribution's version (``importlib.metadata``), so it never
imports vLLM itself; the entry points that need vLLM (the schedulers, the manager, the
``vllm.general_plugins`` hook when enabled) run it first and refuse any other release
with :class:`UnsupportedVllmVersionError`, instead of failing later on a changed
signature deep inside vLLM's scheduler.
"""

from __future__ import annotations

import re

from kvindex.exceptions import KvIndexError

from .._engine_version import check_engine_version

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
    "UnsupportedVllmVersionError",
    "check_vllm_version",
    "is_supported_vllm_version",
]

#: The vLLM release series the integration was tested against (vLLM's own scheduler
#: tests run against the drop-in in CI). Any patch release of a listed series passes.
SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.33.*",)

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


class UnsupportedVllmVersionError(KvIndexError, ImportError):
    """The installed vLLM is missing or is a release the integration does not support."""


def is_supported_vllm_version(version: str) -> bool:
    """Whether ``version`` (a PEP 440 string, e.g. ``"0.33.0"`` or ``"0.33.1.dev4+gabc"``)
    belongs to one of :data:`SUPPORTED_VLLM_VERSIONS`."""
    m = _RELEASE.match(version.strip())
    if m is None:
        return False
    series = f"{int(m.group(1))}.{int(m.group(2))}.*"
    return series in SUPPORTED_VLLM_VERSIONS


def check_vllm_version() -> str:
    """The installed vLLM's version; :class:`UnsupportedVllmVersionError` naming the
    supported releases when vLLM is not installed or is another release."""
    return check_engine_version(
        dist="vllm",
        engine="vLLM",
        integration="kvindex.integrations.vllm",
        supported=SUPPORTED_VLLM_VERSIONS,
        accepts=is_supported_vllm_version,
        error=UnsupportedVllmVersionError,
        without="without kvindex's scheduler / KVINDEX_VLLM plugin",
    )
