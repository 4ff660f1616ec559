"""The scheduler's hooks: role, config section, join attributes, rejoin point, pushes."""

from __future__ import annotations

from typing import Any

import pytest
import xce_scheduler.plugin as plugin
from sched_records import host, job, sync

from xcecore.config import ConfigError, validate

pytestmark = pytest.mark.timeout(30)


def test_role_through_the_plugin_manager(xce_plugin_manager: Any, xce_role: Any) -> None:
    pm = xce_plugin_manager(plugin)
    assert "scheduler" in pm.roles()
    role = xce_role(pm, "scheduler")
    assert role.rejoin_points == {"hello", "jobdispatch_many"}
    assert role.join_attributes() == {}
    assert role.ctx.section["interval"] == 0.05


def test_config_is_checked(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(plugin)
    with pytest.raises(ConfigError, match="interval"):
        validate({"scheduler": {"interval": 0}}, pm.config_sections())
    with pytest.raises(ConfigError, match="max_dispatch_per_cycle"):
        validate({"scheduler": {"max_dispatch_per_cycle": "x"}}, pm.config_sections())


def test_pushes_feed_the_role_view(xce_plugin_manager: Any, xce_role: Any) -> None:
    pm = xce_plugin_manager(plugin)
    role = xce_role(pm, "scheduler")
    assert role.subscription.to_wire()["jobs"] == "unfinished"
    for seq, (event, data) in enumerate(sync([host("a")], [job(1)]), 1):
        role.push(event, seq, data)
    role.push("job", 9, job(3))
    assert sorted(role.view.replica.records("jobs")) == [1, 3] and role.view.complete
    assert xce_role(pm, "scheduler").view.replica.count("jobs") == 0  # one view per role object


class FakeClient:
    """Records calls; ``rejoin_pending`` as the core client has it."""

    def __init__(self, rejoin_pending: bool) -> None:
        self.rejoin_pending = rejoin_pending
        self.calls: list[str] = []

    async def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(op)
        if op == "hello":
            self.rejoin_pending = False  # the client re-joins after its rejoin point
        return {}


def test_a_pending_rejoin_goes_through_hello_before_a_dispatch(xce_plugin_manager: Any, xce_role: Any) -> None:
    """After a reconnect, jobdispatch (which needs a join) would only earn NOT_JOINED: the
    scheduler says hello first, its rejoin point, so the client re-joins before dispatching."""
    import anyio

    pm = xce_plugin_manager(plugin)
    client = FakeClient(rejoin_pending=True)
    role = xce_role(pm, "scheduler", client=client)
    anyio.run(role.call, "jobdispatch", {"jobid": 1, "alloc": []})
    assert client.calls == ["hello", "jobdispatch"]
    anyio.run(role.call, "jobdispatch", {"jobid": 2, "alloc": []})
    assert client.calls == ["hello", "jobdispatch", "jobdispatch"]  # joined: no more hellos


def test_back_on_a_primary_with_a_rejoin_pending_it_says_hello(xce_plugin_manager: Any, xce_role: Any) -> None:
    import anyio

    pm = xce_plugin_manager(plugin)
    client = FakeClient(rejoin_pending=True)
    role = xce_role(pm, "scheduler", client=client)
    assert role.connection_state("reconnecting", None, "") is None
    pending = role.connection_state("connected", None, "")
    assert pending is not None

    async def settle() -> None:
        await pending

    anyio.run(settle)
    assert client.calls == ["hello"]
    assert role.connection_state("connected", None, "") is None  # nothing pending: nothing sent


def test_monitor_is_the_picker(xce_plugin_manager: Any, xce_role: Any, mocker: Any) -> None:
    role = xce_role(xce_plugin_manager(plugin), "scheduler", client=mocker.Mock())
    assert [m.name for m in role.monitors()] == ["picker"]


def test_the_picker_runs_on_its_thread_and_stops(xce_plugin_manager: Any, xce_role: Any, mocker: Any) -> None:
    import threading

    from xcecore.testing import wait_for

    pm = xce_plugin_manager(plugin)
    role = xce_role(pm, "scheduler", {"scheduler": {"interval": 0.01}}, client=mocker.Mock())
    for seq, (event, data) in enumerate(sync([host("a")], []), 1):
        role.push(event, seq, data)
    (monitor,) = role.monitors()
    app = role.app
    assert app is role.app and app.view is role.view and app.picker.interval == 0.01
    stop = threading.Event()
    runner = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: app.status.cycles >= 3, 5, what="picker cycles")
    finally:
        stop.set()
        runner.join(5)
    assert not runner.is_alive()
