"""The vLLM integration's start-up surface, checked without vLLM installed: importing kvindex
never imports vLLM, the version gate names the supported releases, and the
``vllm.general_plugins`` hook does nothing unless ``KVINDEX_VLLM`` asks for it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import kvindex.integrations.vllm as kv_vllm
from kvindex.exceptions import InvalidArgumentError, KvIndexError
from kvindex.integrations.vllm import plugin, version

ROOT = Path(__file__).resolve().parents[3]


def test_importing_kvindex_and_the_integration_does_not_import_vllm() -> None:
    code = (
        "import sys, kvindex, kvindex.integrations.vllm, kvindex.integrations.vllm.plugin\n"
        "kvindex.integrations.vllm.plugin.register()\n"
        "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd="/")


@pytest.mark.parametrize(
    ("v", "ok"),
    [
        ("0.33.0", True),
        ("0.33.1", True),
        ("0.33.2.dev7+g1234abc", True),
        ("0.33", True),
        ("0.32.9", False),
        ("0.34.0", False),
        ("0.11.1", False),
        ("1.33.0", False),
        ("0.330.0", False),
        ("", False),
        ("garbage", False),
    ],
)
def test_supported_versions(v: str, ok: bool) -> None:
    assert version.is_supported_vllm_version(v) is ok


def _fake_vllm_version(monkeypatch: pytest.MonkeyPatch, v: str | None) -> None:
    def fake(name: str) -> str:
        if name != "vllm":
            raise AssertionError(name)
        if v is None:
            raise metadata.PackageNotFoundError(name)
        return v

    monkeypatch.setattr(metadata, "version", fake)


def test_other_vllm_release_is_one_clear_error_naming_the_supported_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_vllm_version(monkeypatch, "0.11.1")
    with pytest.raises(version.UnsupportedVllmVersionError, match=r"0\.33\.\*.*0\.11\.1") as e:
        version.check_vllm_version()
    assert isinstance(e.value, KvIndexError)
    # The vLLM-facing names are gated the same way, before vLLM is imported.
    for name in ("Scheduler", "AsyncScheduler", "KVCacheManager"):
        kv_vllm.__dict__.pop(name, None)
        with pytest.raises(version.UnsupportedVllmVersionError, match=r"0\.33\.\*"):
            getattr(kv_vllm, name)


def test_missing_vllm_is_the_same_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm_version(monkeypatch, None)
    missing = r"not installed.*kvindex\[vllm\]"
    with pytest.raises(version.UnsupportedVllmVersionError, match=missing):
        version.check_vllm_version()


def test_supported_release_passes_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm_version(monkeypatch, "0.33.0")
    assert version.check_vllm_version() == "0.33.0"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        kv_vllm.NoSuchThing  # noqa: B018


@pytest.mark.parametrize("value", [None, "", "0", "false", "No", " off "])
def test_plugin_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV_VAR, value)
    # Off means nothing is checked or imported: not even another vLLM release is an error.
    _fake_vllm_version(monkeypatch, "0.11.1")
    assert plugin.enabled() is False
    plugin.register()


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_plugin_on_checks_the_release_first(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, value)
    assert plugin.enabled() is True
    _fake_vllm_version(monkeypatch, "0.34.0")
    with pytest.raises(version.UnsupportedVllmVersionError, match=r"0\.33\.\*.*0\.34\.0"):
        plugin.register()


def test_plugin_rejects_a_value_it_does_not_understand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, "kvindex")
    with pytest.raises(InvalidArgumentError, match="KVINDEX_VLLM"):
        plugin.enabled()


def test_packaging_declares_the_opt_in_entry_point_and_the_pinned_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    hooks = project["entry-points"]["vllm.general_plugins"]
    assert hooks == {"kvindex": "kvindex.integrations.vllm.plugin:register"}
    pins = project["optional-dependencies"]["vllm"]
    assert pins == [f"vllm=={s}" for s in version.SUPPORTED_VLLM_VERSIONS]
