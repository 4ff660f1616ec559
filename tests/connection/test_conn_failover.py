"""Failover: a primary dies (or lies, or babbles) with calls in flight; one reconnect, one apply."""

from __future__ import annotations

import anyio
import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore.candidates import parse_address

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_primary_killed_mid_write_retry_has_same_rid(net, logs, hooks):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, mode="standby", store=store) as b:
        b.primary = a.address
        a.hold_ops = {"jobsubmit"}  # the write reaches a, a dies before answering
        async with mem_client(net, make_config(a.address, b.address), role="scheduler", hooks=hooks) as c:
            await c.connect()
            results: list[object] = []

            async def submit() -> None:
                results.append(await c.call("jobsubmit", {"cmd": "sleep 1"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                await a.wait_for(lambda: bool(a.ops("jobsubmit")))
                await a.kill()
                b.mode, b.primary = "primary", None  # b takes the lock and promotes
            assert results == [{"op": "jobsubmit", "applied_by": "b", "n": 1}]
            assert c.candidate == parse_address(b.address)
        [sent_a], [sent_b] = a.ops("jobsubmit"), b.ops("jobsubmit")
        assert sent_a.rid is not None and sent_a.rid == sent_b.rid
        assert len(store.applied) == 1
        assert [cand for cand, _ in hooks.reconnects] == [parse_address(b.address)]
    assert logs.find(f"lost connection to {a.address} (closed by the controller); "
                     "reconnecting (1 request(s) in flight)", "WARNING")
    assert logs.find(f"reconnected to {b.address} after", "INFO")
    assert logs.find("; rejoin pending", "INFO")


async def test_write_applied_then_reply_lost_is_applied_exactly_once(net):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController("b", net=net, store=store) as b:
        async with mem_client(net, make_config(a.address, b.address), role="w") as c:
            await c.connect()
            a.drop_on_op, a.apply_before_drop, a.kill_on_drop = a.op_count + 1, True, True
            result = await c.call("jobsubmit", {"cmd": "true"})
            assert not a.running
        assert result == {"op": "jobsubmit", "applied_by": "a", "n": 1}  # the stored result
        assert len(store.applied) == 1
        assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid


async def test_concurrent_calls_during_failover_all_complete_once(net, hooks, mocker):
    store = SharedStore()
    spy = mocker.spy(hooks, "reconnected")
    async with FakeController("a", net=net, store=store) as a, FakeController("b", net=net, store=store) as b:
        a.hold_ops = {"jobsubmit"}
        async with mem_client(net, make_config(a.address, b.address), role="w", hooks=hooks) as c:
            await c.connect()
            results: dict[int, object] = {}

            async def submit(i: int) -> None:
                results[i] = await c.call("jobsubmit", {"i": i})

            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(submit, i)
                await a.wait_for(lambda: len(a.ops("jobsubmit")) == 40)
                await a.kill()
                for i in range(40, 60):  # arrive while the failover is running
                    tg.start_soon(submit, i)
        assert sorted(results) == list(range(60))
        assert len(store.applied) == 60
        assert len({r.rid for r in store.applied}) == 60
        assert sorted(r.args["i"] for r in store.applied) == list(range(60))
        assert spy.call_count == 1  # ONE reconnect for all of them


async def test_redirect_reply_on_a_call_reconnects_to_the_new_primary(net, hooks):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, mode="standby", store=store) as b:
        async with mem_client(net, make_config(a.address, b.address), role="w", hooks=hooks) as c:
            await c.connect()
            # a is demoted without dropping connections; b takes over
            a.mode, a.primary = "standby", b.address
            b.mode = "primary"
            assert (await c.call("jobsubmit"))["applied_by"] == "b"
            assert c.candidate == parse_address(b.address)
        assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid
        assert len(hooks.reconnects) == 1


async def test_garbage_from_server_drops_connection_and_client_recovers(net, logs):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        a.garbage_on_op = a.op_count + 1
        result = await c.call("jobsubmit", {"x": 1})
        assert result["applied_by"] == "a"
        assert a.connections == 2
        assert len(a.ops("jobsubmit")) == 2
        assert len(a.store.applied) == 1
    assert logs.find("protocol error: frame is not valid JSON", "WARNING")


async def test_oversized_frame_from_server_drops_connection(net, logs):
    async with FakeController("a", net=net) as a:
        cfg = make_config(a.address, max_frame=1024)
        a.handlers["big"] = lambda args: "x" * 4096
        async with mem_client(net, cfg, role="w") as c:
            await c.connect()
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.call, "big")
                await a.wait_for(lambda: a.connections >= 2)
                a.handlers["big"] = lambda args: "small"
        assert logs.find("exceeds the maximum of 1024", "WARNING")


async def test_primary_restarts_on_same_port(net):
    async with FakeController("a", net=net) as a, mem_client(net, make_config(a.address), role="w") as c:
        await c.connect()
        await a.restart()
        assert (await c.call("hello")) == {"server": "a"}
        assert a.connections == 2


async def test_a_hung_primary_s_standby_promises_the_takeover_and_the_write_waits_for_it(net, logs):
    """In memory: the primary goes silent with a write in flight; after the liveness timeout the
    standby promises a takeover, the client waits for it (never dialing the silent primary
    again) and the write is applied once, on the standby once it promoted."""
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController(
            "b", net=net, mode="standby", store=store) as b:
        b.takeover_ms = 120
        cfg = make_config(a.address, b.address, liveness_timeout=0.3, backoff_base=5.0,
                          backoff_cap=5.0)
        async with mem_client(net, cfg, role="w") as c:
            await c.connect()
            a.hold_ops = {"jobsubmit"}  # a is hung: the write is never answered
            results: list[object] = []

            async def submit() -> None:
                results.append(await c.call("jobsubmit", {"cmd": "true"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                await b.wait_for(lambda: b.connections >= 1)  # the promise was heard
                a.mode = "hang"
                b.promote_at = b.connections + 1  # b promotes: its next handshake says so
            assert results == [{"op": "jobsubmit", "applied_by": "b", "n": 1}]
        assert a.connections == 1 and len(store.applied) == 1
        assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid
    assert logs.find(f"no primary: {b.address} takes over from a primary that stopped beating in "
                     "120 ms; next pass in 120 ms, starting there (not dialing the hung primary)",
                     "WARNING")
