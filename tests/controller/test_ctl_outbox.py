"""The outbox's direct write: a ready frame with nothing ahead goes out at once, in order."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from xce_controller.pushes import Gate, Outbox

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
