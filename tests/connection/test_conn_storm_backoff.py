"""Back-off after a candidate timed out: retries are spread, not re-queued at once."""

from __future__ import annotations

import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController

from xcecore.auth.key import KeyAuth
from xcecore.candidates import parse_address
from xcecore.client import BackendUnavailable
from xcecore.client.backoff import Backoff
from xcecore.client.link import open_link

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def test_at_least_raises_the_ceiling_up_to_the_cap():
    draws: list[float] = []
    b = Backoff(0.1, 5.0, uniform=lambda lo, hi: draws.append(hi) or hi)
    assert b.next_delay(at_least=2.0) == pytest.approx(2.0)  # 0.1 ceiling raised to 2.0
    assert b.next_delay(at_least=50.0) == pytest.approx(5.0)  # never past the cap
    assert b.next_delay() == pytest.approx(0.4)  # without it: the plain doubling
    assert b.failures == 3


def test_busy_cap_lets_a_fast_policy_spread_under_load():
    """Heartbeats while down retry within the heartbeat interval, but a busy candidate (one
    that timed out) spreads them over the connect timeout, up to the call path's cap."""
    b = Backoff(0.1, 1.0, uniform=lambda lo, hi: hi, busy_cap=5.0)
    assert b.next_delay() == pytest.approx(0.1)
    assert b.next_delay(at_least=3.0) == pytest.approx(3.0)  # past cap 1.0, within busy_cap
    assert b.next_delay(at_least=30.0) == pytest.approx(5.0)
    assert b.next_delay() == pytest.approx(0.8)  # without load: the plain doubling, capped at 1
    assert Backoff(0.1, 1.0, busy_cap=0.5).busy_cap == 1.0  # never below the cap


async def test_open_link_marks_a_timeout_but_not_a_refusal(net):
    async with FakeController("h", net=net, mode="hang") as h, FakeController("s", net=net, mode="standby") as s:
        hung = await open_link(parse_address(h.address), sender="w@x", auth=KeyAuth(None),
                               connect_timeout=0.1, max_frame=1 << 20, backend=net)
        standby = await open_link(parse_address(s.address), sender="w@x", auth=KeyAuth(None),
                                  connect_timeout=1.0, max_frame=1 << 20, backend=net)
    assert hung.stream is None and hung.timed_out
    assert standby.stream is None and not standby.timed_out


def _spy_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the ``at_least`` of every back-off draw the client asks for (and never sleep)."""
    asked: list[float] = []

    class Spy(Backoff):
        def next_delay(self, at_least: float = 0.0) -> float:
            asked.append(at_least)
            return 0.0

    monkeypatch.setattr("xcecore.client.asyncclient.Backoff", Spy)
    return asked


async def test_pass_with_a_timed_out_candidate_backs_off_over_connect_timeout(net, monkeypatch):
    asked = _spy_backoff(monkeypatch)
    async with FakeController("h", net=net, mode="hang") as h:
        cfg = make_config(h.address, connect_timeout=0.3, backoff_base=0.001, backoff_cap=10.0)
        async with mem_client(net, cfg, role="w") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=1)
    assert asked and all(a == pytest.approx(0.3) for a in asked)


async def test_pass_with_refusals_only_keeps_the_plain_back_off(net, monkeypatch):
    asked = _spy_backoff(monkeypatch)
    async with FakeController("s", net=net, mode="standby") as s:
        async with mem_client(net, make_config(s.address), role="w") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=1)
    assert asked and all(a == 0.0 for a in asked)


async def test_heartbeat_reconnect_spreads_after_a_busy_candidate(net, monkeypatch):
    """An idle member whose heartbeat pass timed out on a live-but-silent candidate draws its
    next quick beat over the connect timeout too, not within ``backoff_base``."""
    import anyio

    asked = _spy_backoff(monkeypatch)
    async with FakeController("h", net=net) as h:
        cfg = make_config(h.address, heartbeat_interval=0.05, liveness_timeout=0.3,
                          connect_timeout=0.2, backoff_base=0.001, backoff_cap=10.0)
        async with mem_client(net, cfg, role="w") as c:
            await c.connect()
            await c.join()
            h.mode = "hang"  # heartbeats go unanswered, and new handshakes too
            with anyio.fail_after(10):
                while not any(a == pytest.approx(0.2) for a in asked):
                    await anyio.sleep(0.02)
    assert 0.0 in asked  # the beats before the busy candidate was seen: the plain draw
