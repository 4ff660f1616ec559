"""Outgoing frames per connection, and the fan-out of pushes to members.

Each connection has one :class:`Outbox`: an ordered queue of frames (replies and pushes) that
one writer task sends. An item may be *gated* on a commit: it is not sent before that commit
is durable, and since commits complete in order, nothing a client sees was not committed.
Pushes get their per-connection ``seq`` when queued, so they are gap-free; a member whose
unsent pushes exceed the bound is dropped (its connection closed) and will re-join for a full
state, so one slow member never stalls the controller or grows its memory without bound.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import orjson
from anyio.abc import ByteSendStream, SocketAttribute
from loguru import logger

from xce_controller.state import Event
from xcecore import wire

_LEN = struct.Struct(">I")
_FLUSH_BYTES = 1 << 20


class Gate:
    """Opens when a commit is durable (set on the event loop by the commit callback)."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()

    def is_open(self) -> bool:
        return self.event.is_set()

    def open(self) -> None:
        self.event.set()


Item = tuple[bytes, Gate | None, bool]  # frame, gate, is_push


def frame(body: bytes) -> bytes:
    """Length-prefix an encoded body."""
    return _LEN.pack(len(body)) + body


def reply_frame(id: int | None, result_json: bytes) -> bytes:
    """A success reply whose result is already encoded (stored idempotent results)."""
    return frame(b'{"id":' + orjson.dumps(id) + b',"ok":true,"result":' + result_json + b"}")


class Outbox:
    """One connection's ordered outgoing frames, with a bound on unsent pushes."""

    def __init__(self, max_pushes: int, max_replies: int) -> None:
        self._send, self._recv = anyio.create_memory_object_stream[Item](math.inf)
        self.max_pushes = max_pushes
        self.max_replies = max_replies
        self.seq = 0
        self.queued_pushes = 0
        self.queued_replies = 0
        self._space: anyio.Event | None = None
        # Set while the writer task holds frames it has not finished sending; with it clear and
        # nothing queued, the stream has no unsent bytes and a ready frame may go out at once.
        self._busy = False
        self._sock: wire.HasFileno | None = None  # while the writer runs and the box is open

    def reply(self, data: bytes, gate: Gate | None) -> None:
        """Queue an encoded reply frame."""
        self.queued_replies += 1
        self._put((data, gate, False))

    def push(self, event: str, data_json: bytes, gate: Gate | None) -> bool:
        """Queue a push; False when the member is over its bound (drop it)."""
        if self.queued_pushes >= self.max_pushes:
            return False
        self.seq += 1
        body = (
            b'{"push":' + orjson.dumps(event) + b',"seq":' + str(self.seq).encode()
            + b',"data":' + data_json + b"}"
        )
        self.queued_pushes += 1
        self._put((frame(body), gate, True))
        return True

    def _put(self, item: Item) -> None:
        data, gate, is_push = item
        if (self.queued_pushes + self.queued_replies == 1 and not self._busy
                and (gate is None or gate.is_open())):
            # Nothing ahead of this frame and nothing to wait for: write it now, from the loop
            # (a heartbeat's reply costs one system call instead of a writer-task wake-up).
            sent = wire.write_now(self._sock, data)
            if sent == len(data):
                self._taken(is_push)
                return
            if sent:
                item = (data[sent:], None, is_push)
        try:
            self._send.send_nowait(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the connection is closing; nobody will read it

    def close(self) -> None:
        """No more frames: the writer sends what is queued and returns."""
        self._sock = None  # nothing more goes out directly either
        self._send.close()

    async def wait_reply_space(self) -> None:
        """Wait while too many replies are unsent (the client reads slower than it asks)."""
        while self.queued_replies >= self.max_replies:
            self._space = anyio.Event()
            await self._space.wait()

    def _taken(self, is_push: bool) -> None:
        if is_push:
            self.queued_pushes -= 1
        else:
            self.queued_replies -= 1
            if self._space is not None and self.queued_replies < self.max_replies:
                self._space.set()
                self._space = None

    async def run_writer(self, stream: ByteSendStream) -> None:
        """Send queued frames in order, batching whatever is ready into one write."""
        recv = self._recv
        self._sock = stream.extra(SocketAttribute.raw_socket, None)
        try:
            while True:
                self._busy = False
                try:
                    item = await recv.receive()
                except anyio.EndOfStream:
                    return
                self._busy = True
                buf: list[bytes] = []
                size = 0
                while True:
                    data, gate, is_push = item
                    if gate is not None and not gate.is_open():
                        if buf:
                            await stream.send(b"".join(buf))
                            buf, size = [], 0
                        await gate.event.wait()
                    self._taken(is_push)
                    buf.append(data)
                    size += len(data)
                    if size >= _FLUSH_BYTES:
                        break
                    try:
                        item = recv.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await stream.send(b"".join(buf))
        finally:
            self._sock = None
            recv.close()


class Subscriber:
    """A joined member that receives pushes."""

    __slots__ = ("drop", "identity", "outbox", "worker_host")

    def __init__(
        self, identity: str, outbox: Outbox, worker_host: str | None, drop: Callable[[], None]
    ) -> None:
        self.identity = identity
        self.outbox = outbox
        self.worker_host = worker_host
        self.drop = drop


class Fanout:
    """Who gets which push: non-workers get every event; a worker only its host's."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.members: dict[int, Subscriber] = {}  # connection id -> non-worker subscriber
        self.workers: dict[str, tuple[int, Subscriber]] = {}  # host -> (cid, subscriber)
        # connection id -> its worker's host: removal is O(1), not a scan of every worker
        # (a join storm of N workers removed-before-adding N times: O(N^2) with a scan).
        self._worker_of: dict[int, str] = {}

    def add(self, cid: int, sub: Subscriber) -> None:
        host = sub.worker_host
        if host is None:
            self.members[cid] = sub
            return
        old = self.workers.get(host)
        if old is not None and old[0] != cid:
            self._worker_of.pop(old[0], None)
        self.workers[host] = (cid, sub)
        self._worker_of[cid] = host

    def remove(self, cid: int) -> None:
        if self.members.pop(cid, None) is not None:
            return
        host = self._worker_of.pop(cid, None)
        if host is not None:
            entry = self.workers.get(host)
            if entry is not None and entry[0] == cid:
                del self.workers[host]

    def send(self, cid: int, sub: Subscriber, event: str, data_json: bytes, gate: Gate | None) -> None:
        """Push to one subscriber, dropping it when it is over its bound."""
        if not sub.outbox.push(event, data_json, gate):
            logger.warning(
                "controller {}: member {} has {} unsent pushes; dropping it "
                "(it will re-join and get a full state)",
                self.server, sub.identity, sub.outbox.queued_pushes,
            )
            self.remove(cid)
            sub.drop()

    def publish(self, events: Iterable[Event], gate: Gate | None, encoded: dict[int, bytes]) -> None:
        """Fan ``events`` out; ``encoded`` caches the JSON of records already encoded."""
        for ev in events:
            data = encoded.get(id(ev.data))
            if data is None:
                data = orjson.dumps(ev.data)
            for cid, sub in list(self.members.items()):
                self.send(cid, sub, ev.name, data, gate)
            if not self.workers:
                continue
            targets: Iterable[str] = self.workers.keys() if not ev.workers_only_hosts else ev.hosts
            for host in list(targets):
                entry = self.workers.get(host)
                if entry is not None:
                    self.send(entry[0], entry[1], ev.name, data, gate)

    def all(self) -> list[tuple[int, Subscriber]]:
        return list(self.members.items()) + list(self.workers.values())


def encode_rows(rows: Iterable[tuple[str, Any, Any]], encoded: dict[int, bytes]) -> list[tuple[str, Any, bytes | None]]:
    """Encode the rows of a change once, remembering each record's JSON for the pushes."""
    out: list[tuple[str, Any, bytes | None]] = []
    for table, key, data in rows:
        if data is None:
            out.append((table, key, None))
            continue
        blob = encoded.get(id(data))
        if blob is None:
            blob = encoded[id(data)] = orjson.dumps(data)
        out.append((table, key, blob))
    return out
