"""Accepted API connections get TCP_NODELAY: uvicorn writes a response's headers and body in
two send() calls, and without it Nagle plus the client's delayed ACK add ~40 ms to each
response on a kept-alive connection."""

from __future__ import annotations

import asyncio
import socket

import pytest
from xce_apiserver.server import bind

pytestmark = pytest.mark.timeout(30)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


async def _nodelay_of_accepted(listen: str) -> int:
    sock = bind(listen)
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        host, port = sock.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:0"])
def test_accepted_connections_have_tcp_nodelay(listen: str) -> None:
    if listen.startswith("[") and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with bind(listen) as sock:
        assert sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(_nodelay_of_accepted(listen)) != 0
