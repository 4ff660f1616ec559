"""The plugin's hooks, the op table's documentation, and the settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from xce_controller import plugin
from xce_controller.election import FileLockElection
from xce_controller.ops import OPS
from xce_controller.settings import config_of, parse_listen, settings_from_config
from xce_controller.store import SQLiteStore

from xcecore.auth.key import KeyAuth

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol-ops.md"


def test_every_op_and_push_is_documented():
    text = DOC.read_text()
    for op in OPS:
        assert re.search(rf"^\| `{op}` \|", text, re.M), f"op {op} missing from the op table"
    assert "| `sync_begin` / `sync_records` / `sync_removed` / `sync_end` |" in text
    for event in ("job", "job_removed", "signal", "host", "queue", "resvals", "jusage", "pend_reasons",
                  "member", "shutdown"):
        assert f"| `{event}` |" in text


def test_hooks_return_the_builtins(tmp_path):
    (role,) = plugin.xce_roles()
    assert role.name == "controller" and role.client is False
    (section,) = plugin.xce_config_sections()
    assert section.name == "controller" and "queues" in section.fields
    election = plugin.xce_controller_election(state_dir=str(tmp_path), advertise="h:1", hung_timeout=2.0)
    assert isinstance(election, FileLockElection)
    assert isinstance(plugin.xce_controller_store(state_dir=str(tmp_path)), SQLiteStore)


def test_the_plugin_adds_its_hooks_to_the_manager(tmp_path, xce_plugin_manager, mocker):
    """xce_addhooks gives the manager the controller's specs; the typed facade calls through them."""
    from xce_controller import hookspecs

    from xcecore.hookspecs import hookimpl

    pm = xce_plugin_manager(builtins=False)
    assert not hasattr(pm.hook, "xce_controller_store")
    pm.register(plugin, "controller")
    assert pm.hook.xce_controller_store.spec is not None  # a spec, not just an implementation
    assert isinstance(hookspecs.store(pm.hook, str(tmp_path)), SQLiteStore)

    class SiteStore:
        @hookimpl
        def xce_controller_store(self, state_dir):
            return "site store"

    pm.register(SiteStore(), "site")
    assert hookspecs.store(pm.hook, str(tmp_path)) == "site store"  # firstresult: the site's wins
    spy = mocker.spy(pm.hook, "xce_controller_election")
    assert isinstance(hookspecs.election(pm.hook, str(tmp_path), "h:1", 2.0), FileLockElection)
    spy.assert_called_once_with(state_dir=str(tmp_path), advertise="h:1", hung_timeout=2.0,
                                backend="file", config=None)
    # [controller] backend: the built-ins answer only "file"; an unprovided backend is named
    assert plugin.xce_controller_store(state_dir=str(tmp_path), backend="etcd") is None
    assert plugin.xce_controller_election(state_dir=str(tmp_path), advertise="h:1", hung_timeout=2.0,
                                          backend="etcd") is None
    solo = xce_plugin_manager(builtins=False)
    solo.register(plugin, "controller")
    with pytest.raises(RuntimeError, match="for backend 'nosuch'"):
        hookspecs.election(solo.hook, str(tmp_path), "h:1", 2.0, "nosuch")
    bare = xce_plugin_manager(builtins=False)
    bare.add_hookspecs(hookspecs)
    with pytest.raises(RuntimeError, match="no plugin provides a controller store"):
        hookspecs.store(bare.hook, str(tmp_path))


def test_plugin_import_is_light():
    code = "import sys, xce_controller.plugin; print('sqlite3' in sys.modules, 'xce_controller.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_settings_and_config_checks():
    s = settings_from_config(config_of({"name": "c1", "resources": [{"name": "gpu", "type": "bool"}]},
                                       {"state_dir": "/tmp/x", "admins": ["root"],
                                        "queues": [{"name": "q", "priority": 5}], "default_queue": "q"}), KeyAuth(None))
    assert s.conf.admins == frozenset({"root"}) and s.conf.resources == [{"name": "gpu", "type": "bool"}]
    assert (s.state_dir, s.conf.name, s.conf.default_queue) == ("/tmp/x", "c1", "q")
    for bad, text in [
        ({"queues": [{"priority": 1}]}, "'name'"),
        ({"queues": [{"name": "a"}, {"name": "a"}]}, "defined twice"),
        ({"queues": [{"name": "a", "priority": "high"}]}, "'priority'"),
        ({"default_queue": "nope"}, "not a configured queue"),
        ({"listen": "nocolon"}, "host:port"),
        ({"host_timeout": 0}, "host_timeout"),
        ({"clean_period": -1}, "clean_period"),
        ({"idem_ttl": 0}, "idem_ttl"),
        ({"max_inflight": 0}, "max_inflight"),
        ({"advertise": "a;b:1"}, "not a separator"),
    ]:
        with pytest.raises(ValueError, match=text):
            config_of(controller={"state_dir": "/tmp/x", **bad})
    assert parse_listen("[::1]:0") == ("::1", 0)


def test_defaults_are_written_once_and_state_dir_is_the_controllers():
    """Every default comes from the section's fields; state_dir is required when the role runs."""
    from xce_controller.settings import DEFAULT_QUEUES, HOST_TIMEOUT, IDEM_TTL, SECTION

    from xcecore.config import ConfigError

    s = settings_from_config(config_of(controller={"state_dir": "/tmp/x"}), KeyAuth(None))
    assert s.conf.host_timeout == HOST_TIMEOUT == SECTION.fields["host_timeout"].default
    assert s.idem_ttl == IDEM_TTL == SECTION.fields["idem_ttl"].default == 86400.0
    assert s.conf.queues == DEFAULT_QUEUES and s.listen == SECTION.fields["listen"].default
    with pytest.raises(ConfigError, match="controller.state_dir is required"):
        settings_from_config(config_of(), KeyAuth(None))
    with pytest.raises(ConfigError, match="unknown key cluster.state_dir"):
        config_of({"state_dir": "/tmp/x"})


def test_store_load_has_no_ttl_default_of_its_own(tmp_path):
    """The store loads the keys from the time it is given (the controller's idem_ttl)."""
    import inspect

    for method in (SQLiteStore.load_idem, SQLiteStore.snapshot):
        for p in inspect.signature(method).parameters.values():
            assert p.default is inspect.Parameter.empty, (method, p)
