"""The event-loop client's network backend: an interface, TCP, and an in-memory network.

A :class:`NetworkBackend` opens a byte stream to a candidate. :data:`TCP` is the real one
(anyio's TCP streams, whose raw socket lets :func:`xcecore.wire.write_now` write a request
without a loop pass). :class:`MemoryNetwork` connects to servers registered in the same
process over in-memory streams: client tests run the whole client -- walk, redirects,
failover, liveness, rejoin -- without a socket, and a "dead" server is one that is not
listening (refused) or has closed its streams.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
from anyio.abc import ByteStream, TaskGroup
from anyio.lowlevel import checkpoint
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from xcecore.candidates import Candidate


class NetworkBackend(Protocol):
    """How a client opens a connection to a candidate."""

    async def connect(self, candidate: Candidate) -> ByteStream:
        """A connected byte stream to ``candidate``; ``OSError`` when it cannot be reached."""
        ...


class TCPBackend:
    """Real TCP (IPv4 and IPv6)."""

    async def connect(self, candidate: Candidate) -> ByteStream:
        """``anyio.connect_tcp`` to the candidate's host and port."""
        return await anyio.connect_tcp(candidate.host, candidate.port)


TCP = TCPBackend()
"""The default backend."""


class MemoryByteStream(ByteStream):
    """One end of an in-memory, full-duplex byte stream (see :func:`memory_stream_pair`).

    Closing an end ends the peer's reads (``EndOfStream``) and breaks its writes, as a closed
    TCP connection does.
    """

    def __init__(self, tx: MemoryObjectSendStream[bytes], rx: MemoryObjectReceiveStream[bytes]) -> None:
        self._tx = tx
        self._rx = rx
        self._left = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` of what the peer sent."""
        if not self._left:
            self._left = await self._rx.receive()
        chunk, self._left = self._left[:max_bytes], self._left[max_bytes:]
        return chunk

    async def send(self, item: bytes) -> None:
        """Send ``item`` to the peer (never blocks: the buffer is unbounded)."""
        if item:
            await self._tx.send(bytes(item))

    async def send_eof(self) -> None:
        """Close the sending direction."""
        self._tx.close()

    async def aclose(self) -> None:
        """Close both directions (at once: even in a cancelled scope, as a socket closes)."""
        self._tx.close()
        self._rx.close()


def memory_stream_pair() -> tuple[MemoryByteStream, MemoryByteStream]:
    """Two connected ends of an in-memory byte stream."""
    a_tx, b_rx = anyio.create_memory_object_stream[bytes](math.inf)
    b_tx, a_rx = anyio.create_memory_object_stream[bytes](math.inf)
    return MemoryByteStream(a_tx, a_rx), MemoryByteStream(b_tx, b_rx)


Handler = Callable[[ByteStream], Coroutine[Any, Any, None]]


class MemoryNetwork:
    """An in-process network: servers :meth:`listen` on candidates, clients :meth:`connect`.

    Each accepted connection runs ``handler(stream)`` in the listener's task group. A
    candidate nobody listens on refuses the connection (``ConnectionRefusedError``).
    """

    def __init__(self) -> None:
        self._listeners: dict[Candidate, tuple[Handler, TaskGroup]] = {}
        self.connects = 0

    def listen(self, candidate: Candidate, handler: Handler, tg: TaskGroup) -> None:
        """Accept connections to ``candidate`` with ``handler``, run in ``tg``."""
        if candidate in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{os.strerror(errno.EADDRINUSE)}: {candidate}")
        self._listeners[candidate] = (handler, tg)

    def unlisten(self, candidate: Candidate) -> None:
        """Stop accepting connections to ``candidate`` (existing ones are the handler's)."""
        self._listeners.pop(candidate, None)

    async def connect(self, candidate: Candidate) -> ByteStream:
        """A stream to ``candidate``'s listener, or ``ConnectionRefusedError``."""
        self.connects += 1
        found = self._listeners.get(candidate)
        if found is None:
            # As the kernel says it (nothing listens on the candidate).
            raise ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
        handler, tg = found
        ours, theirs = memory_stream_pair()
        tg.start_soon(handler, theirs)
        await checkpoint()
        return ours
