"""Reading a connection's frames: whole frames, each within a time bound once it has begun.

The server reads requests through one :class:`FrameReader` per connection. A member may stay
idle for as long as it likes between frames (its heartbeats are its business), but once the
first byte of a frame has arrived, the whole frame must follow within ``frame_timeout``
seconds: a peer that sends half a frame and stops would otherwise hold its connection, and
the bytes buffered for it, for ever. The length is checked against the maximum frame before a
byte of the body is buffered, as :func:`xcecore.wire.read_message` does.

Reads take what the kernel has (up to :data:`CHUNK` bytes) into one buffer, so pipelined
requests cost one ``recv`` for many frames instead of two per frame.
"""

from __future__ import annotations

import struct
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream

from xcecore import wire

_LEN = struct.Struct(">I")
CHUNK = 64 * 1024  # bytes asked of the kernel per read while a frame is short
BIG_CHUNK = 1024 * 1024  # per read while the rest of a large frame arrives


class FrameReader:
    """Frames from one byte stream (the receive half of a connection)."""

    def __init__(self, stream: ByteReceiveStream, max_frame: int) -> None:
        self._stream = stream
        self.max_frame = max_frame
        self._buf = bytearray()

    async def _fill(self, need: int) -> None:
        """Read until ``need`` bytes are buffered (EndOfStream if the peer closes first)."""
        buf = self._buf
        while len(buf) < need:
            buf += await self._stream.receive(min(max(CHUNK, need - len(buf)), BIG_CHUNK))

    async def receive_exactly(self, nbytes: int) -> bytes:
        """``nbytes`` bytes (for :func:`xcecore.wire.read_message`, used by the handshake)."""
        await self._fill(nbytes)
        out = bytes(self._buf[:nbytes])
        del self._buf[:nbytes]
        return out

    def _complete(self) -> int | None:
        """The body size of the buffered frame if it is all here; None if not (yet)."""
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = _LEN.unpack_from(buf)
        wire.check_size(size, self.max_frame)  # refused before its body is buffered
        return size if len(buf) >= 4 + size else None

    async def next_message(self, complete_within: float) -> dict[str, Any]:
        """The next message; waits for its first byte without limit, the rest at most
        ``complete_within`` s.

        Raises :class:`TimeoutError` for a frame begun and not finished in time,
        :class:`xcecore.wire.WireError` for a bad frame, and anyio's end-of-stream errors
        when the peer closes.
        """
        if not self._buf:
            self._buf += await self._stream.receive(CHUNK)
        size = self._complete()
        if size is None:
            with anyio.fail_after(complete_within):
                await self._fill(4)
                (size,) = _LEN.unpack_from(self._buf)
                wire.check_size(size, self.max_frame)
                await self._fill(4 + size)
        body = bytes(self._buf[4:4 + size])
        del self._buf[:4 + size]
        return wire.decode_body(body)
