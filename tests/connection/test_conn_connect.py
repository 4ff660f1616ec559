"""Connecting: candidate walk, redirects, refused candidates, budgets (real loopback sockets)."""

from __future__ import annotations

import socket
import time

import anyio
import pytest
from clientkit import make_config
from fakectl import FakeController, SharedStore, free_port

from xcecore.candidates import Candidate, parse_address
from xcecore.client import BackendUnavailable, Client, ClientConfig

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_single_candidate_connects_and_calls(logs):
    async with FakeController("c0") as ctl, Client(make_config(ctl.address), role="scheduler") as c:
        assert await c.connect() == parse_address(ctl.address)
        result = await c.call("hello", {"x": 1})
        assert result == {"server": "c0"}
        assert c.connected and c.state == "connected"
        assert c.candidate == parse_address(ctl.address)
    assert logs.find(f"xce client scheduler@h1: connected to {ctl.address}", "INFO")


async def test_three_candidates_standby_first_follows_redirect_without_sleep(logs):
    store = SharedStore()
    async with (
        FakeController("c0", mode="standby", store=store) as s0,
        FakeController("c1", mode="standby", store=store) as s1,
        FakeController("c2", store=store) as p,
    ):
        s0.primary = s1.primary = p.address
        cfg = make_config(s0.address, s1.address, p.address, backoff_base=5.0, backoff_cap=5.0)
        async with Client(cfg, role="scheduler") as c:
            started = time.monotonic()
            assert await c.connect() == parse_address(p.address)
            assert time.monotonic() - started < 2.0  # no back-off sleep (it would be >= 0..5 s)
        assert s1.connections == 0  # the redirect went straight to the primary
    line = (f"xce client scheduler@h1: candidate {s0.address} is a standby, "
            f"following redirect to {p.address}")
    assert logs.find(line, "WARNING")


async def test_four_candidates_are_clamped_to_three(logs):
    async with FakeController("p") as p:
        dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        cfg = make_config(*dead, p.address)  # the primary is 4th: clamped away
        assert len(cfg.candidates) == 3
        assert logs.find("at most 3 are used", "WARNING")
        async with Client(cfg, role="scheduler") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=1)
        assert p.connections == 0


async def test_first_candidate_unreachable_at_start(logs):
    dead = f"127.0.0.1:{free_port()}"
    async with FakeController("c1") as p, Client(make_config(dead, p.address), role="w") as c:
        assert await c.connect() == parse_address(p.address)
        assert await c.call("jobsubmit", {"cmd": "true"}) == {
            "op": "jobsubmit", "applied_by": "c1", "n": 1}
    warn = logs.find(f"candidate {dead} refused or closed the connection (connection refused)", "WARNING")
    assert warn and "trying the next candidate" in warn[0]


async def test_hung_candidate_times_out_and_next_is_used(logs):
    async with FakeController("h", mode="hang") as h, FakeController("p") as p:
        cfg = make_config(h.address, p.address, connect_timeout=0.2)
        async with Client(cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)
    assert logs.find(f"candidate {h.address} did not answer within 0.2 s", "WARNING")


async def test_no_primary_standby_moves_on_at_once(logs):
    async with FakeController("s", mode="standby") as s, FakeController("p") as p:
        cfg = make_config(s.address, p.address)
        async with Client(cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)
    assert logs.find(f"candidate {s.address} is a standby that knows no primary", "WARNING")


async def test_unlisted_redirect_is_not_followed_unless_allowed(logs):
    async with FakeController("s", mode="standby") as s, FakeController("p") as p:
        s.primary = p.address  # p is not in the candidate list
        async with Client(make_config(s.address), role="w") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=0)
        assert p.connections == 0
        assert logs.find("not a listed candidate", "WARNING")
        cfg = make_config(s.address, allow_unlisted_redirect=True)
        async with Client(cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)


async def test_retry_budget_exhausted_raises_backend_unavailable(logs, hooks):
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    async with Client(make_config(*dead), role="w", hooks=hooks) as c:
        with pytest.raises(BackendUnavailable) as info:
            await c.call("hello", retry_budget=2)
        assert "retry budget of 2 exhausted" in str(info.value)
        assert isinstance(info.value.last_error, ConnectionError)
        assert c.state == "degraded"
        await anyio.sleep(0.05)
    assert len(logs.find("trying the next candidate", "WARNING")) == 6  # 3 passes x 2
    assert ("degraded" in [s for s, _, _ in hooks.states])


async def test_deadline_exhausted_raises_backend_unavailable():
    async with FakeController("h", mode="hang") as h:
        async with Client(make_config(h.address, connect_timeout=5.0), role="w") as c:
            with pytest.raises(BackendUnavailable, match="deadline of 0.3 s"):
                await c.connect(deadline=0.3)


async def test_never_gives_up_without_budget_until_a_primary_appears(logs):
    port = free_port()
    async with Client(make_config(f"127.0.0.1:{port}"), role="w") as c:
        async with anyio.create_task_group() as tg:
            got: list[Candidate] = []

            async def connect() -> None:
                got.append(await c.connect())

            tg.start_soon(connect)
            await anyio.sleep(0.3)  # several passes with back-off in between
            assert not got
            async with FakeController("late", port=port):
                with anyio.fail_after(5):
                    while not got:
                        await anyio.sleep(0.01)
    assert logs.find("next pass in", "WARNING")


async def test_wrong_key_is_denied_with_a_clear_error(logs):
    async with FakeController("p", key=b"right") as p:
        cfg = make_config(p.address, key=b"wrong")
        async with Client(cfg, role="w") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=0)
    assert logs.find("denied the handshake", "ERROR")


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


def test_config_validation():
    with pytest.raises(ValueError, match="at least one"):
        ClientConfig(candidates=(), sender="x@y")
    with pytest.raises(ValueError, match="liveness_timeout"):
        make_config("127.0.0.1:1", liveness_timeout=0)
