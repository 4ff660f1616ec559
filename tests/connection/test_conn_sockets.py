"""The client over real loopback TCP: what only sockets can show (the rest of the client
tests run on the in-memory network)."""

from __future__ import annotations

import socket

import anyio
import pytest
from clientkit import make_config
from fakectl import FakeController, SharedStore, nowhere

from xcecore.candidates import Candidate, parse_address
from xcecore.client import BackendUnavailable, Client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_tcp_call_writes_requests_straight_to_the_socket():
    async with FakeController("c0") as ctl, Client(make_config(ctl.address), role="w") as c:
        assert await c.connect() == parse_address(ctl.address)
        conn = c._conn
        assert conn is not None and conn.sock is not None  # wire.write_now has a socket
        assert await c.call("hello") == {"server": "c0"}
        results = []
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(lambda i=i: _append(results, c.call("jobsubmit", {"i": i})))
        assert sorted(r["n"] for r in results) == list(range(1, 51))


async def _append(results: list[object], call: object) -> None:
    results.append(await call)  # type: ignore[misc]


async def test_refused_tcp_port_is_reported_and_skipped(logs):
    dead = nowhere()
    async with FakeController("c1") as p, Client(make_config(dead, p.address), role="w") as c:
        assert await c.connect() == parse_address(p.address)
    warn = logs.find(f"candidate {dead} refused or closed the connection (connection refused)", "WARNING")
    assert warn and "trying the next candidate" in warn[0]


async def test_only_refused_tcp_ports_exhaust_the_budget():
    async with Client(make_config(nowhere(), nowhere()), role="w") as c:
        with pytest.raises(BackendUnavailable, match="retry budget of 1 exhausted"):
            await c.call("jobsubmit", retry_budget=1)


async def test_hung_tcp_candidate_times_out_and_the_next_is_used(logs):
    async with FakeController("h", mode="hang") as h, FakeController("p") as p:
        async with Client(make_config(h.address, p.address, connect_timeout=0.2), role="w") as c:
            assert await c.connect() == parse_address(p.address)
    assert logs.find(f"candidate {h.address} accepted the connection but sent no hello within 0.2 s", "WARNING")


async def test_tcp_primary_killed_mid_write_is_applied_once_elsewhere():
    store = SharedStore()
    async with FakeController("a", store=store) as a, FakeController("b", store=store) as b:
        a.hold_ops = {"jobsubmit"}
        async with Client(make_config(a.address, b.address), role="w") as c:
            await c.connect()
            results: list[object] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _append(results, c.call("jobsubmit", {"x": 1})))
                await a.wait_for(lambda: bool(a.ops("jobsubmit")))
                await a.kill()
            assert results == [{"op": "jobsubmit", "applied_by": "b", "n": 1}]
        assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid
        assert len(store.applied) == 1


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
async def test_ipv6_candidate():
    async with FakeController("v6", host="::1") as p:
        async with Client(make_config(p.address), role="w") as c:
            assert await c.connect() == Candidate("::1", p.port)
            assert await c.call("hello") == {"server": "v6"}
