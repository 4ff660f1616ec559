"""The entry-point reader (importlib.metadata's rules without its import cost) and the cached
plugin-command listing of ``xce --help``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import xcecore.cli.plugins as cli_plugins
import xcecore.plugins as plugins_mod
from xcecore import usercache
from xcecore.cli.options import Options
from xcecore.entrypoints import EntryPoint, fingerprint, parse_group, scan


def dist(root: Path, name: str, version: str, entry_points: str | None,
         editable: bool = False) -> Path:
    d = root / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")
    if entry_points is not None:
        (d / "entry_points.txt").write_text(entry_points)
    if editable:
        (d / "direct_url.json").write_text('{"url": "file:///src", "dir_info": {"editable": true}}')
    return d


def test_parse_group_reads_only_the_named_section() -> None:
    text = "[console_scripts]\nxce = x:y\n\n[xce.plugins]\n# a comment\nfoo = foo.plugin\nbar=bar.mod:attr\n"
    assert parse_group(text, "xce.plugins") == [("foo", "foo.plugin"), ("bar", "bar.mod:attr")]
    assert parse_group(text, "console_scripts") == [("xce", "x:y")]
    assert parse_group(text, "missing") == []


def test_scan_keeps_the_first_copy_of_a_distribution_on_the_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    dist(first, "xce_foo", "2.0", "[xce.plugins]\nfoo = foo_new.plugin\n")
    dist(second, "xce-foo", "1.0", "[xce.plugins]\nfoo = foo_old.plugin\n")  # same name, normalised
    dist(second, "other", "1.0", "[xce.plugins]\nother = other.plugin\n[x]\ny = z\n")
    dist(second, "plain", "1.0", None)  # no entry points at all
    found = scan("xce.plugins", [str(first), str(second), str(tmp_path / "missing")])
    assert [(e.name, e.value) for e in found] == [("foo", "foo_new.plugin"), ("other", "other.plugin")]
    assert found[0].distribution() == ("xce_foo", "2.0")
    assert not found[0].editable


def test_load_imports_the_module_and_the_attribute() -> None:
    ep = EntryPoint("x", "xcecore.entrypoints:EntryPoint.load", "g", "/nonexistent")
    assert ep.load() is EntryPoint.load
    assert EntryPoint("x", "xcecore.entrypoints", "g", "/nonexistent").load().__name__ == "xcecore.entrypoints"  # type: ignore[union-attr]


def test_the_installed_plugins_are_what_importlib_metadata_finds() -> None:
    from importlib.metadata import entry_points

    want = sorted((e.name, e.value) for e in entry_points(group=plugins_mod.ENTRY_POINT_GROUP))
    assert want, "no xce plugins installed in this venv"
    assert sorted((e.name, e.value) for e in plugins_mod.installed_plugins().values()) == want


@pytest.fixture
def fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Installed plugins replaced by one fake distribution; counts real listings."""
    root = tmp_path / "site"
    state: dict[str, Any] = {"dir": dist(root, "xce_fake", "1.0", "[xce.plugins]\nfake = m\n"),
                             "built": 0, "root": root}
    monkeypatch.setattr(cli_plugins, "installed_entry_points",
                        lambda: scan("xce.plugins", [str(state["root"])]))

    class Cmd:
        def get_short_help_str(self, limit: int) -> str:
            return f"help {state['built']}"

    class Group:
        commands = {"fakecmd": Cmd()}

    def build(opts: Options, *, listing: bool) -> tuple[Any, dict[str, Any]]:
        state["built"] += 1
        return Group(), {}

    monkeypatch.setattr(cli_plugins, "plugin_group", build)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for var in (plugins_mod.ENV_MODULES, plugins_mod.ENV_PLUGINS, "XCE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return state


def test_the_listing_is_cached_until_a_plugin_is_reinstalled(fake_install: dict[str, Any]) -> None:
    opts = Options()
    assert cli_plugins.plugin_listing(opts) == [("fakecmd", "help 1")]
    assert cli_plugins.plugin_listing(opts) == [("fakecmd", "help 1")]  # from the cache
    assert fake_install["built"] == 1
    d: Path = fake_install["dir"]
    before = fingerprint(scan("xce.plugins", [str(fake_install["root"])]))
    st = os.stat(d)
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # what a reinstall does
    assert fingerprint(scan("xce.plugins", [str(fake_install["root"])])) != before
    assert cli_plugins.plugin_listing(opts) == [("fakecmd", "help 2")]
    assert fake_install["built"] == 2


def test_a_damaged_cache_is_rebuilt(fake_install: dict[str, Any]) -> None:
    opts = Options()
    cli_plugins.plugin_listing(opts)
    name, where = cli_plugins._cache_name({}), usercache.cache_dir()
    assert name is not None and where is not None and os.path.exists(os.path.join(where, name))
    Path(where, name).write_text("{not json")
    assert cli_plugins.plugin_listing(opts) == [("fakecmd", "help 2")]


def test_editable_installs_and_plugin_modules_are_never_cached(
        fake_install: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    dist(fake_install["root"], "xce_dev", "0.1", "[xce.plugins]\ndev = d\n", editable=True)
    opts = Options()
    cli_plugins.plugin_listing(opts)
    cli_plugins.plugin_listing(opts)
    assert fake_install["built"] == 2
    assert cli_plugins._cache_name({}) is None
    assert cli_plugins._cache_name({"modules": ["mine"]}) is None
