"""The outbox: a ready frame with nothing ahead goes out at once, in order; failed gates; its
bounds in bytes and counts; a peer that takes nothing is dropped."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import anyio
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from xce_controller.pushes import Gate, Limits, Outbox, Stalled

from xcecore import wire

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _pair() -> tuple[Any, Any, Any]:
    """A connected TCP pair on loopback (server side, client side) and its listener."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    inner = listener.listeners[0]
    client = await anyio.connect_tcp("127.0.0.1", port)
    server = await inner.accept()
    return server, client, listener


async def test_ready_frame_is_written_without_the_writer_and_gated_ones_keep_order():
    server, client, listener = await _pair()
    reader = BufferedByteReceiveStream(client)
    box = Outbox(max_pushes=100, max_replies=100)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run_writer, server)
            await anyio.sleep(0.05)  # the writer is idle, waiting for frames
            box.reply(wire.encode({"id": 1}), None)
            # Written on the spot: nothing is left queued for the writer task.
            assert box.queued_replies == 0
            assert (await wire.read_message(reader))["id"] == 1

            gate = Gate()
            box.reply(wire.encode({"id": 2}), gate)  # waits for a commit
            box.reply(wire.encode({"id": 3}), None)  # ready, but must not overtake 2
            assert box.push("job", b'{"j":1}', None)  # nor may a push
            await anyio.sleep(0.05)
            assert box.queued_replies + box.queued_pushes > 0
            gate.open()
            got = [await wire.read_message(reader) for _ in range(3)]
            assert [m.get("id") for m in got[:2]] == [2, 3] and got[2]["push"] == "job"
            await anyio.sleep(0.05)
            box.reply(wire.encode({"id": 4}), gate)  # an open gate is no wait: direct again
            assert box.queued_replies == 0
            assert (await wire.read_message(reader))["id"] == 4
            box.close()
    finally:
        await client.aclose()
        await server.aclose()
        await listener.aclose()


async def test_a_closed_outbox_writes_nothing_directly():
    server, client, listener = await _pair()
    box = Outbox(max_pushes=10, max_replies=10)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run_writer, server)
            await anyio.sleep(0.05)
            box.close()
            box.reply(wire.encode({"id": 1}), None)
        await server.aclose()
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await client.receive()
    finally:
        await client.aclose()
        await listener.aclose()


async def test_close_sends_what_was_queued_then_the_writer_returns():
    """Frames queued before close() all go out, in order (behind a gate that opens later);
    frames after it, or after the writer's end, are dropped without an error."""
    server, client, listener = await _pair()
    reader = BufferedByteReceiveStream(client)
    box = Outbox(max_pushes=100, max_replies=100)
    gate = Gate()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run_writer, server)
            box.reply(wire.encode({"id": 1}), gate)
            for i in range(2, 50):
                box.reply(wire.encode({"id": i}), None)
            assert box.push("job", b'{"j":1}', None)
            box.close()
            box.reply(wire.encode({"id": 99}), None)  # after close: dropped
            assert box.push("job", b'{"j":2}', None)  # (taken, never sent)
            gate.open()
        # the group ended: the writer returned once the frames queued before close were sent
        box.reply(wire.encode({"id": 100}), None)
        await server.aclose()
        got: list[Any] = []
        with anyio.fail_after(10):
            while True:
                try:
                    msg = await wire.read_message(reader)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    break
                got.append(msg.get("id", msg.get("data")))
        assert got == [*range(1, 50), {"j": 1}]
    finally:
        await client.aclose()
        await listener.aclose()


async def test_a_failed_gate_sends_the_error_reply_and_withdraws_its_pushes():
    server, client, listener = await _pair()
    reader = BufferedByteReceiveStream(client)
    box = Outbox(max_pushes=100, max_replies=100)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run_writer, server)
            gate = Gate()
            box.reply(wire.encode({"id": 1, "ok": True}), gate,
                      lambda reason: wire.encode({"id": 1, "ok": False, "why": reason}))
            assert box.push("job", b'{"j":1}', gate)  # withdrawn with the gate
            box.reply(wire.encode({"id": 2, "ok": True}), gate)  # no error frame: sent as is
            assert gate.waiters == {box}
            gate.fail("disk full")
            assert box.push("job", b'{"j":2}', None)
            got = [await wire.read_message(reader) for _ in range(3)]
            assert got[0] == {"id": 1, "ok": False, "why": "disk full"}
            assert got[1] == {"id": 2, "ok": True}
            assert got[2] == {"push": "job", "seq": 1, "data": {"j": 2}}  # no gap: seq 1
            assert box.seq == 1 and box.unsent == 0 and box.queued_pushes == 0
            box.close()
    finally:
        await client.aclose()
        await server.aclose()
        await listener.aclose()


async def test_bounds_in_bytes_and_counts():
    box = Outbox(limits=Limits(max_pushes=3, max_replies=2, max_bytes=10_000, stall_timeout=1))
    gate = Gate()  # nothing is sent while it is closed
    big = b"x" * 20_000
    assert box.push("state", big, gate)  # an empty box takes any one push (a member's state)
    assert not box.push("job", b"{}", gate)  # but nothing more past the bound
    assert "max_unsent_bytes 10000" in box.overflow
    small = Outbox(limits=Limits(max_pushes=3, max_replies=2, max_bytes=10_000_000))
    assert all(small.push("job", b"{}", gate) for _ in range(3))
    assert not small.push("job", b"{}", gate) and "max_subscriber_queue 3" in small.overflow
    assert not small.full()
    small.reply(wire.encode({"id": 1}), gate)
    small.reply(wire.encode({"id": 2}), gate)
    assert small.full()  # as many replies unsent as requests may be in flight
    half = Outbox(limits=Limits(max_bytes=1000))
    half.reply(b"y" * 499, gate)
    assert not half.full()
    half.reply(b"y", gate)
    assert half.full() and half.unsent == 500  # reading stops at half the byte bound


async def test_a_peer_that_takes_nothing_is_stalled():
    server, client, listener = await _pair()
    sock = server.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    box = Outbox(limits=Limits(stall_timeout=0.3))
    try:
        with anyio.fail_after(10):
            for _ in range(100):
                box.push("job", b'"' + b"z" * 100_000 + b'"', None)
            with pytest.raises(Stalled, match="took no data for 0.3 s"):
                await box.run_writer(server)
    finally:
        await client.aclose()
        await server.aclose()
        await listener.aclose()



def _frames(buf: bytes | bytearray) -> list[bytes]:
    """The complete frames at the start of ``buf``; a length no frame here has is corruption."""
    out, at = [], 0
    while at + 4 <= len(buf):
        (size,) = wire.FRAME_HEADER.unpack_from(buf, at)
        assert size < 1 << 20, f"frame {len(out)}: length {size}: the stream is corrupted"
        if at + 4 + size > len(buf):
            break
        out.append(bytes(buf[at + 4:at + 4 + size]))
        at += 4 + size
    return out


async def test_a_direct_write_never_overtakes_bytes_the_stream_still_holds():
    # The direct write's premise: with the writer idle, the stream holds no unsent byte. A
    # push larger than the kernel takes must not leave its tail in the stream's transport
    # while the writer goes idle (anyio sets the transport's write-buffer limits to 0, so its
    # send returns only once the transport handed everything to the kernel): a reply written
    # straight to the socket when the peer has just made room would land inside the push.
    server, client, listener = await _pair()
    server.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    csock = client.extra(anyio.abc.SocketAttribute.raw_socket)
    csock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    box = Outbox()
    received = bytearray()

    def read(n: int) -> None:
        with contextlib.suppress(BlockingIOError):
            received.extend(os.read(csock.fileno(), n))  # non-blocking: the loop set it so

    rounds = 5
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run_writer, server)
            await anyio.sleep(0.05)
            for n in range(rounds):
                assert box.push("job", b'"' + b"z" * 40_000 + b'"', None)
                with anyio.fail_after(5):  # the peer reads slowly until the writer is idle
                    while box.queued_pushes or box._busy:
                        read(8192)
                        await anyio.sleep(0.002)
                read(8192)  # the peer takes a little, and the loop does not run meanwhile
                box.reply(wire.encode({"id": n}), None)
                with anyio.fail_after(10):  # both frames arrive before the next round
                    while len(_frames(received)) < 2 * (n + 1):
                        await anyio.sleep(0.002)
                        read(1 << 20)
            box.close()
    finally:
        await client.aclose()
        await server.aclose()
        await listener.aclose()
    got = [orjson.loads(f) for f in _frames(received)]
    assert [m.get("push") or m.get("id") for m in got] == [x for n in range(rounds) for x in ("job", n)]
    assert all(len(m["data"]) == 40_000 for m in got[::2])
