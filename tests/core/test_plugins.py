"""The plugin manager: selection by config, a typed facade, spies on hooks, and `xce run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pytest_mock import MockerFixture

from xcecore.candidates import Candidate
from xcecore.hookspecs import hookimpl
from xcecore.plugins import BUILTINS, PluginError, PluginManager, select_plugins
from xcecore.records import Monitor, RoleSpec

pytestmark = pytest.mark.timeout(60)
HERE = Path(__file__).parent


class FakeRole:
    """A plugin object with a hook implementation per hook the role needs."""

    @hookimpl
    def xce_roles(self) -> list[RoleSpec]:
        async def main(ctx: Any) -> None:
            return None

        return [RoleSpec("fake", main)]

    @hookimpl
    def xce_join_attributes(self, role: str) -> dict[str, Any] | None:
        return {"hname": "h1"} if role == "fake" else None

    @hookimpl
    def xce_rejoin_points(self, role: str) -> list[str] | None:
        return ["hello"] if role == "fake" else None

    @hookimpl
    def xce_monitors(self, role: str) -> list[Monitor] | None:
        return [Monitor("m", lambda ctx, stop: None)] if role == "fake" else None


def test_select_plugins() -> None:
    avail = ["controller", "worker", "scheduler"]
    assert select_plugins({}, avail, autoload=True) == [*BUILTINS, *avail]
    assert select_plugins({"disable": ["worker"]}, avail, autoload=True) == [*BUILTINS, "controller", "scheduler"]
    assert select_plugins({"enable": ["worker"]}, avail, autoload=True) == [*BUILTINS, "worker"]
    assert select_plugins({}, avail, autoload=False) == list(BUILTINS)
    assert select_plugins({"enable": ["scheduler"]}, avail, autoload=False) == [*BUILTINS, "scheduler"]
    assert "resreq" not in select_plugins({"disable": ["resreq"]}, avail, autoload=True)
    with pytest.raises(PluginError, match="unknown plugin 'wroker'; choose one of: .*worker"):
        select_plugins({"disable": ["wroker"]}, avail, autoload=True)


def test_env_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XCE_PLUGINS", "worker")
    assert select_plugins({}, ["worker", "scheduler"], autoload=False) == [*BUILTINS, "worker"]


def test_facade_asks_hooks_with_spies(mocker: MockerFixture) -> None:
    pm = PluginManager()
    pm.register(FakeRole(), "fake")
    spy = mocker.spy(pm.pm.hook, "xce_join_attributes")
    assert pm.join_attributes("fake", config=None) == {"hname": "h1"}  # type: ignore[arg-type]
    spy.assert_called_once_with(role="fake", config=None)
    assert pm.rejoin_points("fake") == frozenset({"hello"})
    assert pm.rejoin_points("other") == frozenset()
    assert list(pm.roles()) == ["fake"]
    assert [m.name for m in pm.monitors("fake", ctx=None)] == ["m"]  # type: ignore[arg-type]


def test_mocked_hook_called_by_facade(mocker: MockerFixture) -> None:
    pm = PluginManager()
    mock = mocker.patch.object(pm.pm.hook, "xce_reconnected", return_value=[])
    cand = Candidate("127.0.0.1", 7600)
    pm.reconnected("client", cand)
    mock.assert_called_once_with(client="client", candidate=cand)
    push = mocker.patch.object(pm.pm.hook, "xce_push")
    pm.push("c", "fake", "job", 3, {"x": 1})
    push.assert_called_once_with(client="c", role="fake", event="job", seq=3, data={"x": 1})


def test_duplicate_role_names() -> None:
    pm = PluginManager()
    pm.register(FakeRole(), "a")
    pm.register(FakeRole(), "b")
    with pytest.raises(PluginError, match="role 'fake' is registered twice"):
        pm.roles()


def test_duplicate_plugin_name() -> None:
    pm = PluginManager()
    pm.register(FakeRole(), "a")
    with pytest.raises(PluginError, match="already registered"):
        pm.register(FakeRole(), "a")


def test_info_lists_hooks() -> None:
    pm = PluginManager()
    pm.register(FakeRole(), "fake", ("fake-dist", "1.2"))
    (info,) = pm.info()
    assert (info.name, info.distribution, info.version) == ("fake", "fake-dist", "1.2")
    assert "xce_roles" in info.hooks and "xce_monitors" in info.hooks


def test_missing_evaluator_is_clear() -> None:
    with pytest.raises(PluginError, match="resource-requirement evaluator"):
        PluginManager().resreq_evaluator(registry=None)


def _xce(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full.pop("XCE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=60)


def test_xce_run_fake_role_registered_through_the_role_hook(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[plugins]\nmodules = ["fake_role_plugin"]\n[fakerole]\nout = "{out}"\n')
    env = {"PYTHONPATH": str(HERE)}
    res = _xce("--config", str(cfg), "run", "fakerole", "--set", "fakerole.greeting=hello", env=env)
    assert res.returncode == 0, res.stderr
    role, ident, greeting, _pid = out.read_text().split()
    assert (role, greeting) == ("fakerole", "hello")
    assert ident.startswith("fakerole@")
    assert "starting role fakerole" in res.stderr
    assert "event loop uvloop" in res.stderr  # installed with xce: the default ``auto`` takes it


def test_xce_run_on_the_standard_loop_when_configured(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cluster]\nevent_loop = "asyncio"\n[plugins]\nmodules = ["fake_role_plugin"]\n'
                   f'[fakerole]\nout = "{out}"\n')
    res = _xce("--config", str(cfg), "run", "fakerole", env={"PYTHONPATH": str(HERE)})
    assert res.returncode == 0, res.stderr
    assert "event loop asyncio" in res.stderr and out.read_text().startswith("fakerole")


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from xcecore.config import ConfigError
    from xcecore.runtime import RoleError, load, loop_options

    assert loop_options("asyncio") == {}
    assert loop_options("auto") == {"use_uvloop": True}
    assert loop_options("uvloop") == {"use_uvloop": True}
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    assert loop_options("auto") == {}
    with pytest.raises(RoleError, match="uvloop is not installed"):
        loop_options("uvloop")
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\nevent_loop = "trio"\n')
    with pytest.raises(ConfigError, match="event_loop must be one of auto, uvloop, asyncio"):
        load(bad)


def test_xce_run_unknown_role(tmp_path: Path) -> None:
    res = _xce("run", "nosuchrole")
    assert res.returncode != 0
    assert "unknown role 'nosuchrole'" in res.stderr


def test_xce_plugins_lists_roles_and_honours_config(tmp_path: Path) -> None:
    res = _xce("plugins", "--json")
    assert res.returncode == 0, res.stderr
    import orjson

    names = {row["name"]: row for row in orjson.loads(res.stdout)}
    for role in ("controller", "worker", "scheduler", "apiserver"):
        assert role in names, names.keys()
        assert names[role]["version"] == "0.1.0"
        assert "xce_roles" in names[role]["hooks"]
    cfg = tmp_path / "c.toml"
    cfg.write_text('[plugins]\ndisable = ["worker"]\n')
    res = _xce("--config", str(cfg), "plugins", "--json")
    assert res.returncode == 0, res.stderr
    assert "worker" not in {row["name"] for row in orjson.loads(res.stdout)}
    cfg.write_text('[plugins]\ndisable = ["wroker"]\n')
    res = _xce("--config", str(cfg), "plugins")
    assert res.returncode != 0
    assert "unknown plugin 'wroker'" in res.stderr


def test_autoload_off_loads_only_named(tmp_path: Path) -> None:
    import orjson

    res = _xce("plugins", "--json", env={"XCE_DISABLE_PLUGIN_AUTOLOAD": "1", "XCE_PLUGINS": "scheduler"})
    assert res.returncode == 0, res.stderr
    names = {row["name"] for row in orjson.loads(res.stdout)}
    assert "scheduler" in names and "worker" not in names and "controller" not in names
