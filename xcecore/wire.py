"""The wire: length-prefixed orjson frames, message shapes and error codes.

Each frame is a 4-byte big-endian length followed by that many bytes holding one orjson
object. Any byte sequence a peer can send either decodes into a dict or raises
:class:`WireError`; a frame longer than the configured maximum is refused before a single byte
of its body is buffered, so a hostile length costs nothing.

Message shapes (all JSON objects)::

    request  {"id": n, "op": "<name>", "args": {...}, "rid": "<idempotency key>"?}
    reply    {"id": n, "ok": true, "result": ...}
             {"id": n, "ok": false, "error": {"code": ..., "message": ..., ...}}
    push     {"push": "<event>", "seq": n, "data": ...}
"""

from __future__ import annotations

import os
import struct

from xcecore.protocol import ErrorCode as ErrorCode  # the vocabulary lives in protocol
from xcecore.schema.limits import CONTROL, RID_MAX, WIRE, find_violation

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any, Protocol

    import orjson

    class _Receiver(Protocol):
        async def receive_exactly(self, nbytes: int) -> bytes: ...

    class _Sender(Protocol):
        async def send(self, item: bytes) -> None: ...

    class HasFileno(Protocol):
        """A socket, or the wrapper asyncio hands out for one."""

        def fileno(self) -> int: ...

else:

    class _LazyOrjson:
        """Stands in for the ``orjson`` module until first used, then is replaced by it.

        Importing orjson costs more than all of this module (it loads ``dataclasses`` and with
        it ``inspect``: ~10 ms here), and the one-shot commands import this module for the
        framing and the error codes only (they encode with the standard library's ``json``).
        After the first use the global name is the module itself, so encoding costs exactly
        what a plain ``import orjson`` would.
        """

        def __getattr__(self, name: str) -> Any:
            import orjson as module

            globals()["orjson"] = module
            return getattr(module, name)

    orjson = _LazyOrjson()

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
PROTO_VERSION = 1
FRAME_HEADER = struct.Struct(">I")
"""The 4-byte big-endian length that precedes every frame body."""
_LEN = FRAME_HEADER


class WireError(Exception):
    """A frame or message that cannot be decoded; the connection should be closed."""


class FrameTooLarge(WireError):
    """A frame's announced length exceeds the maximum frame size."""


class RemoteError(Exception):
    """An error reply from the peer, raised at the caller of the request."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data or {}

    def to_error(self) -> dict[str, Any]:
        """The ``error`` object of a reply carrying this exception."""
        return {**self.data, "code": self.code, "message": self.message}


def encode(obj: Any) -> bytes:
    """Encode one message as a frame: length prefix plus orjson body."""
    body = orjson.dumps(obj)
    return _LEN.pack(len(body)) + body


def frame(body: bytes) -> bytes:
    """A frame holding ``body`` (JSON bytes encoded by the caller): length prefix plus body."""
    return _LEN.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode one frame body, which must be a JSON object."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(f"frame must hold a JSON object, got {type(obj).__name__}")
    return obj


class FrameDecoder:
    """Incremental, I/O-free decoder: feed bytes, get whole messages.

    Used by tests and by anything that reads from a raw buffer; the stream helpers below use
    the same checks.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Append ``data`` and return every message now complete, in order."""
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= 4:
            (size,) = _LEN.unpack_from(self._buf)
            check_size(size, self.max_frame)
            if len(self._buf) < 4 + size:
                break
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            out.append(decode_body(body))
        return out


def check_size(size: int, max_frame: int) -> None:
    """Refuse a frame whose announced size is over the maximum (or zero, which is no object)."""
    if size > max_frame:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the maximum of {max_frame}")
    if size == 0:
        raise WireError("empty frame")


async def read_message(stream: _Receiver, max_frame: int = DEFAULT_MAX_FRAME) -> dict[str, Any]:
    """Read one message from a buffered byte stream (``anyio.streams.buffered``).

    Raises :class:`WireError` for a bad frame and lets anyio's end-of-stream errors through.
    """
    (size,) = _LEN.unpack(await stream.receive_exactly(4))
    check_size(size, max_frame)
    return decode_body(await stream.receive_exactly(size))


def write_now(sock: HasFileno | None, data: bytes) -> int:
    """Write what the kernel takes of ``data`` at once, without yielding; bytes written.

    The fast path for a small frame on a connection whose stream has nothing unsent (the
    caller's own bookkeeping says so): one ``write`` system call instead of handing the frame to
    a writer task and a transport, which costs a task switch and a loop pass per frame. Returns
    0 when nothing could be written (full socket buffer, closed socket, any error): the caller
    sends the rest through its stream, which also reports a dead connection properly. The
    descriptor is read at every call, so a socket closed meanwhile (``-1``) is never written.
    """
    if sock is None:
        return 0
    fd = sock.fileno()
    if fd < 0:
        return 0
    try:
        return os.write(fd, data)
    except OSError:  # EAGAIN, EPIPE, ECONNRESET, ...: the stream's own send deals with it
        return 0


async def write_message(stream: _Sender, obj: Any) -> None:
    """Write one message as a frame."""
    await stream.send(encode(obj))


class Request:
    """A validated request (a plain class: this module must not load ``dataclasses``)."""

    __slots__ = ("args", "id", "op", "rid")

    def __init__(self, id: int, op: str, args: dict[str, Any] | None = None,
                 rid: str | None = None) -> None:
        self.id = id
        self.op = op
        self.args: dict[str, Any] = {} if args is None else args
        self.rid = rid

    def __repr__(self) -> str:
        return f"Request(id={self.id!r}, op={self.op!r}, args={self.args!r}, rid={self.rid!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (self.id, self.op, self.args, self.rid) == (other.id, other.op, other.args, other.rid)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaced


OP_MAX = 64
"""The longest op name a request may carry."""


def parse_request(msg: dict[str, Any]) -> Request:
    """Validate a request's envelope and bound its arguments; raises :class:`RemoteError`
    (INVALID) naming the bad field.

    The arguments get the generic bound :data:`xcecore.schema.limits.WIRE` (nesting depth,
    items per list or object, string sizes) whatever the op, so nothing nested deeper than
    the encoder can write back ever reaches a handler; each op's own schema follows in the
    controller.
    """
    rid_ = msg.get("id")
    if not isinstance(rid_, int) or isinstance(rid_, bool):
        raise RemoteError(ErrorCode.INVALID, "request 'id' must be an integer")
    op = msg.get("op")
    # ``isprintable()`` first: it is False for every character CONTROL matches (tested), and
    # a quarter of the regular expression's cost, for the names and keys of every request.
    if not isinstance(op, str) or not 0 < len(op) <= OP_MAX or \
            not (op.isprintable() or not CONTROL.search(op)):
        raise RemoteError(ErrorCode.INVALID, f"request 'op' must be a name of 1-{OP_MAX} "
                                             "characters without control characters")
    args = msg.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RemoteError(ErrorCode.INVALID, f"request 'args' of op {op!r} must be an object")
    if args:
        found = find_violation(args, WIRE)
        if found is not None:
            path, problem = found
            raise RemoteError(ErrorCode.INVALID, f"{op}: argument {path!r} {problem}",
                              {"arg": path, "limit": {"depth": WIRE.depth, "items": WIRE.items,
                                                      "string": WIRE.string, "key": WIRE.key}})
    key = msg.get("rid")
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= RID_MAX
                            or not (key.isprintable() or not CONTROL.search(key))):
        raise RemoteError(ErrorCode.INVALID, f"request 'rid' must be a string of 1-{RID_MAX} "
                                             "characters without control characters")
    return Request(rid_, op, args, key)


def request(id: int, op: str, args: dict[str, Any] | None = None, rid: str | None = None) -> dict[str, Any]:
    """Build a request message."""
    msg: dict[str, Any] = {"id": id, "op": op, "args": args or {}}
    if rid is not None:
        msg["rid"] = rid
    return msg


def reply_ok(id: int, result: Any) -> dict[str, Any]:
    """Build a success reply."""
    return {"id": id, "ok": True, "result": result}


def reply_error(id: int | None, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """Build an error reply; ``extra`` goes into the error object (e.g. ``primary``)."""
    return {"id": id, "ok": False, "error": {**extra, "code": str(code), "message": message}}


def push(event: str, seq: int, data: Any) -> dict[str, Any]:
    """Build a push message."""
    return {"push": event, "seq": seq, "data": data}
