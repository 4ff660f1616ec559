"""Outgoing frames per connection, and the fan-out of pushes to members.

Each connection has one :class:`Outbox`: an ordered queue of frames (replies and pushes) that
one writer task sends. An item may be *gated* on a commit: it is not sent before that commit
is durable, and since commits complete in order, nothing a client sees was not committed. A
gate that *fails* (its commit will never happen: the change was rolled back) turns a reply
into the error frame given with it, if any, and withdraws every push waiting on it; a push
gets its per-connection ``seq`` when it is sent, so a withdrawn push leaves no gap, and the
gate remembers the outboxes that waited on it, so the server can send those members a fresh
state.

Every connection is bounded (:class:`Limits`): replies it has not read (requests in flight),
pushes and bytes waiting to be sent. The server stops reading the requests of a connection
that is at its bound (backpressure); a push that would take it past the bound drops the member
(it will re-join for a full state), and so does a connection that takes no byte for
``stall_timeout`` seconds while frames wait. One slow member never stalls the controller or
grows its memory without bound.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson
from anyio.abc import ByteSendStream
from loguru import logger

from xce_controller.jobs import Job, Slot
from xce_controller.state import Event
from xce_controller.store import Row
from xce_controller.subscribe import HOSTED, Subscription, default_for
from xcecore import wire
from xcecore.tls import raw_socket

_LEN = struct.Struct(">I")
_FLUSH_BYTES = 1 << 20  # the most the writer gathers into one send
_SLICE = 256 * 1024  # the most one timed send carries (the stall bound is per slice)
_PUSH_OVERHEAD = 48  # bytes of a push frame around its event name and data (about)
_EVENT_JSON: dict[str, bytes] = {}  # push event name -> its JSON (the names are the controller's)
_EVENT_JSON_MAX = 256  # a bound all the same

ErrorFrame = Callable[[Any], bytes]
"""Builds the frame a reply becomes when its gate fails, from the reason (an error, or the
answer of a read computed again from the rolled-back state)."""


class Gate:
    """Resolves when a commit is durable (opens) or will never be (fails).

    Set on the event loop by the commit callback, or by the rollback of a failed commit. Its
    ``anyio.Event`` is made only when a task waits on it (:meth:`wait`): most gates open with
    nobody waiting (a pipelined client's replies are sent as a batch behind the last one).
    """

    __slots__ = ("_event", "_resolved", "failed", "reason", "redo", "waiters")

    def __init__(self) -> None:
        self._resolved = False
        self._event: anyio.Event | None = None
        self.failed = False
        self.reason: Any = None  # why it failed (given to the replies' builders)
        self.waiters: set[Outbox] | None = None  # outboxes with pushes waiting on it
        self.redo: list[tuple[Outbox, _Item]] | None = None  # replies to build anew if it fails

    def is_open(self) -> bool:
        """Resolved either way: nothing waits on it any more."""
        return self._resolved

    async def wait(self) -> None:
        """Return once the gate is resolved (opened or failed)."""
        if not self._resolved:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()

    def open(self) -> None:
        self._resolved = True
        if self._event is not None:
            self._event.set()

    def fail(self, reason: Any) -> None:
        """Fail it: each waiting reply with a builder becomes what the builder makes of
        ``reason``, now (the caller has rolled the state back), and pushes are withdrawn."""
        self.failed = True
        self.reason = reason
        for box, item in self.redo or ():
            if item.alt is not None:
                box._rebuild(item, item.alt(reason))
        self.redo = None
        self.open()


class Total:
    """A sum many outboxes keep together (their unsent bytes, for the metrics)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: int = 0


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one connection (``[controller]`` settings)."""

    max_pushes: int = 10000  # unsent pushes (max_subscriber_queue)
    max_replies: int = 4096  # requests read whose reply is not sent yet (max_inflight)
    max_bytes: int = 32 * 1024 * 1024  # unsent bytes, replies and pushes (max_unsent_bytes)
    stall_timeout: float = 30.0  # seconds with frames waiting and no byte taken

    @property
    def pause_bytes(self) -> int:
        """Unsent bytes at which the connection's requests stop being read."""
        return self.max_bytes // 2


class _Item:
    """One queued frame."""

    __slots__ = ("alt", "data", "event", "gate", "is_push", "size")

    def __init__(self, data: bytes, gate: Gate | None, is_push: bool, size: int) -> None:
        self.data = data  # a frame; for a push not yet framed, the encoded data
        self.gate = gate
        self.is_push = is_push
        self.size = size
        self.event: bytes | None = None  # a push not yet framed: its encoded event name
        self.alt: ErrorFrame | None = None  # a reply: builds the frame to send if the gate fails


def frame(body: bytes) -> bytes:
    """Length-prefix an encoded body."""
    return _LEN.pack(len(body)) + body


def reply_frame(id: int | None, result_json: bytes) -> bytes:
    """A success reply whose result is already encoded (stored idempotent results)."""
    body = b'{"id":%b,"ok":true,"result":%b}' % (orjson.dumps(id), result_json)
    return _LEN.pack(len(body)) + body


class Stalled(Exception):
    """The peer took no byte for ``stall_timeout`` seconds while frames were waiting."""


def _nothing() -> None:
    pass


class Outbox:
    """One connection's ordered outgoing frames, within its :class:`Limits`."""

    _unsent: int

    @property
    def unsent(self) -> int:
        """Bytes queued and not yet taken by the kernel; every change also moves the total
        of the outboxes sharing ``total`` (for the metrics)."""
        return self._unsent

    @unsent.setter
    def unsent(self, value: int) -> None:
        self.total.value += value - self._unsent
        self._unsent = value

    def __init__(self, max_pushes: int = 10000, max_replies: int = 4096,
                 limits: Limits | None = None, total: Total | None = None,
                 progress: Callable[[], None] | None = None) -> None:
        self.total = total or Total()
        # Called at each wake-up of the writer: the server's proof that its loop makes progress
        # (xce_controller.beat), also in a loop pass that only sends.
        self._progress = progress or _nothing
        self.limits = limits or Limits(max_pushes=max_pushes, max_replies=max_replies)
        # The frames, in order, and the writer's wake-up while there are none (a deque and an
        # event made only when it waits: an anyio memory stream cost a checked send and a
        # receive per frame). ``_open``: frames are still taken (until close, or the writer's end).
        self._queue: deque[_Item] = deque()
        self._open = True
        self._closed = False
        self._ready: anyio.Event | None = None
        self.seq = 0
        self.queued_pushes = 0
        self.queued_replies = 0
        self._unsent = 0  # bytes queued and not yet taken by the kernel (see unsent)
        self.overflow = ""  # why a push was refused (for the log line that drops the member)
        self._space: anyio.Event | None = None
        self._drain: tuple[int, anyio.Event] | None = None  # a sync waiting for room
        # Set while the writer task holds frames it has not finished sending; with it clear and
        # nothing queued, the stream has no unsent bytes and a ready frame may go out at once.
        self._busy = False
        self._sock: wire.HasFileno | None = None  # while the writer runs and the box is open
        self.owner: Any = None  # the server's connection object, for the server's use

    def reply(self, data: bytes, gate: Gate | None, failed: ErrorFrame | None = None) -> None:
        """Queue an encoded reply frame; ``failed`` builds the frame to send instead should
        ``gate`` fail, from the gate's reason (None: send ``data`` either way)."""
        if gate is None and not self._busy and not (self.queued_replies or self.queued_pushes):
            # The common case (a heartbeat's reply): out at once, nothing to keep.
            sent = wire.write_now(self._sock, data)
            if sent == len(data):
                return
            data = data[sent:]
        self.queued_replies += 1
        item = _Item(data, gate, False, len(data))
        item.alt = failed
        if failed is not None and gate is not None and not gate.is_open():
            if gate.redo is None:
                gate.redo = []
            gate.redo.append((self, item))
        self._put(item)

    def _rebuild(self, item: _Item, data: bytes) -> None:
        """A queued reply becomes ``data`` (its gate failed)."""
        self.unsent += len(data) - item.size
        item.data, item.size, item.alt = data, len(data), None

    def push(self, event: str, data_json: bytes, gate: Gate | None) -> bool:
        """Queue a push; False (nothing queued) when it would take the member past a bound.

        A push waiting on ``gate`` is withdrawn if the gate fails.
        """
        lim = self.limits
        size = len(data_json) + len(event) + _PUSH_OVERHEAD
        if self.queued_pushes >= lim.max_pushes:
            self.overflow = f"{self.queued_pushes} unsent pushes (max_subscriber_queue {lim.max_pushes})"
            return False
        unsent = self._unsent
        if unsent and unsent + size > lim.max_bytes:
            # An empty box takes any one push, so a member's own (large) state always fits.
            self.overflow = (f"{unsent + size} bytes unsent "
                             f"(max_unsent_bytes {lim.max_bytes})")
            return False
        item = _Item(data_json, gate, True, size)
        # A dispatch batch pushes thousands of records under a handful of names: each name's
        # JSON is made once per process, not once per push.
        name = _EVENT_JSON.get(event)
        if name is None:
            name = orjson.dumps(event)
            if len(_EVENT_JSON) < _EVENT_JSON_MAX:
                _EVENT_JSON[event] = name
        item.event = name
        if gate is not None and not gate.is_open():
            if gate.waiters is None:
                gate.waiters = set()
            gate.waiters.add(self)
        self.queued_pushes += 1
        self._put(item)
        return True

    def _frame_push(self, item: _Item) -> bytes:
        """Give a push its ``seq`` and its frame, at the moment it is sent."""
        assert item.event is not None
        self.seq += 1
        body = (b'{"push":' + item.event + b',"seq":' + str(self.seq).encode()
                + b',"data":' + item.data + b"}")
        data = frame(body)
        self.unsent += len(data) - item.size  # the estimate made when queued, made exact
        item.event, item.data, item.size = None, data, len(data)
        return data

    def _put(self, item: _Item) -> None:
        self._unsent += item.size  # the unsent setter's two sums, without its call
        self.total.value += item.size
        gate = item.gate
        if (self.queued_pushes + self.queued_replies == 1 and not self._busy
                and (gate is None or gate.is_open())):
            # Nothing ahead of this frame and nothing to wait for: write it now, from the loop
            # (a heartbeat's reply costs one system call instead of a writer-task wake-up).
            data = self._resolve(item)
            if data is None:
                self._taken(item)
                return
            sent = wire.write_now(self._sock, data)
            if sent == len(data):
                self._taken(item)
                return
            # The rest goes through the writer task, as the plain bytes it now is.
            self.unsent -= sent
            item.size -= sent
            item.data, item.gate, item.alt = data[sent:], None, None
        if not self._open:
            return  # the connection is closing; nobody will read it
        self._queue.append(item)
        ready = self._ready
        if ready is not None:
            self._ready = None
            ready.set()

    def close(self) -> None:
        """No more frames: the writer sends what is queued and returns."""
        self._sock = None  # nothing more goes out directly either
        self._open = False
        self._closed = True  # the writer sends what is queued, then returns
        ready = self._ready
        if ready is not None:
            self._ready = None
            ready.set()

    def full(self) -> bool:
        """At a bound: too many replies unsent, or too many bytes (stop reading requests)."""
        return (self.queued_replies >= self.limits.max_replies
                or self.unsent >= self.limits.pause_bytes)

    async def wait_room(self) -> None:
        """Wait while the connection is :meth:`full` (the client reads slower than it asks)."""
        while self.full():
            self._space = anyio.Event()
            await self._space.wait()

    async def wait_below(self, nbytes: int) -> None:
        """Wait until fewer than ``nbytes`` bytes and half the push bound wait to be sent
        (a sync makes its next chunk only then: a slow member slows only its own sync)."""
        while self.unsent >= nbytes or self.queued_pushes >= self.limits.max_pushes // 2:
            event = anyio.Event()
            self._drain = (nbytes, event)
            await event.wait()

    def _taken(self, item: _Item) -> None:
        self.unsent -= item.size
        if item.is_push:
            self.queued_pushes -= 1
        else:
            self.queued_replies -= 1
        if self._space is not None and not self.full():
            self._space.set()
            self._space = None
        drain = self._drain
        if drain is not None and self.unsent < drain[0] and \
                self.queued_pushes < self.limits.max_pushes // 2:
            drain[1].set()
            self._drain = None

    async def _send_timed(self, stream: ByteSendStream, data: bytes) -> None:
        timeout = self.limits.stall_timeout
        for start in range(0, len(data), _SLICE):
            try:
                with anyio.fail_after(timeout):
                    await stream.send(data[start:start + _SLICE])
            except TimeoutError:
                raise Stalled(f"took no data for {timeout:g} s with {self.unsent} bytes "
                              "waiting (stall_timeout)") from None

    async def run_writer(self, stream: ByteSendStream, sock: Any = raw_socket) -> None:
        """Send queued frames in order, batching whatever is ready into one write.

        ``sock``: the plain socket under ``stream`` (None on TLS: every frame then goes through
        the stream); by default found from the stream, which costs about 80 us (anyio builds
        every attribute of the stream twice): a server that knows it passes it.
        Raises :class:`Stalled` when the peer stops taking data (the caller drops it).
        """
        queue = self._queue
        self._sock = raw_socket(stream) if sock is raw_socket else sock
        try:
            while True:
                self._busy = False
                if not queue:
                    if self._closed:
                        return
                    ready = self._ready = anyio.Event()
                    await ready.wait()
                    continue
                item = queue.popleft()
                self._progress()
                self._busy = True
                buf: list[bytes] = []
                taken: list[_Item] = []
                size = 0
                while True:
                    gate = item.gate
                    if gate is not None and not gate.is_open():
                        if buf:
                            await self._flush(stream, buf, taken)
                            buf, taken, size = [], [], 0
                        await gate.wait()
                    data = self._resolve(item)
                    if data is None:  # withdrawn
                        self._taken(item)
                    else:
                        buf.append(data)
                        taken.append(item)
                        size += len(data)
                    if size >= _FLUSH_BYTES or not queue:
                        break
                    item = queue.popleft()
                if buf:
                    await self._flush(stream, buf, taken)
        finally:
            self._sock = None
            self._open = False  # frames queued from now on are dropped
            queue.clear()

    def _resolve(self, item: _Item) -> bytes | None:
        """The bytes to send for ``item`` now that its gate (if any) resolved; None: none."""
        gate = item.gate
        if gate is not None and gate.failed:
            if item.is_push:
                return None
            if item.alt is not None:
                return item.alt(gate.reason)
        return self._frame_push(item) if item.event is not None else item.data

    async def _flush(self, stream: ByteSendStream, buf: list[bytes], taken: list[_Item]) -> None:
        data = b"".join(buf)
        # What the kernel takes at once goes straight to the socket (the writer task is the
        # stream's only sender and the stream buffers nothing, so the order holds); only the
        # rest pays for a timed send through the stream (a cancel scope and a timer each).
        sent = wire.write_now(self._sock, data)
        if sent < len(data):
            await self._send_timed(stream, data[sent:] if sent else data)
        for item in taken:
            self._taken(item)


class Subscriber:
    """A joined member that receives pushes, and what it subscribed to."""

    __slots__ = ("drop", "identity", "outbox", "sub", "worker_host")

    def __init__(
        self, identity: str, outbox: Outbox, worker_host: str | None, drop: Callable[[], None],
        sub: Subscription | None = None,
    ) -> None:
        self.identity = identity
        self.outbox = outbox
        self.worker_host = worker_host
        self.drop = drop
        self.sub = sub if sub is not None else default_for("worker" if worker_host else "", worker_host)


# Who gets each push: (kind, scope) of the subscriptions that see it. A hosted scope ("own",
# "host") is looked up by the event's hosts; "unfinished" only for events marked so.
ROUTES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "job": (("jobs", "all"), ("jobs", "unfinished"), ("jobs", "host")),
    "signal": (("jobs", "all"), ("jobs", "unfinished"), ("jobs", "host")),
    "job_removed": (("jobs", "all"), ("jobs", "unfinished")),
    "host": (("hosts", "all"), ("hosts", "own")),
    "queue": (("queues", "all"),),
    "cluster": (("cluster", "all"),),
    "member": (("members", "all"),),
    "resvals": (("resvals", "all"), ("resvals", "own")),
    "pend_reasons": (("pend_reasons", "all"),),
    "jusage": (("jusage", "all"),),
    "revocation": (("revocations", "all"),),
    "revocations_removed": (("revocations", "all"),),
}
EVERYONE: Final = frozenset({"shutdown"})
"""Pushes every member gets, whatever it subscribed to."""


class Fanout:
    """Who gets which push: an index per (kind, scope), hosted scopes by host.

    A push costs the members that get it: no member's subscription is looked at for an event
    it does not receive.
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self.subs: dict[int, Subscriber] = {}  # connection id -> every subscriber
        self.scoped: dict[tuple[str, str], dict[int, Subscriber]] = {}
        self.hosted: dict[tuple[str, str], dict[str, tuple[int, Subscriber]]] = {}
        self.workers: dict[str, tuple[int, Subscriber]] = {}  # host -> (cid, its worker)
        # connection id -> its worker's host: removal is O(1), not a scan of every worker
        # (a join storm of N workers removed-before-adding N times: O(N^2) with a scan).
        self._worker_of: dict[int, str] = {}
        # connection id -> subscriber, of those that are not workers (a handful), kept as they
        # come and go: building it from ``subs`` cost O(workers) per join in a join storm
        self._others: dict[int, Subscriber] = {}

    @property
    def members(self) -> dict[int, Subscriber]:
        """Subscribers that are not workers (by connection id; do not modify)."""
        return self._others

    def add(self, cid: int, sub: Subscriber) -> None:
        self.remove(cid)
        host = sub.worker_host
        if host is not None:
            old = self.workers.get(host)
            if old is not None and old[0] != cid:
                self.remove(old[0])
            self.workers[host] = (cid, sub)
            self._worker_of[cid] = host
        else:
            self._others[cid] = sub
        self.subs[cid] = sub
        for kind, scope in sub.sub.scopes:
            if scope in HOSTED:
                if host is not None:
                    self.hosted.setdefault((kind, scope), {})[host] = (cid, sub)
            else:
                self.scoped.setdefault((kind, scope), {})[cid] = sub

    def remove(self, cid: int) -> None:
        sub = self.subs.pop(cid, None)
        self._others.pop(cid, None)
        host = self._worker_of.pop(cid, None)
        if host is not None:
            entry = self.workers.get(host)
            if entry is not None and entry[0] == cid:
                del self.workers[host]
        if sub is None:
            return
        for kind, scope in sub.sub.scopes:
            if scope in HOSTED:
                by_host = self.hosted.get((kind, scope))
                if by_host is not None and host is not None:
                    entry = by_host.get(host)
                    if entry is not None and entry[0] == cid:
                        del by_host[host]
            else:
                self.scoped.get((kind, scope), {}).pop(cid, None)

    def send(self, cid: int, sub: Subscriber, event: str, data_json: bytes, gate: Gate | None) -> bool:
        """Push to one subscriber, dropping it when it is over a bound (False)."""
        if not sub.outbox.push(event, data_json, gate):
            logger.warning(
                "controller {}: member {} is over its bound: {}; dropping it "
                "(it will re-join and get what it missed)",
                self.server, sub.identity, sub.outbox.overflow,
            )
            self.remove(cid)
            sub.drop()
            return False
        return True

    def reaches(self, ev: Event) -> bool:
        """Whether :meth:`publish` would send ``ev`` to anyone now (an event nobody gets is
        not encoded: a job's record JSON costs more than its row)."""
        if not self.subs:
            return False
        name = ev.name
        if name in EVERYONE:
            return bool(self.subs)
        for kind, scope in ROUTES.get(name, ()):
            if scope in HOSTED:
                by_host = self.hosted.get((kind, scope))
                if by_host and any(host in by_host for host in ev.hosts):
                    return True
            elif (scope != "unfinished" or ev.unfinished) and self.scoped.get((kind, scope)):
                return True
        return False

    def publish(self, events: Iterable[tuple[Event, bytes]], gate: Gate | None) -> None:
        """Fan encoded events out, each as ``(event, its data's JSON)``."""
        for ev, data in events:
            name = ev.name
            if name in EVERYONE:
                for cid, sub in list(self.subs.items()):
                    self.send(cid, sub, name, data, gate)
                continue
            for kind, scope in ROUTES.get(name, ()):
                if scope in HOSTED:
                    by_host = self.hosted.get((kind, scope))
                    if by_host:
                        for host in ev.hosts:
                            entry = by_host.get(host)
                            if entry is not None:
                                self.send(entry[0], entry[1], name, data, gate)
                elif scope != "unfinished" or ev.unfinished:
                    targets = self.scoped.get((kind, scope))
                    if targets:
                        for cid, sub in list(targets.items()):
                            self.send(cid, sub, name, data, gate)

    def all(self) -> list[tuple[int, Subscriber]]:
        return list(self.subs.items())


def _default(obj: Any) -> Any:
    if isinstance(obj, Job):
        return orjson.Fragment(obj.json())
    if isinstance(obj, Slot):
        return {"host": obj.host, "ntasks": obj.ntasks}
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def encode(value: Any) -> bytes:
    """A value's JSON, jobs as their full records (the one encoder of replies and pushes)."""
    if isinstance(value, Job):
        return value.json()
    return orjson.dumps(value, default=_default, option=orjson.OPT_PASSTHROUGH_DATACLASS)


def encode_rows(rows: Iterable[tuple[str, Any, Any]], encoded: dict[int, bytes]) -> list[Row]:
    """Encode the rows of a change once, remembering each record's JSON for the pushes (a
    job's row is its stored form; its record JSON is made when a push needs it)."""
    out: list[Row] = []
    for table, key, data in rows:
        if data is None:
            out.append((table, key, None, None))
        elif isinstance(data, Job):
            out.append((table, key, data.row(), data._spec))
        else:
            blob = encoded.get(id(data))
            if blob is None:
                blob = encoded[id(data)] = encode(data)
            out.append((table, key, blob, None))
    return out


def encode_events(events: Iterable[Event], encoded: dict[int, bytes]) -> list[tuple[Event, bytes]]:
    """Encode each event's data once (records already encoded for rows are reused)."""
    out: list[tuple[Event, bytes]] = []
    for ev in events:
        data = encoded.get(id(ev.data))
        if data is None:
            data = encoded[id(ev.data)] = encode(ev.data)
        out.append((ev, data))
    return out
