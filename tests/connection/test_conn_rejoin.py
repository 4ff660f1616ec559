"""Re-joining: post-call rejoin points, NOT_JOINED healing, push gaps, idle heartbeat recovery."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from clientkit import SpyHooks, make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore import wire
from xcecore.candidates import parse_address
from xcecore.client import Client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _wait(pred: Any, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not pred():
            await anyio.sleep(0.01)


async def test_post_call_rejoin_only_at_rejoin_points_and_only_once(net, hooks, logs):
    async with FakeController("a", net=net) as a:
        attrs = {"ncpus": 4}
        async with mem_client(net, make_config(a.address), role="scheduler", hooks=hooks,
                          join_attrs=attrs, rejoin_points=["jobdispatch"]) as c:
            await c.connect()
            await c.join()
            assert [j.args for j in a.joins] == [{"role": "scheduler", "attrs": attrs, "since": None}]
            await _wait(lambda: [p[1] for p in hooks.pushes] == ["sync_begin", "sync_end"])
            await a.restart()
            await c.call("hello")  # reconnects; not a rejoin point
            assert c.rejoin_pending and len(a.joins) == 1
            await c.call("jobsubmit")
            assert c.rejoin_pending and len(a.joins) == 1
            await c.call("jobdispatch")  # the rejoin point: re-join after it, as its own call
            assert not c.rejoin_pending and len(a.joins) == 2
            ops = [r.op for r in a.requests if r.conn == 2]
            assert ops == ["hello", "jobsubmit", "jobdispatch", "join"]
            # The re-join resumes from the completed sync (same store, which survived).
            since = {"store": a.sync.store, "rev": 0}
            assert a.joins[1].args == {"role": "scheduler", "attrs": attrs, "since": since}
            await c.call("jobdispatch")
            await c.call("jobdispatch")
            assert len(a.joins) == 2  # only once
            await _wait(lambda: "rejoined" in [s for s, _, _ in hooks.states])
    assert logs.find(f"re-joined as scheduler on {a.address}", "INFO")


async def test_not_joined_reply_rejoins_and_retries_once(net, logs):
    async with FakeController("a", net=net) as a:
        a.require_join = {"update_resvals"}
        async with mem_client(net, make_config(a.address), role="worker") as c:
            await c.connect()
            await c.join()
            await a.restart()
            # No rejoin point was configured; NOT_JOINED heals it anyway.
            result = await c.call("update_resvals", {"r1m": 0.5})
            assert result["op"] == "update_resvals"
        sent = a.ops("update_resvals")
        assert len(sent) == 2 and sent[0].rid == sent[1].rid
        assert [r.op for r in a.requests if r.conn == 2] == [
            "update_resvals", "join", "update_resvals"]
    assert logs.find("answered NOT_JOINED to update_resvals; re-joining, then retrying once")


async def test_not_joined_twice_raises_remote_error(net):
    async with FakeController("a", net=net) as a:
        a.handlers["stubborn"] = lambda args: (_ for _ in ()).throw(
            wire.RemoteError("NOT_JOINED", "never"))
        async with mem_client(net, make_config(a.address), role="worker") as c:
            with pytest.raises(wire.RemoteError) as info:
                await c.call("stubborn")
            assert info.value.code == "NOT_JOINED"
        assert [r.op for r in a.requests] == ["stubborn", "join", "stubborn"]


async def test_other_error_replies_raise_remote_error_without_retry(net):
    async with FakeController("a", net=net) as a:
        a.handlers["bad"] = lambda args: (_ for _ in ()).throw(
            wire.RemoteError("INVALID", "bad args", {"field": "x"}))
        async with mem_client(net, make_config(a.address), role="w") as c:
            with pytest.raises(wire.RemoteError) as info:
                await c.call("bad")
            assert (info.value.code, info.value.message) == ("INVALID", "bad args")
        assert len(a.ops("bad")) == 1


async def test_pushes_delivered_in_order_and_gap_triggers_warn_and_rejoin(net, hooks, logs):
    async with FakeController("a", net=net) as a:
        async with mem_client(net, make_config(a.address), role="scheduler", hooks=hooks) as c:
            await c.connect()
            await c.join()  # -> pushes sync_begin (seq 1) and sync_end (seq 2)
            for i in range(5):
                await a.push("job", {"i": i})
            await _wait(lambda: len(hooks.pushes) == 7)
            assert [p[2] for p in hooks.pushes] == [1, 2, 3, 4, 5, 6, 7]
            assert [p[1] for p in hooks.pushes] == ["sync_begin", "sync_end"] + ["job"] * 5
            assert all(p[0] == "scheduler" for p in hooks.pushes)
            await a.push("job", {"i": 99}, skip=2)  # seq 10: 8 and 9 are missing
            await _wait(lambda: len(a.joins) == 2)  # re-joined promptly, no call needed
            await _wait(lambda: hooks.pushes[-1][1] == "sync_end")
            assert not c.rejoin_pending
    assert logs.find("push sequence gap from", "WARNING")
    assert logs.find("expected seq 8, got 10", "WARNING")


async def test_slow_push_consumer_does_not_stall_replies(net):
    async with FakeController("a", net=net) as a:
        gate = anyio.Event()

        class Slow(SpyHooks):
            def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
                return gate.wait()  # an async implementation that blocks until released

        async with mem_client(net, make_config(a.address), role="w", hooks=Slow()) as c:
            await c.join()
            for _ in range(20):
                await a.push("job")
            with anyio.fail_after(2):
                for _ in range(20):
                    await c.call("hello")
            gate.set()


async def test_idle_client_recovers_through_heartbeats_only(net, hooks, logs, mocker):
    store = SharedStore()
    spy = mocker.spy(hooks, "reconnected")
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, mode="standby", store=store) as b:
        cfg = make_config(a.address, b.address, heartbeat_interval=0.05)
        async with mem_client(net, cfg, role="worker", hooks=hooks, rejoin_points=["hello"]) as c:
            await c.connect()
            await c.join()
            await _wait(lambda: len(hooks.pushes) == 2)
            await a.kill()
            b.mode = "primary"  # another controller takes over; the client makes no call
            await _wait(lambda: len(b.joins) == 1)
            assert c.candidate == parse_address(b.address)
            await b.push("job", {"n": 1})
            sync = ["sync_begin", "sync_end"]
            await _wait(lambda: [p[1] for p in hooks.pushes] == [*sync, *sync, "job"])
            assert hooks.pushes[2][2] == 1  # seq restarted on the new connection
            assert spy.call_count == 0  # the heartbeat path never calls the reconnect hook
            # The reconnecting beat re-joins instead of beating into NOT_JOINED; beats follow.
            await _wait(lambda: bool(b.ops("heartbeat")))
            await _wait(lambda: c.state == "rejoined")
            assert b.requests[0].op == "join"  # nothing was sent ahead of the re-join
    assert logs.find(f"heartbeat reconnected to {b.address}", "INFO")
    assert logs.find(f"re-joined as worker on {b.address}", "INFO")


async def test_heartbeat_skips_reconnect_while_failover_lock_is_held(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        await a.kill()
        await _wait(lambda: not c.connected)
        held, release = anyio.Event(), anyio.Event()

        async def failover_elsewhere() -> None:
            async with c._lock.hold("a failover elsewhere"):
                held.set()
                await release.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(failover_elsewhere)
            await held.wait()
            assert await c.heartbeat() is False
            release.set()
        assert a.connections == 1
        await a.start()
        assert await c.heartbeat() is True


async def test_state_changes_reach_observer_in_order(net, hooks):
    async with FakeController("a", net=net) as a:
        async with mem_client(net, make_config(a.address), role="w", hooks=hooks) as c:
            await c.connect()
            await c.join()
            await a.restart()
            await c.call("hello")
            await c.join()
            await _wait(lambda: len(hooks.states) >= 5)
    states = [s for s, _, _ in hooks.states]
    assert states == ["connecting", "connected", "reconnecting", "connected", "rejoined",
                      "closed"]


async def test_slow_state_observer_does_not_stall_the_connection(net):
    async with FakeController("a", net=net) as a:
        gate = anyio.Event()

        class Slow(SpyHooks):
            def connection_state(self, client: Client, state: str, candidate: Any,
                                 detail: str) -> Any:
                return gate.wait()

        async with mem_client(net, make_config(a.address), role="w", hooks=Slow()) as c:
            with anyio.fail_after(3):
                await c.connect()
                for _ in range(5):
                    await a.restart()
                    await c.call("hello")
            assert len(c.machine.states) <= c.machine.states.limit
            gate.set()
