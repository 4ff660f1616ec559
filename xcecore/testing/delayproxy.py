"""A delaying TCP relay: the fault test bed's slow links.

This kernel has no ``netem`` qdisc, so a slow link is made in user space: the destination
host's netfilter redirects new TCP connections from the slow peer to this relay (in the
destination's network namespace), which reads the original destination
(``SO_ORIGINAL_DST``), connects to it, and forwards each chunk in both directions after
``delay`` ± ``jitter`` seconds. Chunks leave in the order they arrived (a TCP stream cannot be
reordered), so jitter only varies the delay; it never reorders as netem's can.

The relay runs on threads of the test process, not as a process of the host, so freezing the
host does not freeze its links, and powering the host off (its link down) cuts the relay off
like any other traffic.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from loguru import logger

from xcecore.testing import netns

SO_ORIGINAL_DST = 80
_CHUNK = 65536


class DelayProxy:
    """Listens on ``addr:port`` in namespace ``ns``; forwards each connection with a delay."""

    def __init__(self, ns: str, addr: str, port: int, delay: float, jitter: float,
                 seed: int = 0) -> None:
        if delay < 0 or jitter < 0 or jitter > delay:
            raise ValueError(f"slow link: need 0 <= jitter <= delay, got delay {delay} jitter {jitter}")
        self.ns, self.addr, self.port = ns, addr, port
        self.delay, self.jitter = delay, jitter
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._closed = threading.Event()
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        with netns.entered(ns):
            self._listener = socket.create_server((addr, port), backlog=128)
            # Threads started by this one live in ``ns`` too (outgoing connects included).
            self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                            name=f"slow-link-{ns}-{port}")
            self._thread.start()

    def _draw(self) -> float:
        with self._rng_lock:
            return max(0.0, self.delay + self._rng.uniform(-self.jitter, self.jitter))

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            port = struct.unpack(">H", raw[2:4])[0]
            dst = socket.inet_ntoa(raw[4:8])
            upstream = socket.create_connection((dst, port), timeout=5)
            upstream.settimeout(None)
        except OSError as exc:
            logger.debug("slow link {}: cannot reach the original destination: {}", self.ns, exc)
            conn.close()
            return
        for s in (conn, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed.is_set():
                conn.close()
                upstream.close()
                return
            self._socks.update((conn, upstream))
        for a, b in ((conn, upstream), (upstream, conn)):
            _Pump(a, b, self._draw, self._drop).start()

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with self._lock:
                self._socks.discard(s)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        """Stop listening and cut every relayed connection (the peers see them reset)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for s in socks:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: a reset, as a link that went away; nobody waits on a FIN.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.close()
        self._thread.join(5)


class _Pump:
    """One direction of a relayed connection: read, hold for the drawn delay, write in order."""

    def __init__(self, src: socket.socket, dst: socket.socket, draw: Callable[[], float],
                 drop: Callable[..., None]) -> None:
        self.src, self.dst = src, dst
        self.draw, self.drop = draw, drop
        self.queue: deque[tuple[float, bytes]] = deque()
        self.cond = threading.Condition()
        self.last = 0.0

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.src.recv(_CHUNK)
            except OSError:
                data = b""
            release = max(self.last, time.monotonic() + self.draw())
            self.last = release
            with self.cond:
                self.queue.append((release, data))
                self.cond.notify()
            if not data:
                return

    def _write(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                release, data = self.queue.popleft()
            pause = release - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the link's delay itself, not a synchronisation
            try:
                if not data:
                    self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
            except OSError:
                self.drop(self.src, self.dst)
                return
