"""The scheduler's hooks: role, config section, join attributes, rejoin point, pushes."""

from __future__ import annotations

from typing import Any

import pytest
import xce_scheduler.plugin as plugin
from sched_records import host, job, state
from xce_scheduler.role import view_for

from xcecore.config import ConfigError, validate

pytestmark = pytest.mark.timeout(30)


def test_hooks_through_the_plugin_manager(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(plugin)
    assert "scheduler" in pm.roles()
    assert pm.rejoin_points("scheduler") >= {"jobdispatch"}
    assert "jobdispatch" not in pm.rejoin_points("worker")
    cfg = validate({}, pm.config_sections())
    assert pm.join_attributes("scheduler", cfg) == {}
    assert cfg.section("scheduler")["interval"] == 0.05


def test_config_is_checked(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(plugin)
    with pytest.raises(ConfigError, match="interval"):
        validate({"scheduler": {"interval": 0}}, pm.config_sections())
    with pytest.raises(ConfigError, match="max_dispatch_per_cycle"):
        validate({"scheduler": {"max_dispatch_per_cycle": "x"}}, pm.config_sections())


def test_push_feeds_the_view_of_that_client(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(plugin)

    class FakeClient:
        pass

    client = FakeClient()
    pm.push(client, "scheduler", "state", 1, state([host("a")], [job(1)]))
    pm.push(client, "worker", "job", 2, job(2))  # not ours: ignored
    pm.push(client, "scheduler", "job", 3, job(3))
    snap = view_for(client).snapshot()
    assert sorted(j["jobid"] for j in snap.pending) == [1, 3]
    assert view_for(FakeClient()).snapshot().pending == ()


def test_monitor_is_the_picker(xce_plugin_manager: Any, mocker: Any) -> None:
    pm = xce_plugin_manager(plugin)
    ctx = mocker.Mock()
    names = [m.name for m in pm.monitors("scheduler", ctx)]
    assert names == ["picker"]
    assert pm.monitors("worker", ctx) == []


def test_role_wiring_builds_once_without_deadlock(xce_plugin_manager: Any, mocker: Any) -> None:
    """The picker monitor and main both ask for the app; building it asks for the view."""
    import threading

    from xce_scheduler import role

    from xcecore.config import validate as _validate

    pm = xce_plugin_manager(plugin)
    ctx = mocker.Mock()
    ctx.pm = pm
    ctx.section = _validate({"scheduler": {"interval": 0.01}}, pm.config_sections()).section(
        "scheduler")
    pm.push(ctx.client, "scheduler", "state", 1, state([host("a")], []))
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(role.app_for(ctx)), daemon=True)
    t.start()
    t.join(5)
    assert got, "app_for deadlocked"
    app = got[0]
    assert app is role.app_for(ctx)
    assert app.view is role.view_for(ctx.client)
    assert app.picker.interval == 0.01
    stop = threading.Event()
    runner = threading.Thread(target=role.run_picker, args=(ctx, stop), daemon=True)
    runner.start()
    try:
        from xcecore.testing import wait_for

        wait_for(lambda: app.status.cycles >= 3, 5, what="picker cycles")
    finally:
        stop.set()
        runner.join(5)
    assert not runner.is_alive()
