"""Runs uvicorn inside the role's anyio event loop, on a socket the role binds itself.

Binding the socket here (not in uvicorn) means a bad ``listen`` address is a clear error
rather than uvicorn's ``sys.exit``, and port 0 works: the real port is logged and written to
``port_file``. Uvicorn's own signal handling is switched off: the role's runtime owns
SIGTERM/SIGINT and stops the server through ``stop`` or cancellation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import anyio

from xcecore.bridge import StopEvent
from xcecore.protocol import format_hostport, parse_hostport


def bind(listen: str) -> socket.socket:
    """A listening socket for ``host:port`` (``[::1]:0`` and port 0 allowed)."""
    host, port = parse_hostport(listen, what="apiserver.listen", port_zero=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on an accepted
    # connection only when its socket's proto is IPPROTO_TCP, and accepted sockets inherit the
    # listener's proto. Without it uvicorn's two send() calls (headers, then body) meet Nagle
    # plus the client's delayed ACK: ~40 ms added to every response on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Belt and braces: Linux also copies TCP_NODELAY from the listener to accepted sockets.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"apiserver: cannot listen on {listen}: {exc.strerror or exc}") from None
    return sock


def bound_address(sock: socket.socket) -> str:
    """``host:port`` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return format_hostport(host, port)


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` atomically, so a reader never sees a half-written file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(target)


_DISCONNECT_NAMES = frozenset({"ClientDisconnect", "ClientDisconnected", "ClosedResourceError",
                               "BrokenResourceError", "EndOfStream"})
"""Exceptions (by class name: starlette's, uvicorn's, anyio's) that mean the client went away."""


def _dropped_client(exc: BaseException | None) -> bool:
    """True when ``exc`` (or what it was raised from) says the client's connection is gone."""
    for _ in range(6):
        if exc is None:
            return False
        if isinstance(exc, ConnectionError) or type(exc).__name__ in _DISCONNECT_NAMES:
            return True
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            return all(_dropped_client(e) for e in exc.exceptions)
        exc = exc.__cause__ or exc.__context__
    return False


class DroppedClientFilter(logging.Filter):
    """On uvicorn's error logger: a response that failed because its client went away (an
    event stream a browser closed, a reader that hung up) is one INFO line, not an ERROR with
    a traceback; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if record.levelno >= logging.ERROR and info and _dropped_client(info[1]):
            exc = info[1]
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = ("apiserver: a client went away before its response "
                                       "ended (%s); nothing to do"), (type(exc).__name__,)
            record.exc_info = record.exc_text = None
        return True


UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def route_uvicorn_logs() -> None:
    """Send uvicorn's loggers to the root logger (loguru's handler: component and time stamp
    on every line) without handlers of their own, through :class:`DroppedClientFilter`."""
    for name in UVICORN_LOGGERS:
        log = logging.getLogger(name)
        log.handlers = []
        log.propagate = True
        if not any(isinstance(f, DroppedClientFilter) for f in log.filters):
            log.addFilter(DroppedClientFilter())


def _http_impl() -> str:
    """httptools (C, llhttp) when installed, as uvicorn's "auto" would pick; else h11."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def ssl_options(tls: Mapping[str, Any] | None) -> dict[str, Any]:
    """uvicorn's TLS options from ``[tls]`` (empty: plain HTTP): the server certificate and
    key, and, with ``require_client_cert``, the CA every client's certificate must be signed
    by. Raises :class:`xcecore.tls.TLSConfigError` naming a bad file now, at start-up, rather
    than uvicorn's exit later."""
    from xcecore.tls import server_tls

    if tls is None or not tls.get("rest", True) or server_tls(tls, what="the API server") is None:
        return {}
    import ssl

    return {"ssl_certfile": tls["cert"], "ssl_keyfile": tls["key"], "ssl_ca_certs": tls["ca"],
            "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.get("require_client_cert")
            else ssl.CERT_NONE}


async def serve(app: Any, sock: socket.socket, stop: StopEvent, *,
                ssl: Mapping[str, Any] | None = None) -> None:
    """Serve ``app`` on ``sock`` until ``stop`` is set or this task is cancelled; over TLS
    with ``ssl`` (:func:`ssl_options`)."""
    import uvicorn

    route_uvicorn_logs()

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield  # the role's runtime owns the signals

    # No proxy-header rewriting (the API server is reached directly; behind a proxy the
    # client address is not used for anything) and no Server header: a few percent of
    # every request. httptools (C) parses HTTP when installed.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=3, proxy_headers=False,
                            server_header=False, http=_http_impl(), **(ssl or {}))
    server = _Server(config)

    async def watch_stop() -> None:
        await stop.wait_async()
        server.should_exit = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_stop)
        try:
            await server.serve(sockets=[sock])
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                server.should_exit = True
                if server.started:
                    await server.shutdown(sockets=[sock])
            raise
        finally:
            tg.cancel_scope.cancel()
            sock.close()
