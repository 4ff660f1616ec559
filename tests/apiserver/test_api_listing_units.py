"""Units of the listing slices, the write gate, the verified-token cache, the loop-lag ticker
and uvicorn's dropped-client filter (in process; the real-process tests are in
test_api_listing.py)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import orjson
import pytest
from apikit import job
from test_api_store import sync
from xce_apiserver import auth as auth_mod
from xce_apiserver.auth import Authenticator, hash_password, parse_users
from xce_apiserver.hosts import client_job
from xce_apiserver.listing import SLICE, Filters, WriteGate, page_body, stream_body
from xce_apiserver.looplag import LoopLag
from xce_apiserver.server import DroppedClientFilter
from xce_apiserver.store import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _store(n: int) -> Store:
    s = Store()
    sync(s, jobs=[job(i, user="alice" if i % 3 else "bob", state="RUN" if i % 4 == 0 else "PEND")
                  for i in range(1, n + 1)])
    return s


async def test_a_page_built_in_slices_is_the_page_of_the_store() -> None:
    s = _store(2_500)
    gate = WriteGate()
    for filters, limit, after in [(Filters(), 1000, 0), (Filters(), 1000, 1700), (Filters(), 7, 3),
                                  (Filters(states=["RUN"]), 250, 0),
                                  (Filters(user="bob", states=["PEND"]), 1000, 100),
                                  (Filters(keep=["jobid", "status"]), 150, 0)]:
        got = orjson.loads(await page_body(s, gate, after, filters, limit))
        want = s.page_jobs(after=after, limit=limit, states=filters.states, user=filters.user)
        views = [client_job(j) for j in want.jobs]
        if filters.keep:
            views = [{k: v.get(k) for k in filters.keep} for v in views]
        assert got["data"] == views and got["count"] == len(views)
        assert got["next"] == (None if want.next is None else str(want.next))
    # A filter matching nothing stops at the scan budget with a cursor to go on.
    got = orjson.loads(await page_body(s, gate, 0, Filters(user="nobody"), 100))
    assert got["data"] == [] and got["next"] is None  # the user has no index: nothing to scan


async def test_the_unpaged_stream_holds_every_job_once() -> None:
    s = _store(SLICE * 3 + 17)
    parts = [p async for p in stream_body(s, WriteGate(), 0, Filters())]
    env = orjson.loads(b"".join(parts))
    assert [j["jobid"] for j in env["data"]] == list(range(1, SLICE * 3 + 18))
    assert env["count"] == SLICE * 3 + 17 and env["next"] is None
    assert len(parts) >= 4 + 2  # a slice at a time, between the envelope's head and tail


async def test_a_listing_gives_way_to_a_write_in_flight_and_never_waits_forever() -> None:
    gate = WriteGate()
    order: list[str] = []
    await gate.give_way()  # nothing in flight: a checkpoint only
    assert gate.waits == 0
    gate.begin()

    async def listing() -> None:
        await gate.give_way(most=30.0)
        order.append("slice")

    async def write() -> None:
        while not gate.waits:  # answered once the listing waits for it
            await anyio.lowlevel.checkpoint()
        order.append("write answered")
        gate.end()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(listing)
            tg.start_soon(write)
    assert order == ["write answered", "slice"] and gate.waits == 1 and gate.inflight == 0
    gate.begin()  # a write that is never answered holds a slice at most `most` seconds
    with anyio.fail_after(10):
        await gate.give_way(most=0.01)
    assert gate.waits == 2


async def test_a_write_that_arrives_during_a_slice_goes_before_the_next_slice() -> None:
    gate = WriteGate()
    order: list[str] = []
    arrived = anyio.Event()

    async def listing() -> None:
        await arrived.wait()  # a slice is being built when the write comes in
        await gate.give_way(most=30.0)
        order.append("next slice")

    async def write() -> None:  # a request task created during the slice: it starts later
        arrived.set()
        await anyio.lowlevel.checkpoint()
        gate.begin()  # WritesFirst, at the request's first step
        order.append("write sent")
        for _ in range(5):  # its round trip to the controller
            await anyio.lowlevel.checkpoint()
        order.append("write answered")
        gate.end()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(listing)
            tg.start_soon(write)
    assert order == ["write sent", "write answered", "next slice"] and gate.waits == 1


def _auth(clock: list[float]) -> Authenticator:
    users = parse_users([{"name": "alice", "password_hash": hash_password("pw", iterations=1000)}])
    return Authenticator(users, token_ttl=100.0, clock=lambda: clock[0])


def test_a_cached_token_still_expires_and_is_still_revoked() -> None:
    clock = [1_000_000.0]
    a = _auth(clock)
    s = a.issue(a.users["alice"])
    assert a.check(s.token) == s and a.check(s.token) == s  # the second from the cache
    assert len(a._verified) == 1
    a.revocations.hold({"key": "t:" + s.jti, "user": "alice", "at": clock[0]})
    assert "revoked" in str(a.check(s.token))
    t = a.issue(a.users["alice"])
    assert a.check(t.token) == t
    clock[0] += 101.0
    assert a.check(t.token) == "token expired" and t.token not in a._verified
    a.users.pop("alice")  # a user removed from the configuration: its cached token too
    clock[0] -= 101.0
    u = _auth(clock)
    tok = u.issue(u.users["alice"]).token
    assert isinstance(u.check(tok), auth_mod.Session)
    u.users.clear()
    assert u.check(tok) == "invalid token: its user is not configured"
    assert a.check(s.token[:-2] + "xx") == "invalid token"  # forged: refused, not cached
    assert a.check("x" * (auth_mod.MAX_TOKEN + 1)) == "invalid token"


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_mod, "VERIFIED_CACHE", 10)
    clock = [1_000_000.0]
    a = _auth(clock)
    tokens = [a.issue(a.users["alice"]).token for _ in range(25)]
    for tok in tokens:
        assert isinstance(a.check(tok), auth_mod.Session)
        assert len(a._verified) <= 10
    assert tokens[-1] in a._verified and tokens[0] not in a._verified
    assert isinstance(a.check(tokens[0]), auth_mod.Session)  # verified again, still valid


def test_loop_lag_keeps_a_histogram_and_the_recent_worst() -> None:
    lag = LoopLag(tick=0.002, window=10.0)
    lag.observe(0.0004, 100.0)
    lag.observe(0.030, 101.0)
    lag.observe(0.001, 105.0)
    assert lag.recent_worst() == 0.030 and lag.hist.count == 3
    lag.observe(0.002, 111.0)  # the next window: the previous one's worst still counts
    assert lag.recent_worst() == 0.030
    lag.observe(0.001, 121.5)  # two windows on: the 30 ms is forgotten, the 2 ms not yet
    assert lag.recent_worst() == 0.002
    lag.observe(0.001, 150.0)  # after a silence longer than a window: nothing stale kept
    assert lag.recent_worst() == 0.001
    buckets = dict(lag.hist.cumulative())
    assert buckets["0.0005"] == 1 and buckets["+Inf"] == 6 and buckets["0.02"] == 5


class ClientDisconnected(OSError):
    """Named like uvicorn's: the filter knows such exceptions by name."""


def _record(exc: BaseException | None, level: int = logging.ERROR) -> logging.LogRecord:
    info: Any = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("uvicorn.error", level, __file__, 1, "Exception in ASGI application\n",
                             None, info)


def test_a_dropped_client_is_one_info_line_and_other_errors_stay_errors() -> None:
    f = DroppedClientFilter()
    for exc in (ClientDisconnected(), BrokenPipeError(32, "Broken pipe"),
                ConnectionResetError(104, "reset")):
        rec = _record(exc)
        assert f.filter(rec) and rec.levelno == logging.INFO and rec.exc_info is None
        assert "went away" in rec.getMessage()
    wrapped = RuntimeError("the stream ended")
    wrapped.__cause__ = anyio.BrokenResourceError()
    rec = _record(wrapped)
    assert f.filter(rec) and rec.levelname == "INFO"
    rec = _record(ValueError("a bug"))
    assert f.filter(rec) and rec.levelno == logging.ERROR and rec.exc_info is not None
    rec = _record(None)
    assert f.filter(rec) and rec.levelno == logging.ERROR
