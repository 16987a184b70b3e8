"""Signature drift: kvindex's ``KVCacheManager`` against the installed vLLM's.

Run on every vLLM release kvindex claims to support. If vLLM changes a method its scheduler
calls (a new keyword, a renamed parameter, a new method the scheduler starts using), these
fail before any engine does.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm
import vllm.v1.core.kv_cache_manager as vllm_manager_module
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from kvindex.integrations.vllm import is_supported_vllm_version
from kvindex.integrations.vllm.manager import KVCacheManager

VllmKVCacheManager = vllm_manager_module.KVCacheManager
SCHED_DIR = Path(vllm.__file__).parent / "v1" / "core" / "sched"


def test_installed_vllm_is_a_supported_release() -> None:
    assert is_supported_vllm_version(vllm.__version__), vllm.__version__


def _public_members(cls: type) -> dict[str, Any]:
    return {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if not name.startswith("_") and name not in dir(object)
    }


def _shape(func: Any) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults; annotations are vLLM's business."""
    sig = inspect.signature(func)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_constructor_signature_matches() -> None:
    assert _shape(KVCacheManager.__init__) == _shape(VllmKVCacheManager.__init__)


@pytest.mark.parametrize("name", sorted(_public_members(VllmKVCacheManager)))
def test_every_public_member_of_vllms_manager_has_the_same_shape(name: str) -> None:
    theirs = inspect.getattr_static(VllmKVCacheManager, name)
    assert hasattr(KVCacheManager, name), f"kvindex's KVCacheManager lacks {name}"
    ours = inspect.getattr_static(KVCacheManager, name)
    if isinstance(theirs, property):
        assert isinstance(ours, property), f"{name} is a property on vLLM's manager"
        assert (ours.fset is None) == (theirs.fset is None), f"{name}: settable differs"
    elif isinstance(theirs, staticmethod | classmethod):
        assert type(ours) is type(theirs), name
        assert _shape(ours.__func__) == _shape(theirs.__func__), name
    elif inspect.isfunction(theirs):
        assert inspect.isfunction(ours), f"{name} is a method on vLLM's manager"
        assert _shape(ours) == _shape(theirs), name
    else:
        assert type(ours) is type(theirs) or not callable(theirs), name


def _names_the_scheduler_uses() -> set[str]:
    names: set[str] = set()
    for path in sorted(SCHED_DIR.glob("*.py")):
        names |= set(re.findall(r"\bkv_cache_manager\.(\w+)", path.read_text(encoding="utf-8")))
    return names


def test_everything_vllms_schedulers_use_on_the_manager_exists() -> None:
    used = _names_the_scheduler_uses()
    assert len(used) >= 20, sorted(used)  # the scan itself still finds the calls
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )
    manager = KVCacheManager(
        kv_cache_config=config,
        max_model_len=1024,
        scheduler_block_size=16,
        hash_block_size=16,
        enable_caching=True,
    )
    missing = sorted(n for n in used if not hasattr(manager, n))
    assert not missing, f"vLLM's schedulers use {missing} on kv_cache_manager"
