"""The event stream (xce_apiserver.stream) and the dashboard's routes (xce_apiserver.ui).

The hub and the per-client pending sets as units; the coalescing writer against a recording
``send``; a client that does not read over a real loopback socket to a real uvicorn; the
routes over ASGI. The browser and the failover: tests/e2e/test_e2e_dashboard.py.
"""

from __future__ import annotations

import contextlib
import socket
import time
from functools import partial
from typing import Any

import anyio
import httpx
import orjson
import pytest
from apikit import Api, full_state, job, load
from xce_apiserver.app import create_app
from xce_apiserver.server import bind, serve
from xce_apiserver.stream import MAX_KEYS, ChangeHub, Client, Tickets, pump
from xce_apiserver.ui import renderer

from xcecore.bridge import LoopBridge, StopEvent
from xcecore.resreq.evaluator import Evaluator

pytestmark = pytest.mark.anyio


def events(chunks: list[bytes]) -> list[tuple[str, Any]]:
    """The (event, data) pairs in what was sent."""
    out = []
    for block in b"".join(chunks).split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line and
                     not line.startswith(b":"))
        if b"event" in lines:
            out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out


def test_a_client_holds_at_most_max_keys_per_kind_then_only_a_count() -> None:
    c = Client("alice")
    for i in range(MAX_KEYS):
        c.mark("jobs", i)
    assert len(c.keys["jobs"]) == MAX_KEYS and "jobs" not in c.many
    for i in range(MAX_KEYS, 10_000):
        c.mark("jobs", i)
    assert c.keys["jobs"] == set() and c.many["jobs"] == 10_000
    c.mark("hosts", "n1")
    cluster, resync, keys, many = c.take()
    assert many == {"jobs": 10_000} and keys["hosts"] == {"n1"} and not cluster and resync is None
    assert not c.pending and not c.wake.is_set()


def test_the_hub_marks_every_client_and_keeps_the_failover_timeline() -> None:
    hub = ChangeHub()
    a, b = hub.open("alice"), hub.open("bob")
    hub.changed("resvals", "n1")  # load values are host changes
    hub.changed("pend_reasons", 7)  # not a kind the page follows
    assert a.keys["hosts"] == {"n1"} == b.keys["hosts"] and not a.keys["jobs"]
    hub.joined("127.0.0.1:1", at=10.0)
    assert a.cluster and not hub.failovers  # a first join is no failover
    a.take()
    hub.link_lost("reconnecting: connection reset")
    assert a.cluster and hub.link == "lost"
    hub.joined("127.0.0.1:2", at=20.0)
    assert list(hub.failovers) == [{"time": 20.0, "from": "127.0.0.1:1", "to": "127.0.0.1:2"}]
    assert hub.cluster_view()["server"] == "127.0.0.1:2" and hub.link == "up"
    hub.close(a)
    hub.changed("jobs", 1)
    assert not a.keys["jobs"] and b.keys["jobs"] == {1}


def test_tickets_are_single_use_and_expire() -> None:
    now = [100.0]
    t = Tickets(ttl=30.0, limit=3, clock=lambda: now[0])
    one = t.issue("tok1", "alice")
    assert t.redeem(one) == ("tok1", "alice")
    assert t.redeem(one) is None  # used up
    old = t.issue("tok2", "alice")
    now[0] += 31
    assert t.redeem(old) is None and len(t) == 0  # expired
    made = [t.issue(f"tok{i}", "bob") for i in range(5)]
    assert len(t) == 3 and t.redeem(made[0]) is None and t.redeem(made[4]) == ("tok4", "bob")


def test_one_user_asking_for_tickets_in_a_loop_pushes_out_only_their_own() -> None:
    t = Tickets(ttl=30.0, limit=100, per_user=4)
    bobs = t.issue("tokb", "bob")
    alices = [t.issue(f"tok{i}", "alice") for i in range(50)]
    assert len(t) == 5  # alice keeps her 4 newest, bob his one
    assert t.redeem(alices[0]) is None and t.redeem(alices[-1]) == ("tok49", "alice")
    assert t.redeem(bobs) == ("tokb", "bob")


def test_the_hub_bounds_streams_per_user_and_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    from xce_apiserver import stream

    hub = ChangeHub()
    mine = [hub.open("mallory") for _ in range(stream.MAX_PER_USER)]
    with pytest.raises(stream.StreamRefused) as refused:
        hub.open("mallory")
    assert refused.value.status == 429 and "user mallory holds 8 event streams" in refused.value.why
    other = hub.open("alice")  # everyone else is still served
    hub.close(mine[0])
    hub.close(mine[0])  # closing twice counts once
    mine[0] = hub.open("mallory")
    assert hub.per_user == {"mallory": stream.MAX_PER_USER, "alice": 1}
    monkeypatch.setattr(stream, "MAX_CLIENTS", len(hub.clients))
    with pytest.raises(stream.StreamRefused) as refused:
        hub.open("carol")
    assert refused.value.status == 503 and "too many event streams (9)" in refused.value.why
    for c in [*mine, other]:
        hub.close(c)
    assert not hub.per_user and not hub.clients


async def test_a_ninth_stream_of_one_user_is_refused_over_a_real_socket() -> None:
    """A real uvicorn: bob opens 8 streams and a ninth is 429; alice still gets one."""
    from xce_apiserver.stream import MAX_PER_USER

    api = Api()
    app = create_app(api.store, api.backend, api.health, api.auth, Evaluator)
    sock = bind("127.0.0.1:0")
    port = sock.getsockname()[1]
    bridge = LoopBridge()
    bridge.bind()
    stop = StopEvent(bridge)
    hub = api.store.hub
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, app, sock, stop)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                await wait_until_async(http)

                async def ticket(user: str) -> str:
                    r = await http.post("/xce/v1/stream/ticket", headers=api.token(user))
                    return str(r.json()["data"]["ticket"])

                async with contextlib.AsyncExitStack() as streams:
                    for _ in range(MAX_PER_USER):
                        t = await ticket("bob")
                        r = await streams.enter_async_context(
                            http.stream("GET", "/xce/v1/stream", params={"ticket": t}))
                        assert r.status_code == 200
                    await wait_until(lambda: hub.per_user.get("bob") == MAX_PER_USER)
                    r = await http.get("/xce/v1/stream", params={"ticket": await ticket("bob")})
                    assert r.status_code == 429 and "close one" in r.json()["msg"]
                    async with http.stream("GET", "/xce/v1/stream",
                                           params={"ticket": await ticket("alice")}) as ok:
                        assert ok.status_code == 200
                await wait_until(lambda: not hub.clients)
            stop.set()
    finally:
        bridge.unbind()


async def test_changes_are_coalesced_to_the_latest_record_per_interval() -> None:
    api = Api()
    store, hub = api.store, api.store.hub
    client = hub.open("alice")
    sent: list[bytes] = []
    times: list[float] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])
        times.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(pump, hub, client, renderer(store), send, lambda: True, interval=0.2))
        await wait_until(lambda: sent)
        for state in ("RUN", "DONE", "EXIT"):  # three changes of one job, then a new one
            store.apply("job", job(2, state=state, start_time=1.0))
        store.apply("job", job(50, user="carol"))
        await wait_until(lambda: len(sent) >= 2)
        await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
    got = events(sent)
    assert got[0][0] == "hello"
    jobs = [d for e, d in got if e == "jobs"]
    assert len(jobs) == 1, got  # one message for all four changes
    assert [(j["jobid"], j["state"]) for j in jobs[0]["items"]] == [(2, "EXIT"), (50, "PEND")]


async def test_many_changes_become_one_count_and_a_snapshot_a_resync() -> None:
    api = Api()
    store, hub = api.store, api.store.hub
    client = hub.open("alice")
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(pump, hub, client, renderer(store), send, lambda: True, interval=0.05))
        await wait_until(lambda: sent)
        for i in range(100, 100 + MAX_KEYS + 50):
            store.apply("job", job(i))
        await wait_until(lambda: any(e == "jobs" for e, _ in events(sent)))
        load(store, full_state())  # a snapshot sync replaces the view
        await wait_until(lambda: any(e == "resync" for e, _ in events(sent)))
        tg.cancel_scope.cancel()
    got = events(sent)
    assert next(d for e, d in got if e == "jobs") == {"many": MAX_KEYS + 50}
    assert max(len(c) for c in sent) < 20_000  # a burst is not a big message


async def test_heartbeats_and_an_expired_token_ends_the_stream() -> None:
    hub = ChangeHub()
    client = hub.open("alice")
    sent: list[bytes] = []
    live = [True]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                assert await pump(hub, client, renderer(Api().store), send, lambda: live[0],
                                  interval=0.05, heartbeat=0.05) == "token no longer valid"
            tg.start_soon(run)
            await wait_until(lambda: sum(c == b": keep-alive\n\n" for c in sent) >= 2)
            live[0] = False
    assert events(sent)[-1] == ("bye", {"why": "the token expired or was revoked"})


async def test_a_send_that_blocks_drops_the_client() -> None:
    hub = ChangeHub()
    client = hub.open("alice")

    async def never(message: dict[str, Any]) -> None:  # a peer whose window stays shut
        await anyio.sleep_forever()

    with anyio.fail_after(10):
        assert await pump(hub, client, renderer(Api().store), never, lambda: True,
                          send_timeout=0.2) == "not reading"


async def wait_until(cond: Any, within: float = 10.0) -> None:
    """Poll ``cond`` (a condition of state other tasks change) with a deadline."""
    with anyio.fail_after(within):
        while not cond():  # noqa: ASYNC110 (a condition, not an event: polled with a deadline)
            await anyio.sleep(0.01)


async def test_a_client_that_does_not_read_is_dropped_over_a_real_socket() -> None:
    """A real uvicorn on loopback; the client sets a tiny receive buffer and never reads."""
    api = Api()
    app = create_app(api.store, api.backend, api.health, api.auth, Evaluator,
                     stream_timing={"interval": 0.005, "send_timeout": 0.5})
    sock = bind("127.0.0.1:0")
    port = sock.getsockname()[1]
    bridge = LoopBridge()
    bridge.bind()  # this loop: stop.set() wakes the server's task
    stop = StopEvent(bridge)
    hub = api.store.hub
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, app, sock, stop)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                await wait_until_async(http)
                r = await http.post("/xce/v1/stream/ticket", headers=api.token("alice"))
                ticket = r.json()["data"]["ticket"]
                await anyio.to_thread.run_sync(raw.connect, ("127.0.0.1", port))
                raw.sendall(f"GET /xce/v1/stream?ticket={ticket} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await wait_until(lambda: len(hub.clients) == 1)
                big = "x" * 2000
                n = 0
                with anyio.fail_after(60):
                    while hub.dropped == 0:  # changes until the socket's buffers are full
                        n += 1
                        for i in range(10):
                            api.store.apply("job", job(10_000 + n * 10 + i, command=big))
                        await anyio.sleep(0.002)
                await wait_until(lambda: not hub.clients)
                assert (await http.get("/xce/v1/healthz")).status_code == 200  # others served
            stop.set()
    finally:
        raw.close()
        bridge.unbind()


async def wait_until_async(http: httpx.AsyncClient) -> None:
    with anyio.fail_after(10):
        while True:
            try:
                if (await http.get("/xce/v1/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await anyio.sleep(0.02)


async def test_stream_routes_refuse_without_a_ticket(api: Api) -> None:
    c = api.client
    r = await c.get("/xce/v1/stream")
    assert r.status_code == 401 and "ticket" in r.json()["msg"]
    assert (await c.get("/xce/v1/stream", params={"ticket": "forged"})).status_code == 401
    assert (await c.get("/xce/v1/stream", params={"ticket": "x" * 65})).status_code == 422
    assert (await c.post("/xce/v1/stream/ticket")).status_code == 401
    r = await c.post("/xce/v1/stream/ticket", headers=api.token("alice"))
    assert r.status_code == 200 and r.json()["data"]["expires_in"] == 30.0
    # A ticket of a token revoked since is refused.
    hdr = api.token("bob")
    ticket = (await c.post("/xce/v1/stream/ticket", headers=hdr)).json()["data"]["ticket"]
    assert (await c.post("/xce/v1/auth/logout", headers=hdr)).status_code == 200
    assert (await c.get("/xce/v1/stream", params={"ticket": ticket})).status_code == 401


async def test_the_page_is_served_with_its_security_headers(api: Api) -> None:
    c = api.client
    r = await c.get("/xce/v1/ui")
    assert r.status_code == 308 and r.headers["location"] == "/xce/v1/ui/"
    r = await c.get("/xce/v1/ui/")
    assert r.status_code == 200 and "<title>xce dashboard</title>" in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    for asset, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        r = await c.get(f"/xce/v1/ui/{asset}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
    assert "innerHTML" not in (await c.get("/xce/v1/ui/app.js")).text  # text only, never markup
    r = await c.get("/xce/v1/ui/nope.js")
    assert r.status_code == 404 and r.json()["code"] == 404
    assert (await c.get("/xce/v1/ui/../app.py")).status_code == 404


async def test_cluster_status_names_the_candidates(api: Api) -> None:
    api.store.joined("127.0.0.1:7600")
    r = await api.client.get("/xce/v1/cluster/status", headers=api.token("alice"))
    d = r.json()["data"]
    assert r.status_code == 200 and d["primary"] == "127.0.0.1:7600" and d["link"] == "up"
    assert d["candidates"][0]["state"] == "primary" and d["failovers"] == []
    assert (await api.client.get("/xce/v1/cluster/status")).status_code == 401


def test_stream_metrics_count_streams_messages_and_drops() -> None:
    from types import SimpleNamespace

    from xce_apiserver.looplag import LoopLag
    from xce_apiserver.metrics import RequestStats, families

    api = Api()
    hub = api.store.hub
    hub.open("alice")
    hub.sent, hub.dropped = 7, 2
    lag = LoopLag()
    lag.observe(0.004, 100.0)
    role = SimpleNamespace(requests=RequestStats(), ctx=SimpleNamespace(client=None),
                           health=api.health, store=api.store, lag=lag)
    got = {s.name: s.value for fam in families(role) for s in fam.samples}
    assert got["xce_apiserver_loop_lag_seconds_count"] == 1.0
    assert got["xce_apiserver_loop_lag_recent_max_seconds"] == 0.004
    assert got["xce_apiserver_streams"] == 1.0
    assert got["xce_apiserver_stream_messages_total"] == 7.0
    assert got["xce_apiserver_stream_dropped_total"] == 2.0


async def test_a_busy_stream_rechecks_its_token_too() -> None:
    api = Api()
    store, hub = api.store, api.store.hub
    sent: list[bytes] = []
    live = [True]
    ended: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    async def run() -> None:
        ended.append(await pump(hub, hub.open("alice"), renderer(store), send, lambda: live[0],
                                interval=0.02, heartbeat=0.2))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            n = 0
            while not ended:  # a change every 10 ms: the stream never idles
                n += 1
                store.apply("job", job(500 + n % 50))
                if n == 30:
                    live[0] = False
                await anyio.sleep(0.01)
    assert ended == ["token no longer valid"]
    assert sum(e == "jobs" for e, _ in events(sent)) >= 3 and b": keep-alive" not in b"".join(sent)
