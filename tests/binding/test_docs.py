"""Docs are written once: the native module's runtime docstrings (PyO3 ``///`` comments)
and the ``_core.pyi`` stubs say the same thing, member by member."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import kvindex._core as core

STUB = Path(__file__).resolve().parents[2] / "python" / "kvindex" / "_core.pyi"

# The KV-event classes are plain records whose stubs document their fields; they are
# compared by the wire-encoding tests that own them.
EVENT_CLASSES = {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def _pairs() -> list[tuple[str, str, str]]:
    """(name, stub docstring, runtime docstring) for every documented stub entry."""
    tree = ast.parse(STUB.read_text())
    out: list[tuple[str, str, str]] = []

    def runtime(obj: object) -> str:
        return inspect.cleandoc(getattr(obj, "__doc__", None) or "")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            stub = ast.get_docstring(node, clean=True) or ""
            out.append((node.name, stub, runtime(getattr(core, node.name))))
        elif isinstance(node, ast.ClassDef) and node.name not in EVENT_CLASSES:
            cls = getattr(core, node.name)
            out.append((node.name, ast.get_docstring(node, clean=True) or "", runtime(cls)))
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and not m.name.startswith("__"):
                    stub = ast.get_docstring(m, clean=True) or ""
                    out.append((f"{node.name}.{m.name}", stub, runtime(cls.__dict__.get(m.name))))
    return out


PAIRS = _pairs()


@pytest.mark.parametrize(("name", "stub", "runtime"), PAIRS, ids=[p[0] for p in PAIRS])
def test_runtime_docstring_matches_stub(name: str, stub: str, runtime: str) -> None:
    assert runtime == stub


def test_shared_methods_say_the_same_on_both_caches() -> None:
    for name in ("admit", "append", "free", "block_tables", "slot_mapping", "checkpoint"):
        a = getattr(core.HashChainCache, name).__doc__
        b = getattr(core.RadixPrefixCache, name).__doc__
        assert a and a == b, name


def test_every_public_method_is_documented() -> None:
    missing = [
        f"{cls.__name__}.{name}"
        for cls in (core.HashChainCache, core.RadixPrefixCache, core.RadixTree)
        for name, obj in vars(cls).items()
        if not name.startswith("_") and not (getattr(obj, "__doc__", None) or "").strip()
    ]
    assert missing == []


def test_protocol_describes_exactly_the_shared_interface() -> None:
    from kvindex.protocol import PrefixCache

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")} | {"__contains__"}

    proto = {n for n in vars(PrefixCache) if not n.startswith("_")} | {"__contains__"}
    shared = public(core.HashChainCache) & public(core.RadixPrefixCache)
    assert proto == shared
