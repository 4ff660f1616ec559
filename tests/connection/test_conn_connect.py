"""Connecting: candidate walk, redirects, refused candidates, budgets (on the in-memory network)."""

from __future__ import annotations

import time

import anyio
import pytest
from clientkit import make_config, mem_client
from fakectl import FakeController, SharedStore, nowhere

from xcecore.candidates import Candidate, parse_address
from xcecore.client import AuthenticationFailed, BackendUnavailable, ClientConfig

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_single_candidate_connects_and_calls(net, logs):
    async with FakeController("c0", net=net) as ctl, mem_client(net, make_config(ctl.address), role="scheduler") as c:
        assert await c.connect() == parse_address(ctl.address)
        result = await c.call("hello", {"x": 1})
        assert result == {"server": "c0"}
        assert c.connected and c.state == "connected"
        assert c.candidate == parse_address(ctl.address)
    assert logs.find(f"xce client scheduler@h1: connected to {ctl.address}", "INFO")


async def test_three_candidates_standby_first_follows_redirect_without_sleep(net, logs):
    store = SharedStore()
    async with (
        FakeController("c0", net=net, mode="standby", store=store) as s0,
        FakeController("c1", net=net, mode="standby", store=store) as s1,
        FakeController("c2", net=net, store=store) as p,
    ):
        s0.primary = s1.primary = p.address
        cfg = make_config(s0.address, s1.address, p.address, backoff_base=5.0, backoff_cap=5.0)
        async with mem_client(net, cfg, role="scheduler") as c:
            started = time.monotonic()
            assert await c.connect() == parse_address(p.address)
            assert time.monotonic() - started < 2.0  # no back-off sleep (it would be >= 0..5 s)
        assert s1.connections == 0  # the redirect went straight to the primary
    line = (f"xce client scheduler@h1: candidate {s0.address} is a standby, "
            f"following redirect to {p.address}")
    assert logs.find(line, "WARNING")


async def test_four_candidates_are_clamped_to_three(net, logs):
    async with FakeController("p", net=net) as p:
        dead = [nowhere(net) for _ in range(3)]
        cfg = make_config(*dead, p.address)  # the primary is 4th: clamped away
        assert len(cfg.candidates) == 3
        assert logs.find("at most 3 are used", "WARNING")
        async with mem_client(net, cfg, role="scheduler") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=1)
        assert p.connections == 0


async def test_first_candidate_unreachable_at_start(net, logs):
    dead = nowhere(net)
    async with FakeController("c1", net=net) as p, mem_client(net, make_config(dead, p.address), role="w") as c:
        assert await c.connect() == parse_address(p.address)
        assert await c.call("jobsubmit", {"cmd": "true"}) == {
            "op": "jobsubmit", "applied_by": "c1", "n": 1}
    warn = logs.find(f"candidate {dead} refused or closed the connection (connection refused)", "WARNING")
    assert warn and "trying the next candidate" in warn[0]


async def test_hung_candidate_times_out_and_next_is_used(net, logs):
    async with FakeController("h", net=net, mode="hang") as h, FakeController("p", net=net) as p:
        cfg = make_config(h.address, p.address, connect_timeout=0.2)
        async with mem_client(net, cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)
    assert logs.find(f"candidate {h.address} accepted the connection but sent no hello within 0.2 s "
                     "(hung, overloaded, or it has [tls] set and this client has not)", "WARNING")


async def test_no_primary_standby_moves_on_at_once(net, logs):
    async with FakeController("s", net=net, mode="standby") as s, FakeController("p", net=net) as p:
        cfg = make_config(s.address, p.address)
        async with mem_client(net, cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)
    assert logs.find(f"candidate {s.address} is a standby that knows no primary", "WARNING")


async def test_unlisted_redirect_is_not_followed_unless_allowed(net, logs):
    async with FakeController("s", net=net, mode="standby") as s, FakeController("p", net=net) as p:
        s.primary = p.address  # p is not in the candidate list
        async with mem_client(net, make_config(s.address), role="w") as c:
            with pytest.raises(BackendUnavailable):
                await c.connect(retry_budget=0)
        assert p.connections == 0
        assert logs.find("not a listed candidate", "WARNING")
        cfg = make_config(s.address, allow_unlisted_redirect=True)
        async with mem_client(net, cfg, role="w") as c:
            assert await c.connect() == parse_address(p.address)


async def test_retry_budget_exhausted_raises_backend_unavailable(net, logs, hooks):
    dead = [nowhere(net) for _ in range(2)]
    async with mem_client(net, make_config(*dead), role="w", hooks=hooks) as c:
        with pytest.raises(BackendUnavailable) as info:
            await c.call("hello", retry_budget=2)
        assert "retry budget of 2 exhausted" in str(info.value)
        assert isinstance(info.value.last_error, ConnectionError)
        assert c.state == "degraded"
        await anyio.sleep(0.05)
    assert len(logs.find("trying the next candidate", "WARNING")) == 6  # 3 passes x 2
    assert ("degraded" in [s for s, _, _ in hooks.states])


async def test_deadline_exhausted_raises_backend_unavailable(net):
    async with FakeController("h", net=net, mode="hang") as h:
        async with mem_client(net, make_config(h.address, connect_timeout=5.0), role="w") as c:
            with pytest.raises(BackendUnavailable, match="deadline of 0.3 s"):
                await c.connect(deadline=0.3)


async def test_never_gives_up_without_budget_until_a_primary_appears(net, logs):
    late = FakeController("late", net=net)  # its address is known before it listens
    async with mem_client(net, make_config(late.address), role="w") as c:
        async with anyio.create_task_group() as tg:
            got: list[Candidate] = []

            async def connect() -> None:
                got.append(await c.connect())

            tg.start_soon(connect)
            await anyio.sleep(0.3)  # several passes with back-off in between
            assert not got
            async with late:
                with anyio.fail_after(5):
                    while not got:
                        await anyio.sleep(0.01)
    assert logs.find("next pass in", "WARNING")


async def test_wrong_key_is_an_authentication_failure_not_an_outage(net, logs):
    async with FakeController("p", net=net, key=b"right") as p:
        cfg = make_config(p.address, key=b"wrong")
        async with mem_client(net, cfg, role="w") as c:
            for _ in range(2):  # no deadline, no budget: still raised at once, not retried
                with anyio.fail_after(5), pytest.raises(AuthenticationFailed) as info:
                    await c.call("hello")
            assert str(info.value).startswith("authentication failed: bad cluster key")
            assert c.state == "degraded"
        assert p.connections == 2  # one handshake per call: no back-off loop behind it
    refusals = [m for lv, m in logs.records if "refused the handshake" in m and lv == "ERROR"]
    assert len(refusals) == 1 and "authentication failed: bad cluster key" in refusals[0]
    assert not logs.find("next pass in", "WARNING")


def test_config_validation():
    with pytest.raises(ValueError, match="at least one"):
        ClientConfig(candidates=(), sender="x@y")
    with pytest.raises(ValueError, match="liveness_timeout"):
        make_config("127.0.0.1:1", liveness_timeout=0)
