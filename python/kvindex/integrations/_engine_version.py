"""The start-up version check every engine integration runs, written once.

It reads the installed distribution's version (``importlib.metadata``), so it never imports
the engine itself. O(1): one metadata lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

__all__ = ["check_engine_version"]


def check_engine_version(
    *,
    dist: str,
    engine: str,
    integration: str,
    supported: tuple[str, ...],
    accepts: Callable[[str], bool],
    error: type[Exception],
    without: str,
) -> str:
    """The installed ``dist``'s version; ``error`` naming the ``supported`` releases when it is
    not installed or ``accepts`` refuses its version (``without``: how to run the engine
    without the integration)."""
    names = ", ".join(supported)
    extra = f"pip install 'kvindex[{dist}]'"
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise error(
            f"{integration} needs {engine} {names}, and {engine} is not installed: {extra}"
        ) from None
    if not accepts(version):
        raise error(
            f"{integration} supports {engine} {names} only; the installed {engine} is "
            f"{version}. Install a supported release ({extra}) or run {engine} {without}"
        )
    return version
