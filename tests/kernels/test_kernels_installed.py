"""The kernels ship in the wheel: ``kvindex.kernels`` imports from site-packages.

maturin packs only ``python/``; the jit code lives in ``python/kvindex/kernels/`` (the one
source of truth), so the installed package must hold every module, byte for byte. Run
pytest against the installed wheel (not with ``python/`` on ``sys.path``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import kvindex
import kvindex.kernels

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "python" / "kvindex" / "kernels"
# Every module of the source tree (so the list cannot go stale when modules are renamed).
MODULES = sorted(p.stem for p in SOURCE.glob("*.py") if p.stem != "__init__")


def test_kernels_import_from_installed_wheel() -> None:
    installed = Path(kvindex.kernels.__file__).resolve()
    assert installed.parent.parent.parent.name in ("site-packages", "dist-packages"), installed
    assert SOURCE.parent not in installed.parents, f"{installed} is the source tree, not the wheel"
    assert Path(kvindex.__file__).resolve().parent == installed.parent.parent
    assert "attention" in MODULES and "_store_kv" in MODULES, MODULES
    for name in MODULES:
        mod = importlib.import_module(f"kvindex.kernels.{name}")
        assert Path(mod.__file__ or "").resolve().parent == installed.parent
    assert callable(kvindex.kernels.paged_decode_attention)


def test_installed_kernels_match_the_source_tree() -> None:
    installed = Path(kvindex.kernels.__file__).resolve().parent
    sources = sorted(p.name for p in SOURCE.glob("*.py"))
    assert sources == sorted(p.name for p in installed.glob("*.py")), "rebuild the wheel"
    stale = [n for n in sources if (SOURCE / n).read_bytes() != (installed / n).read_bytes()]
    assert not stale, f"installed kvindex.kernels is stale, rebuild the wheel: {stale}"
