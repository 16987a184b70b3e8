"""vLLM's ``Scheduler`` and ``AsyncScheduler`` running on kvindex's ``KVCacheManager``.

For ``vllm serve ... --scheduler-cls kvindex.integrations.vllm.AsyncScheduler`` (or
``.Scheduler``). Each subclasses vLLM's class and changes one thing: the KV cache manager
its constructor builds is :class:`kvindex.integrations.vllm.manager.KVCacheManager`. Every
other method is vLLM's own.

vLLM's ``Scheduler.__init__`` builds its manager by the name ``KVCacheManager`` in the
``vllm.v1.core.sched.scheduler`` module. The subclasses run that same constructor code
(not a copy of its source: the same code object) with a globals mapping that answers
``KVCacheManager`` with kvindex's class and every other name from the live module, so the
module itself is never patched and stock schedulers in the same process keep vLLM's
manager.
"""

from __future__ import annotations

import types
from typing import Any

from .version import check_vllm_version

check_vllm_version()

import vllm.v1.core.sched.scheduler as _vllm_scheduler_module  # noqa: E402
from vllm.v1.core.sched.async_scheduler import (  # noqa: E402
    AsyncScheduler as _VllmAsyncScheduler,
)
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler  # noqa: E402

from .manager import KVCacheManager  # noqa: E402

__all__ = ["AsyncScheduler", "Scheduler"]


class _ModuleGlobals(dict[str, Any]):
    """Globals for vLLM's constructor code: the overrides, else the live module's names."""

    def __init__(self, module: types.ModuleType, overrides: dict[str, Any]) -> None:
        super().__init__(overrides)
        self._module_dict = vars(module)

    def __missing__(self, key: str) -> Any:
        return self._module_dict[key]


def _rebind(func: Any, module: types.ModuleType, overrides: dict[str, Any]) -> types.FunctionType:
    """``func`` with the same code, defaults and closure, resolving globals through
    :class:`_ModuleGlobals`."""
    namespace = _ModuleGlobals(module, {"__builtins__": vars(module)["__builtins__"], **overrides})
    bound = types.FunctionType(
        func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__
    )
    bound.__kwdefaults__ = func.__kwdefaults__
    bound.__qualname__ = func.__qualname__
    bound.__doc__ = func.__doc__
    bound.__annotations__ = func.__annotations__
    bound.__module__ = func.__module__
    bound.__wrapped__ = func  # type: ignore[attr-defined]
    return bound


_vllm_scheduler_init = _rebind(
    _VllmScheduler.__init__, _vllm_scheduler_module, {"KVCacheManager": KVCacheManager}
)


class Scheduler(_VllmScheduler):
    """vLLM 0.33's ``Scheduler`` whose ``kv_cache_manager`` is kvindex's."""

    __init__ = _vllm_scheduler_init


class AsyncScheduler(_VllmAsyncScheduler, Scheduler):
    """vLLM 0.33's ``AsyncScheduler`` whose ``kv_cache_manager`` is kvindex's.

    Its method order is this class, vLLM's ``AsyncScheduler``, :class:`Scheduler`, vLLM's
    ``Scheduler``: vLLM's ``AsyncScheduler.__init__`` runs as is, and its ``super()``
    constructor call reaches :class:`Scheduler`'s, which builds kvindex's manager.
    """
