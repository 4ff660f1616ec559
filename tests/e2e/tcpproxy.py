"""A test-local TCP proxy that can black-hole traffic without closing connections.

It stands between clients and a controller candidate. ``partition()`` stops forwarding in
both directions and leaves every socket open, as a pulled cable or a hung switch port does:
only a liveness timeout can notice. ``heal()`` resumes forwarding for new connections.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio
from anyio.abc import SocketStream
from anyio.from_thread import BlockingPortal, start_blocking_portal


class Proxy:
    """Listen on 127.0.0.1:<port> and forward to ``target_port`` while not partitioned."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.partitioned = False
        self._healed = anyio.Event()
        self._portal: BlockingPortal | None = None

    async def _pipe(self, src: SocketStream, dst: SocketStream) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            async for chunk in src:
                # A partition swallows bytes: nothing is forwarded and nothing is closed.
                if not self.partitioned:
                    await dst.send(chunk)
        if self.partitioned:
            await anyio.sleep_forever()  # a partition delivers no FIN either
        with contextlib.suppress(Exception):
            await dst.aclose()

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            if self.partitioned:
                await anyio.sleep_forever()  # accepted but never answered: a black hole
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.target_port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pipe, client, upstream)
                tg.start_soon(self._pipe, upstream, client)

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(self._handle)

    def partition(self) -> None:
        """Stop forwarding; keep every connection open."""
        self.partitioned = True

    def heal(self) -> None:
        """Forward again (connections opened while partitioned stay black holes until closed)."""
        self.partitioned = False


@contextlib.contextmanager
def running_proxy(target_port: int) -> Iterator[Proxy]:
    """Run a proxy on a background event loop for the duration of the block."""
    proxy = Proxy(target_port)
    with start_blocking_portal() as portal:
        future, proxy.port = portal.start_task(proxy._serve)
        try:
            yield proxy
        finally:
            future.cancel()
