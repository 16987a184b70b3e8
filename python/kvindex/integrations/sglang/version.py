"""Which SGLang releases the integration runs on, and the start-up check that enforces it.

The check reads the installed distribution's version (``importlib.metadata``), so it never
imports SGLang itself. The plugin hook and the cache factory run it first and refuse any
other release with :class:`UnsupportedSglangVersionError`, instead of failing later on a
changed ``BasePrefixCache`` signature inside SGLang's scheduler.
"""

from __future__ import annotations

from kvindex.exceptions import KvIndexError

from .._engine_version import check_engine_version

__all__ = [
    "SUPPORTED_SGLANG_VERSIONS",
    "UnsupportedSglangVersionError",
    "check_sglang_version",
    "is_supported_sglang_version",
]

#: The SGLang releases the backend was tested against (its differential against SGLang's
#: own cache runs in CI). SGLang changes its cache interface within a minor series, so the
#: pin is exact.
SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)


class UnsupportedSglangVersionError(KvIndexError, ImportError):
    """The installed SGLang is missing or is a release the integration does not support."""


def is_supported_sglang_version(version: str) -> bool:
    """Whether ``version`` (e.g. ``"0.5.23"``; local tags such as ``"0.5.23+cpu"`` allowed)
    is one of :data:`SUPPORTED_SGLANG_VERSIONS`."""
    return version.strip().split("+", 1)[0] in SUPPORTED_SGLANG_VERSIONS


def check_sglang_version() -> str:
    """The installed SGLang's version; :class:`UnsupportedSglangVersionError` naming the
    supported releases when SGLang is not installed or is another release."""
    return check_engine_version(
        dist="sglang",
        engine="SGLang",
        integration="kvindex.integrations.sglang",
        supported=SUPPORTED_SGLANG_VERSIONS,
        accepts=is_supported_sglang_version,
        error=UnsupportedSglangVersionError,
        without="without --radix-cache-backend kvindex",
    )
