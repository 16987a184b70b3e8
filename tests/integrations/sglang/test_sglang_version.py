"""The SGLang version check and the lazy package (no SGLang needed)."""

from __future__ import annotations

from importlib import metadata

import pytest

import kvindex.integrations.sglang as ks
from kvindex.exceptions import KvIndexError
from kvindex.integrations.sglang import version as ver


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.5.23", True),
        ("0.5.23+cpu", True),
        (" 0.5.23 ", True),
        ("0.5.22", False),
        ("0.5.24", False),
        ("0.6.0", False),
        ("", False),
        ("garbage", False),
    ],
)
def test_is_supported(version: str, ok: bool) -> None:
    assert ver.is_supported_sglang_version(version) is ok


def test_check_names_supported_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "0.4.9")
    with pytest.raises(ver.UnsupportedSglangVersionError, match=r"0\.5\.23.*0\.4\.9") as e:
        ver.check_sglang_version()
    assert isinstance(e.value, KvIndexError)

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(
        ver.UnsupportedSglangVersionError, match=r"not installed.*kvindex\[sglang\]"
    ):
        ver.check_sglang_version()
    monkeypatch.setattr(metadata, "version", lambda name: "0.5.23")
    assert ver.check_sglang_version() == "0.5.23"


def test_lazy_names_check_the_version_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "0.1.0")
    monkeypatch.delitem(ks.__dict__, "KvindexRadixCache", raising=False)
    with pytest.raises(ver.UnsupportedSglangVersionError):
        ks.KvindexRadixCache  # noqa: B018
    with pytest.raises(AttributeError):
        ks.nothing_here  # noqa: B018


def test_plugin_refuses_other_release(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvindex.integrations.sglang import plugin

    monkeypatch.setattr(metadata, "version", lambda name: "0.5.0")
    with pytest.raises(ver.UnsupportedSglangVersionError):
        plugin.register()


def test_entry_point_is_declared() -> None:
    eps = metadata.entry_points(group="sglang.srt.plugins")
    ours = [ep for ep in eps if ep.name == "kvindex"]
    assert ours and ours[0].value == "kvindex.integrations.sglang.plugin:register"
