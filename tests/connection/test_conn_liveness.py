"""Liveness: a black-holed primary is detected in about liveness_timeout, not TCP's minutes."""

from __future__ import annotations

import anyio
import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore.candidates import parse_address
from xcecore.client import BackendUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_black_holed_primary_mid_call_fails_over(net, logs, hooks):
    store = SharedStore()
    async with FakeController("a", net=net, store=store) as a, FakeController("b", net=net, store=store) as b:
        cfg = make_config(a.address, b.address, liveness_timeout=0.4, connect_timeout=0.3)
        async with mem_client(net, cfg, role="w", hooks=hooks) as c:
            await c.connect()
            a.mode = "hang"  # stops answering; the TCP connection stays up
            with anyio.fail_after(10):
                result = await c.call("jobsubmit", {"x": 1})
            assert result["applied_by"] == "b"
            assert c.candidate == parse_address(b.address)
        assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid
    assert logs.find("liveness timeout", "WARNING")
    # The candidate whose link died is tried last, so the hung one costs no connect timeout.
    assert not logs.find(f"candidate {a.address} accepted the connection but", "WARNING")
    assert not logs.find(f"candidate {a.address} did not accept", "WARNING")
    assert logs.find(f"reconnected to {b.address}", "INFO")


async def test_black_hole_detected_by_heartbeats_when_idle(net, logs):
    async with FakeController("a", net=net) as a:
        cfg = make_config(a.address, liveness_timeout=0.3, heartbeat_interval=0.05)
        async with mem_client(net, cfg, role="w") as c:
            await c.connect()
            await c.join()  # heartbeats are a member's: a client that never joined sends none
            a.mode = "hang"
            with anyio.fail_after(10):
                while c.connected:
                    await anyio.sleep(0.02)
    assert logs.find(f"lost connection to {a.address} (no frame for 0.3 s", "WARNING")


async def test_idle_connection_without_heartbeats_is_not_declared_dead(net):
    async with FakeController("a", net=net) as a:
        async with mem_client(net, make_config(a.address, liveness_timeout=0.1), role="w") as c:
            await c.connect()
            await anyio.sleep(0.4)  # silence with nothing owed is fine
            assert c.connected
            assert await c.call("hello") == {"server": "a"}
            assert a.connections == 1


async def test_liveness_counts_from_the_last_frame_while_an_old_reply_is_owed(net, logs):
    """One reply held forever while others keep coming: the link lives as long as frames
    arrive, and dies about liveness_timeout after the last one (the link's one timer re-arms
    for the oldest reply owed, it does not fire at that request's own send + timeout)."""
    async with FakeController("a", net=net) as a:
        a.hold_ops = {"slow"}
        async with mem_client(net, make_config(a.address, liveness_timeout=0.3), role="w") as c:
            await c.connect()
            outcome: list[BaseException] = []

            async def slow() -> None:
                try:
                    await c.call("slow", retry_budget=0)
                except Exception as exc:  # BackendUnavailable once the link dies
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                with anyio.fail_after(5):
                    while not a.ops("slow"):
                        await anyio.sleep(0.01)
                started = anyio.current_time()
                while anyio.current_time() - started < 0.9:  # 3 timeouts of other traffic
                    assert await c.call("hello") == {"server": "a"}
                    await anyio.sleep(0.05)
                assert c.connected and not outcome  # still alive: frames kept coming
                last = anyio.current_time()
                with anyio.fail_after(5):
                    while c.connected:
                        await anyio.sleep(0.01)
                died = anyio.current_time() - last
            assert 0.2 < died < 2.0  # about one liveness timeout after the last frame
            # Not a keyed write: the link died under it, so it was simply not applied.
            assert len(outcome) == 1 and isinstance(outcome[0], BackendUnavailable), outcome
    assert logs.find("no frame for 0.3 s with 1 request(s) outstanding: liveness timeout",
                     "WARNING")


async def test_pipelined_requests_share_writes_and_all_get_their_replies(net):
    """Many calls in flight on one link: each gets its own reply (ids matched) and frames
    sent in the same loop pass go out together (fewer writes than requests)."""
    writes: list[int] = []

    class CountingNet:
        async def connect(self, candidate: object) -> object:
            stream = await net.connect(candidate)  # type: ignore[arg-type]
            send = stream.send

            async def counted(item: bytes) -> None:
                writes.append(len(item))
                await send(item)

            stream.send = counted  # type: ignore[method-assign]
            return stream

    async with FakeController("a", net=net) as a:
        async with mem_client(CountingNet(), make_config(a.address), role="w") as c:  # type: ignore[arg-type]
            await c.connect()
            before = len(writes)
            results: dict[int, object] = {}

            async def one(i: int) -> None:
                results[i] = await c.call("jobsubmit", {"i": i})

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(one, i)
            sent = len(writes) - before
    assert sorted(r["n"] for r in results.values()) == list(range(1, 201))  # type: ignore[index]
    assert sorted(rec.args["i"] for rec in a.ops("jobsubmit")) == list(range(200))
    assert len({rec.rid for rec in a.ops("jobsubmit")}) == 200
    assert sent < 200, f"{sent} writes for 200 pipelined requests: none were batched"
