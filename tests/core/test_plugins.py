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
from xcecore.config import CORE_SECTIONS, validate
from xcecore.hookspecs import hookimpl
from xcecore.plugins import BUILTINS, PluginError, PluginManager, select_plugins
from xcecore.role import Monitor, Role, RoleSpec

pytestmark = pytest.mark.timeout(60)
HERE = Path(__file__).parent


class FakeRole(Role):
    """A role object with what a client role supplies."""

    rejoin_points = frozenset({"hello"})

    def join_attributes(self) -> dict[str, Any]:
        return {"hname": self.ctx.section.get("hname", "h1")}

    def monitors(self) -> list[Monitor]:
        return [Monitor("m", lambda stop: None)]


class FakePlugin:
    """A plugin object registering the fake role."""

    @hookimpl
    def xce_roles(self) -> list[RoleSpec]:
        return [RoleSpec("fake", FakeRole)]


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


def test_facade_asks_the_role_hook_and_the_role_object(mocker: MockerFixture) -> None:
    pm = PluginManager()
    pm.register(FakePlugin(), "fake")
    spy = mocker.spy(pm.pm.hook, "xce_roles")
    assert list(pm.roles()) == ["fake"]
    spy.assert_called_once_with()
    cfg = validate({}, CORE_SECTIONS)
    assert pm.join_attributes("fake", cfg) == {"hname": "h1"}
    assert pm.join_attributes("nosuchrole", cfg) is None  # as documented: no plugin registers it
    with pytest.raises(PluginError, match="unknown role 'nosuch'; registered roles: fake"):
        pm.role("nosuch")


def test_mocking_the_role_hook_takes_effect(mocker: MockerFixture) -> None:
    """pm.roles() calls the hook (not the implementations behind its back): a mock wins."""
    pm = PluginManager()
    pm.register(FakePlugin(), "fake")
    mocker.patch.object(pm.pm.hook, "xce_roles", return_value=[[RoleSpec("mocked", FakeRole)]])
    assert list(pm.roles()) == ["mocked"]
    assert pm.join_attributes("fake", validate({}, CORE_SECTIONS)) is None


def test_mocked_hook_called_by_facade(mocker: MockerFixture) -> None:
    pm = PluginManager()
    mock = mocker.patch.object(pm.pm.hook, "xce_reconnected", return_value=[])
    cand = Candidate("127.0.0.1", 7600)
    pm.reconnected("client", cand)
    mock.assert_called_once_with(client="client", candidate=cand)
    push = mocker.patch.object(pm.pm.hook, "xce_push", return_value=[])
    pm.push("c", "fake", "job", 3, {"x": 1})
    push.assert_called_once_with(client="c", role="fake", event="job", seq=3, data={"x": 1})
    state = mocker.patch.object(pm.pm.hook, "xce_connection_state", return_value=[])
    pm.connection_state("c", "fake", "connected", cand, "ok")
    state.assert_called_once_with(client="c", role="fake", state="connected", candidate=cand, detail="ok")


def test_duplicate_role_names_name_both_plugins() -> None:
    pm = PluginManager()
    pm.register(FakePlugin(), "a")
    pm.register(FakePlugin(), "b")
    with pytest.raises(PluginError, match="role 'fake' is registered twice \\(by plugins 'a' and 'b'\\)"):
        pm.roles()


def test_a_role_hook_answering_something_else_is_named() -> None:
    class Broken:
        @hookimpl
        def xce_roles(self) -> list[str]:
            return ["not a spec"]

    pm = PluginManager()
    pm.register(Broken(), "broken")
    with pytest.raises(PluginError, match="xce_roles returned 'not a spec', not a RoleSpec"):
        pm.roles()


def test_duplicate_plugin_name() -> None:
    pm = PluginManager()
    pm.register(FakePlugin(), "a")
    with pytest.raises(PluginError, match="already registered"):
        pm.register(FakePlugin(), "a")


def test_info_lists_hooks() -> None:
    pm = PluginManager()
    pm.register(FakePlugin(), "fake", ("fake-dist", "1.2"))
    (info,) = pm.info()
    assert (info.name, info.distribution, info.version) == ("fake", "fake-dist", "1.2")
    assert info.hooks == ("xce_roles",)


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


def test_one_file_for_every_host(tmp_path: Path) -> None:
    """A host with only the worker accepts the shared file (its other sections unchecked)."""
    shared = HERE.parents[1] / "examples" / "configs" / "three-on-one-host.toml"
    env = {"XCE_DISABLE_PLUGIN_AUTOLOAD": "1", "XCE_PLUGINS": "worker"}
    res = _xce("--config", str(shared), "plugins", "--json", env=env)
    assert res.returncode == 0, res.stderr
    res = _xce("--config", str(shared), "config", "check", env=env)
    assert res.returncode == 0, res.stderr
    assert "not checked (no loaded plugin declares them): [apiserver], [controller], [scheduler]" in res.stderr
    assert '"worker"' in res.stdout


def test_a_required_key_fails_only_the_role_that_owns_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[plugins]\nmodules = ["fake_role_plugin"]\n')
    env = {"PYTHONPATH": str(HERE)}
    res = _xce("--config", str(cfg), "plugins", env=env)
    assert res.returncode == 0, res.stderr  # other commands run on a host without [fakerole]
    res = _xce("--config", str(cfg), "config", "check", env=env)
    assert res.returncode == 0 and "[fakerole] lacks required out" in res.stderr, res.stderr
    res = _xce("--config", str(cfg), "run", "fakerole", env=env)
    assert res.returncode != 0 and "fakerole.out is required: where to write" in res.stderr, res.stderr
