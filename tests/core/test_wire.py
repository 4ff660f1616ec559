"""The frame codec: round trips, limits, and random bytes that only ever raise WireError."""

from __future__ import annotations

import struct

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import given, settings
from hypothesis import strategies as st

from xcecore import wire

pytestmark = pytest.mark.timeout(60)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**62), 2**62) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_roundtrip(obj: dict[str, object]) -> None:
    dec = wire.FrameDecoder()
    frame = wire.encode(obj)
    # Byte by byte, to exercise partial frames.
    out = []
    for i in range(len(frame)):
        out += dec.feed(frame[i : i + 1])
    assert out == [obj]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_wire_error(data: bytes) -> None:
    dec = wire.FrameDecoder(max_frame=1024)
    try:
        for msg in dec.feed(data):
            assert isinstance(msg, dict)
    except wire.WireError:
        pass


def test_oversized_frame_refused_before_buffering() -> None:
    dec = wire.FrameDecoder(max_frame=100)
    with pytest.raises(wire.FrameTooLarge, match="exceeds the maximum of 100"):
        dec.feed(struct.pack(">I", 2**31))


@pytest.mark.parametrize(
    ("body", "needle"), [(b"[1,2]", "JSON object"), (b"\xff\xfe", "not valid JSON"), (b"12", "JSON object")]
)
def test_non_object_frames(body: bytes, needle: str) -> None:
    with pytest.raises(wire.WireError, match=needle):
        wire.FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def test_empty_frame() -> None:
    with pytest.raises(wire.WireError, match="empty frame"):
        wire.FrameDecoder().feed(b"\0\0\0\0")


@pytest.mark.parametrize(
    ("msg", "needle"),
    [
        ({"op": "x"}, "'id'"),
        ({"id": True, "op": "x"}, "'id'"),
        ({"id": 1}, "'op'"),
        ({"id": 1, "op": ""}, "'op'"),
        ({"id": 1, "op": "x", "args": [1]}, "'args'"),
        ({"id": 1, "op": "x", "rid": 5}, "'rid'"),
        ({"id": 1, "op": "x", "rid": "x" * 200}, "'rid'"),
    ],
)
def test_parse_request_rejects(msg: dict[str, object], needle: str) -> None:
    with pytest.raises(wire.RemoteError) as err:
        wire.parse_request(msg)
    assert err.value.code == wire.ErrorCode.INVALID
    assert needle in err.value.message


def test_printable_names_hold_no_control_character() -> None:
    """parse_request accepts an op or rid that ``isprintable()`` without its CONTROL search:
    sound only if no character CONTROL matches is printable (every code point checked)."""
    from xcecore.schema.limits import CONTROL

    matched = [c for c in map(chr, range(0x110000)) if CONTROL.match(c)]
    assert len(matched) == 0x20 + 0x21 and not any(c.isprintable() for c in matched)


@pytest.mark.parametrize("bad", ["a\x00b", "x\ty", "\x7f", "k\x85", "\x9f"])
def test_parse_request_refuses_control_characters(bad: str) -> None:
    for msg, needle in (({"id": 1, "op": bad}, "'op'"), ({"id": 1, "op": "x", "rid": bad}, "'rid'")):
        with pytest.raises(wire.RemoteError, match=needle):
            wire.parse_request(msg)
    # a name that is not printable for another reason (a line separator) is still accepted
    assert wire.parse_request({"id": 1, "op": "x\u2028", "rid": "k\u2028"}).rid == "k\u2028"


def test_parse_request_ok() -> None:
    req = wire.parse_request(wire.request(3, "jobsubmit", {"a": 1}, rid="k1"))
    assert (req.id, req.op, req.args, req.rid) == (3, "jobsubmit", {"a": 1}, "k1")


def test_reply_shapes() -> None:
    assert wire.reply_ok(1, 5) == {"id": 1, "ok": True, "result": 5}
    err = wire.reply_error(2, wire.ErrorCode.REDIRECT, "standby", primary="h:1")
    assert err["error"] == {"code": "REDIRECT", "message": "standby", "primary": "h:1"}
    assert wire.push("job", 4, {}) == {"push": "job", "seq": 4, "data": {}}


@pytest.mark.anyio
async def test_stream_helpers_over_real_socket() -> None:
    got: list[dict[str, object]] = []
    errors: list[Exception] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            buf = BufferedByteReceiveStream(stream)
            try:
                while True:
                    got.append(await wire.read_message(buf, max_frame=64))
            except wire.WireError as exc:
                errors.append(exc)
            except anyio.EndOfStream:
                pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await wire.write_message(conn, {"a": 1})
            await conn.send(struct.pack(">I", 10_000))  # over the 64-byte limit
        with anyio.fail_after(5):
            while not errors:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert got == [{"a": 1}]
    assert isinstance(errors[0], wire.FrameTooLarge)


def test_write_now_writes_what_the_kernel_takes():
    import socket

    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        assert wire.write_now(a, b"hello") == 5
        assert b.recv(16) == b"hello"
        # A full socket buffer takes part of a large frame, then nothing: never blocks.
        big = b"x" * (1 << 22)
        first = wire.write_now(a, big)
        assert 0 < first < len(big)
        assert wire.write_now(a, big) == 0
        assert wire.write_now(None, b"x") == 0
        a.close()
        assert wire.write_now(a, b"x") == 0  # a closed socket (fileno -1) is never written
    finally:
        a.close()
        b.close()


def test_write_now_reports_a_dead_peer_as_nothing_written():
    import socket

    a, b = socket.socketpair()
    a.setblocking(False)
    b.close()
    try:
        assert wire.write_now(a, b"x") == 0  # EPIPE: left to the stream, which reports it
    finally:
        a.close()
