"""Liveness: a black-holed primary is detected in about liveness_timeout, not TCP's minutes."""

from __future__ import annotations

import anyio
import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore.candidates import parse_address

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
