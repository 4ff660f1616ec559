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
from xce_controller.settings import parse_listen, settings_from_config
from xce_controller.store import SQLiteStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol-ops.md"


def test_every_op_and_push_is_documented():
    text = DOC.read_text()
    for op in OPS:
        assert re.search(rf"^\| `{op}` \|", text, re.M), f"op {op} missing from the op table"
    for event in ("state", "job", "job_removed", "signal", "host", "queue", "resvals", "jusage", "pend_reasons",
                  "member", "shutdown"):
        assert f"| `{event}` |" in text


def test_hooks_return_the_builtins(tmp_path):
    (role,) = plugin.xce_roles()
    assert role.name == "controller" and role.client is False
    (section,) = plugin.xce_config_sections()
    assert section.name == "controller" and "queues" in section.fields
    assert isinstance(plugin.xce_controller_election(state_dir=str(tmp_path), advertise="h:1"), FileLockElection)
    assert isinstance(plugin.xce_controller_store(state_dir=str(tmp_path)), SQLiteStore)


def test_plugin_import_is_light():
    code = "import sys, xce_controller.plugin; print('sqlite3' in sys.modules, 'xce_controller.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_settings_and_config_checks():
    s = settings_from_config({"state_dir": "/tmp/x", "name": "c1", "resources": [{"name": "gpu", "type": "bool"}]},
                             {"admins": ["root"], "queues": [{"name": "q", "priority": 5}], "default_queue": "q"}, None)
    assert s.conf.admins == frozenset({"root"}) and s.conf.resources == [{"name": "gpu", "type": "bool"}]
    (section,) = plugin.xce_config_sections()
    assert section.check is not None
    for bad, text in [
        ({"queues": [{"priority": 1}]}, "'name'"),
        ({"queues": [{"name": "a"}, {"name": "a"}]}, "defined twice"),
        ({"queues": [{"name": "a", "priority": "high"}]}, "'priority'"),
        ({"default_queue": "nope"}, "not a configured queue"),
        ({"listen": "nocolon"}, "host:port"),
        ({"host_timeout": 0}, "host_timeout"),
        ({"clean_period": -1}, "clean_period"),
    ]:
        with pytest.raises(ValueError, match=text):
            section.check(bad)
    assert parse_listen("[::1]:0") == ("::1", 0)
