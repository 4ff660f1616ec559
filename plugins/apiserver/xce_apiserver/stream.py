"""Live changes of the API server's replica as server-sent events (``GET /xce/v1/stream``).

The store (:mod:`xce_apiserver.store`) tells a :class:`ChangeHub` about every change it
applies from the controller's pushes, and about the controller it is joined to. The hub marks
each connected client's pending set: the cost of one change is O(clients), and each client's
pending set is bounded (:data:`MAX_KEYS` keys per kind; past that the kind is only "many
changed" and the page re-fetches). Each client's writer wakes on a mark, waits out the
coalescing interval (at most one message per ``interval`` per client), reads the *current*
records of the keys it holds (so ten changes of one job in 250 ms are one line) and sends.

A client that does not read: its socket buffer fills, uvicorn's send blocks, and after
``send_timeout`` the hub drops it (the response ends; the page reconnects and re-fetches).
Heartbeat comments every ``heartbeat`` seconds keep proxies from closing an idle stream and
re-check that the stream's token is still live (a revoked or expired token ends the stream).

Authentication: a browser's ``EventSource`` sends no headers, so the page swaps its bearer
token for a **ticket** (``POST /xce/v1/stream/ticket``): random, single-use, valid for
:data:`TICKET_TTL` seconds, held in this process's memory (:class:`Tickets`). The stream takes
it as ``?ticket=``. A cookie would make every route of the API answer to a cross-site form
post (CSRF) and the token would outlive the tab; a ticket in a URL that is used once and dies
in seconds leaks nothing worth having into logs. The page opens a fresh ticket for each
(re)connection.

Everything here runs on the event loop (pushes and routes do), so nothing needs a lock.

Events (``event:`` name, ``data:`` one JSON object):

- ``hello``: ``{"server", "link", "failovers"}`` when the stream opens;
- ``cluster``: the same, whenever the controller the API server is joined to changes (a
  failover: ``failovers`` lists what this API server saw, newest last), or the link is lost
  or back;
- ``hosts``/``queues``: ``{"items": [...], "removed": [names]}`` (items as ``GET /hosts`` and
  ``GET /queues`` give them) or ``{"many": n}``;
- ``jobs``: ``{"items": [...], "removed": [ids]}`` (as ``GET /jobs`` gives them) or
  ``{"many": n}``;
- ``resync``: ``{"why"}``: the view was replaced (a snapshot sync); re-fetch everything.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from typing import Any

import anyio
import orjson
from loguru import logger

INTERVAL = 0.25
"""Seconds between two messages to one client: changes in between are coalesced."""

HEARTBEAT = 15.0
"""Seconds between heartbeat comments on an idle stream (proxies close idle ones at 30-60 s)."""

SEND_TIMEOUT = 10.0
"""A send to a client blocked this long (it does not read): the client is dropped."""

MAX_KEYS = 200
"""Changed keys a client holds per kind; past that the kind becomes ``{"many": n}``."""

MAX_CLIENTS = 1000
"""Streams served at once; one more answers 503."""

MAX_PER_USER = 8
"""Streams one user may hold at once (a dashboard is one, a few tabs a few); one more answers
429, so that one user cannot take every stream from everyone else."""

TICKET_TTL = 30.0
"""Seconds a stream ticket may wait to be used."""

MAX_TICKETS = 10_000
"""Unused tickets kept at once (the oldest is forgotten first)."""

MAX_TICKETS_PER_USER = 16
"""Unused tickets of one user kept at once: past it that user's own oldest is forgotten, so
that one user asking for tickets in a loop cannot push out everyone else's."""

FAILOVERS_KEPT = 50
"""Controller changes the hub remembers for the failover timeline."""

KINDS = ("hosts", "queues", "jobs")
"""Record kinds a client is told about (``resvals`` count as ``hosts``)."""

RETRY_MS = 2000
"""The ``retry:`` an ``EventSource`` waits before it reconnects by itself."""

Render = Callable[[str, set[Hashable]], tuple[list[Any], list[Any]]]
"""(kind, keys) -> (current records of the keys still present, the keys removed)."""
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def sse(event: str, data: Any) -> bytes:
    """One server-sent event: ``event:`` and one ``data:`` line of compact JSON."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Client:
    """One stream's pending changes: per kind a bounded key set, or a count past the bound."""

    __slots__ = ("cluster", "dropped", "keys", "many", "resync", "user", "wake")

    def __init__(self, user: str) -> None:
        self.user = user
        self.keys: dict[str, set[Hashable]] = {k: set() for k in KINDS}
        self.many: dict[str, int] = {}
        self.cluster = False
        self.resync: str | None = None
        self.dropped = False
        self.wake = anyio.Event()

    def mark(self, kind: str, key: Hashable) -> None:
        """Note that ``kind``/``key`` changed (O(1), bounded memory)."""
        many = self.many.get(kind)
        if many is not None:
            self.many[kind] = many + 1
        else:
            keys = self.keys[kind]
            keys.add(key)
            if len(keys) > MAX_KEYS:
                self.many[kind] = len(keys)
                keys.clear()
        self.wake.set()

    def flag(self, *, cluster: bool = False, resync: str | None = None) -> None:
        """Note a controller change (``cluster``) or that the view was replaced (``resync``)."""
        self.cluster = self.cluster or cluster
        if resync is not None:
            self.resync = resync
        self.wake.set()

    @property
    def pending(self) -> bool:
        """Something waits to be sent."""
        return self.cluster or self.resync is not None or bool(self.many) or \
            any(self.keys.values())

    def take(self) -> tuple[bool, str | None, dict[str, set[Hashable]], dict[str, int]]:
        """(cluster changed, resync reason, keys per kind, many per kind); empties the client."""
        out = (self.cluster, self.resync, self.keys, self.many)
        self.cluster, self.resync = False, None
        self.keys, self.many = {k: set() for k in KINDS}, {}
        self.wake = anyio.Event()
        return out


class StreamRefused(Exception):
    """A new stream would pass :data:`MAX_CLIENTS` or :data:`MAX_PER_USER`."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status, self.why = status, why


class ChangeHub:
    """The connected streams, told of every replica change; the failover timeline."""

    def __init__(self) -> None:
        self.clients: set[Client] = set()
        self.per_user: collections.Counter[str] = collections.Counter()
        self.server: str | None = None
        self.link = "down"
        self.link_detail = ""
        self.failovers: collections.deque[dict[str, Any]] = collections.deque(maxlen=FAILOVERS_KEPT)
        self.dropped = 0
        self.sent = 0
        self.stopping = False

    def stop(self) -> None:
        """The server is stopping: every stream says goodbye and ends."""
        self.stopping = True
        for client in self.clients:
            client.wake.set()

    # ------------------------------------------------------------------ fed by the store
    def changed(self, kind: str, key: Hashable) -> None:
        """A record of ``kind`` changed: mark every client (O(clients))."""
        if kind == "resvals":
            kind = "hosts"
        if kind not in KINDS:
            return
        for client in self.clients:
            client.mark(kind, key)

    def replaced(self, why: str) -> None:
        """The whole view was replaced: every client re-fetches."""
        for client in self.clients:
            client.flag(resync=why)

    def joined(self, server: str, at: float | None = None) -> None:
        """The API server is (again) joined to controller ``server``."""
        at = time.time() if at is None else at
        old, self.server = self.server, server
        if old is not None and old != server:
            self.failovers.append({"time": at, "from": old, "to": server})
        changed = old != server or self.link != "up"
        self.link, self.link_detail = "up", ""
        if changed:
            self._cluster()

    def link_lost(self, detail: str) -> None:
        """The link to the controller is lost (a failover or an outage is under way)."""
        if self.link == "lost":
            return
        self.link, self.link_detail = "lost", detail
        self._cluster()

    def _cluster(self) -> None:
        for client in self.clients:
            client.flag(cluster=True)

    def cluster_view(self) -> dict[str, Any]:
        """What ``hello`` and ``cluster`` events carry."""
        return {"server": self.server, "link": self.link, "detail": self.link_detail,
                "failovers": list(self.failovers)}

    # ------------------------------------------------------------------ clients
    def refusal(self, user: str) -> tuple[int, str] | None:
        """(HTTP status, why) if a new stream of ``user`` would pass a bound; else None."""
        if len(self.clients) >= MAX_CLIENTS:
            return 503, f"too many event streams ({MAX_CLIENTS}); retry later"
        if self.per_user[user] >= MAX_PER_USER:
            return 429, (f"user {user} holds {MAX_PER_USER} event streams already, the most one "
                         "user may; close one (a page's tab) and retry")
        return None

    def open(self, user: str) -> Client:
        """Register a new stream of ``user``; :class:`StreamRefused` if a bound refuses it.
        The check and the registration are one step (no await between), so concurrent opens
        never pass a bound."""
        refused = self.refusal(user)
        if refused is not None:
            raise StreamRefused(*refused)
        client = Client(user)
        self.clients.add(client)
        self.per_user[user] += 1
        return client

    def close(self, client: Client) -> None:
        """Forget a stream."""
        if client in self.clients:
            self.clients.discard(client)
            self.per_user[client.user] -= 1
            if self.per_user[client.user] <= 0:
                del self.per_user[client.user]


class Tickets:
    """Single-use stream tickets: ticket -> (bearer token, user, expiry), expiring in order."""

    def __init__(self, ttl: float = TICKET_TTL, limit: int = MAX_TICKETS,
                 clock: Callable[[], float] = time.monotonic,
                 per_user: int = MAX_TICKETS_PER_USER) -> None:
        self.ttl, self.limit, self.per_user, self._clock = ttl, limit, per_user, clock
        self._held: collections.OrderedDict[str, tuple[str, str, float]] = collections.OrderedDict()
        self._of: dict[str, collections.OrderedDict[str, None]] = {}  # user -> tickets, oldest first

    def issue(self, token: str, user: str) -> str:
        """A new ticket standing for ``token`` (of ``user``) for :attr:`ttl` seconds."""
        self._purge()
        mine = self._of.setdefault(user, collections.OrderedDict())
        while len(mine) >= self.per_user:
            self._forget(next(iter(mine)))
            mine = self._of.setdefault(user, collections.OrderedDict())
        while len(self._held) >= self.limit:
            self._forget(next(iter(self._held)))
        ticket = secrets.token_urlsafe(24)
        self._held[ticket] = (token, user, self._clock() + self.ttl)
        self._of.setdefault(user, collections.OrderedDict())[ticket] = None
        return ticket

    def redeem(self, ticket: str) -> tuple[str, str] | None:
        """(token, user) of a live ticket, which is used up; None for an unknown or old one."""
        self._purge()
        held = self._forget(ticket)
        return None if held is None else (held[0], held[1])

    def _forget(self, ticket: str) -> tuple[str, str, float] | None:
        held = self._held.pop(ticket, None)
        if held is not None:
            mine = self._of[held[1]]
            del mine[ticket]
            if not mine:
                del self._of[held[1]]
        return held

    def _purge(self) -> None:
        now = self._clock()
        while self._held:
            ticket, (_, _, expiry) = next(iter(self._held.items()))
            if expiry > now:
                break
            self._forget(ticket)

    def __len__(self) -> int:
        return len(self._held)


def messages(hub: ChangeHub, client: Client, render: Render) -> Iterator[bytes]:
    """The events for what ``client`` holds (and empty it)."""
    cluster, resync, keys, many = client.take()
    if resync is not None:
        yield sse("resync", {"why": resync})
        cluster = True  # after a re-fetch the page wants the controller too
        keys, many = {}, {}
    if cluster:
        yield sse("cluster", hub.cluster_view())
    for kind in KINDS:
        if kind in many:
            yield sse(kind, {"many": many[kind]})
        elif keys.get(kind):
            items, removed = render(kind, keys[kind])
            yield sse(kind, {"items": items, "removed": removed})


async def pump(hub: ChangeHub, client: Client, render: Render, send: Callable[[Message], Any],
               alive: Callable[[], bool], *, interval: float = INTERVAL,
               heartbeat: float = HEARTBEAT, send_timeout: float = SEND_TIMEOUT) -> str:
    """Send ``client``'s changes until it is dropped; returns why the stream ended.

    ``alive`` (the stream's token is still live) is asked every ``heartbeat`` seconds, on a
    busy stream as on an idle one."""

    async def put(body: bytes) -> bool:
        with anyio.move_on_after(send_timeout):
            await send({"type": "http.response.body", "body": body, "more_body": True})
            return True
        return False

    if not await put(f"retry: {RETRY_MS}\n\n".encode() + sse("hello", hub.cluster_view())):
        return "not reading"
    last = 0.0
    checked = time.monotonic()
    while True:
        with anyio.move_on_after(heartbeat):
            await client.wake.wait()
        if hub.stopping:
            await put(sse("bye", {"why": "the API server is stopping"}))
            return "server stopping"
        now = time.monotonic()
        if now - checked >= heartbeat:  # busy or idle, the token is re-checked this often
            checked = now
            if not alive():
                await put(sse("bye", {"why": "the token expired or was revoked"}))
                return "token no longer valid"
        if not client.pending:
            if not await put(b": keep-alive\n\n"):
                return "not reading"
            continue
        wait = last + interval - time.monotonic()
        if wait > 0:
            await anyio.sleep(wait)  # coalesce: changes meanwhile join this message
        last = time.monotonic()
        body = b"".join(messages(hub, client, render))
        if body:
            if not await put(body):
                return "not reading"
            hub.sent += 1


async def serve_stream(hub: ChangeHub, client: Client, render: Render, scope: Scope,
                       receive: Callable[[], Any], send: Callable[[Message], Any],
                       alive: Callable[[], bool], **timing: float) -> None:
    """The response of one stream: headers, then :func:`pump` until the client goes away or
    is dropped (then the response ends, so the browser reconnects)."""
    peer = scope.get("client") or ("?", 0)
    why = "client went away"
    try:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no")]})
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            async def run() -> None:
                nonlocal why
                why = await pump(hub, client, render, send, alive, **timing)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(run)
        if why not in ("client went away", "server stopping"):
            if why == "not reading":
                hub.dropped += 1
            logger.info("apiserver: event stream of {} from {} dropped ({}); the page reconnects "
                        "and re-fetches", client.user, peer[0], why)
        if why != "client went away":
            with anyio.move_on_after(1):  # end the response if the socket still takes it
                await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        hub.close(client)
