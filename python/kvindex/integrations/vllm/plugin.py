"""The opt-in ``vllm.general_plugins`` hook: kvindex's manager under every vLLM scheduler.

kvindex declares the entry point ``kvindex = kvindex.integrations.vllm.plugin:register``
in the ``vllm.general_plugins`` group, which vLLM calls in each of its processes at start-up.
Installing kvindex changes nothing: :func:`register` acts only when the environment
variable ``KVINDEX_VLLM`` is ``1`` (or ``true`` / ``yes`` / ``on``). Then it checks the
installed vLLM release (:class:`~kvindex.integrations.vllm.version.UnsupportedVllmVersionError`
on any other) and makes the name ``KVCacheManager`` in ``vllm.v1.core.sched.scheduler``
(what vLLM's ``Scheduler.__init__`` builds, and so every scheduler class derived from it)
kvindex's :class:`~kvindex.integrations.vllm.manager.KVCacheManager`.
"""

from __future__ import annotations

import os

__all__ = ["ENV_VAR", "enabled", "register"]

#: The environment variable that turns the plugin on.
ENV_VAR = "KVINDEX_VLLM"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


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


def register() -> None:
    """vLLM's plugin hook; idempotent (vLLM may call it more than once per process)."""
    if not enabled():
        return
    from .version import check_vllm_version

    check_vllm_version()
    import vllm.v1.core.sched.scheduler as scheduler_module

    from .manager import KVCacheManager

    scheduler_module.KVCacheManager = KVCacheManager
