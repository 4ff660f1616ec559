"""The plugin guide's code runs: each Python block of docs/plugins.md that claims it is tested."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import anyio
import pytest

from xcecore.hookspecs import hookimpl
from xcecore.plugins import PluginManager
from xcecore.role import Role, RoleSpec
from xcecore.runtime import RoleEvents
from xcecore.testing.roles import make_role

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE, re.S)
pytestmark = pytest.mark.timeout(60)


def block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"docs/plugins.md has {len(found)} python blocks with {marker!r}"
    return found[0]


def module(marker: str, name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(block(marker), f"docs/plugins.md:{name}", "exec"), mod.__dict__)
    return mod


def test_the_five_minute_role_runs(tmp_path: Path) -> None:
    mod = module("class AuditorRole", "doc_auditor")
    pm = PluginManager()
    pm.register(mod, "doc_auditor")
    log = tmp_path / "audit.log"
    role = make_role(pm, "auditor", {"auditor": {"log_file": str(log)}})
    assert role.join_attributes() == {"log_file": str(log)}
    assert role.subscription.to_wire() == {"jobs": "all"}
    role.push("sync_begin", 1, {"mode": "snapshot", "store": "s", "rev": 1, "since": None})
    role.push("sync_records", 2, {"kind": "jobs", "items": [{"jobid": 1, "state": "PEND", "rev": 1}]})
    role.push("sync_end", 3, {"rev": 1})
    role.push("job", 4, {"jobid": 1, "state": "RUN", "rev": 2})
    role.push("job", 5, {"jobid": 1, "state": "RUN", "rev": 2})
    assert log.read_text().splitlines() == ["1 PEND", "1 RUN"]


def test_the_replica_example_runs() -> None:
    mod = module("class Pending(ReplicaObserver)", "doc_replica")
    assert mod.view.pending == {3} and mod.view.replica.syncs == 1


class FakeSync:
    """Stands in for the blocking facade behind ``ctx.call``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def call(self, op: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
        self.calls.append(op)
        return {"hosts": [{"name": "n1"}, {"name": "n2"}]}


def test_the_thread_side_loop_calls_and_hands_back_to_the_loop() -> None:
    mod = module("class HealthRole", "doc_health")

    class Plugin:
        @hookimpl
        def xce_roles(self) -> list[RoleSpec]:
            return [RoleSpec("health", mod.HealthRole)]

    pm = PluginManager()
    pm.register(Plugin(), "health")
    role = make_role(pm, "health")
    role.interval = 0.01  # type: ignore[attr-defined]  # a fast round for the test
    ctx = role.ctx
    sync = FakeSync()
    ctx._sync = sync  # type: ignore[assignment]
    (monitor,) = role.monitors()

    async def run() -> None:
        ctx.bridge.bind()
        handed = anyio.Event()
        seen = role.seen  # type: ignore[attr-defined]

        def on_loop(count: int) -> None:  # the snippet's loop-side method, then our signal
            seen(count)
            handed.set()

        role.seen = on_loop  # type: ignore[attr-defined]
        thread = threading.Thread(target=monitor.run, args=(ctx.stop,))
        thread.start()
        with anyio.fail_after(10):
            await handed.wait()
        ctx.stop.set()
        await anyio.to_thread.run_sync(thread.join, 10)
        assert not thread.is_alive()

    anyio.run(run)
    assert role.hosts == 2 and sync.calls[0] == "hostinfo"  # type: ignore[attr-defined]


def test_the_unit_test_recipes_pass_under_pytest(tmp_path: Path) -> None:
    test = tmp_path / "test_guide.py"
    test.write_text(block("def test_auditor_logs_each_change_once") + "\n\n"
                    + block("def test_a_mocked_role_hook"))
    env = {k: v for k, v in os.environ.items() if k != "XCE_CONFIG"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


def test_the_observer_hooks_see_every_role_and_are_awaited() -> None:
    mod = module("SEEN = []", "doc_observer")
    pm = PluginManager()
    pm.register(mod, "doc_observer")

    class Client:
        role = "anyrole"

    events = RoleEvents(_quiet_role(pm), pm)
    assert events.push(Client(), "anyrole", "job", 7, {}) is None  # all synchronous: nothing to await
    pending = events.connection_state(Client(), "connected", None, "ok")
    assert isinstance(pending, list) and len(pending) == 1  # the async observer, for the client

    async def settle() -> None:
        for item in pending:
            await item

    anyio.run(settle)
    assert mod.SEEN == [("anyrole", "job", 7), ("anyrole", "connected")]


def _quiet_role(pm: PluginManager) -> Role:
    class Plugin:
        @hookimpl
        def xce_roles(self) -> list[RoleSpec]:
            return [RoleSpec("quiet", Role)]

    pm.register(Plugin(), "quiet")
    return make_role(pm, "quiet")
