"""One established connection to a controller candidate: the layer under the failover logic.

:func:`open_link` dials a candidate over a network backend and runs the handshake (its
decisions are :mod:`xcecore.client.dialer`'s); a :class:`Link` then carries many requests at
once (matched to replies by id; one reader task), hands pushes to a callback, and checks
liveness: no frame for ``liveness_timeout`` while a reply is owed kills the link. A link never
reconnects: when it dies it tells its owner once (``on_lost``) and fails its outstanding
requests with :class:`LinkLost`; :mod:`xcecore.client.asyncclient` decides the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import anyio
from anyio.lowlevel import checkpoint
from anyio.streams.buffered import BufferedByteStream

from xcecore import tls as tls_
from xcecore import wire
from xcecore.auth import AuthError, AuthFailed, AuthMethod
from xcecore.candidates import Candidate
from xcecore.client.backend import TCP, NetworkBackend
from xcecore.client.dialer import (
    Handshake,
    classify_handshake,
    describe_os_error,
    failure_of,
    first_answer,
    hello_hint,
    silence,
)
from xcecore.client.machine import Call, liveness_expired

LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError,
               anyio.EndOfStream, anyio.IncompleteRead)
"""What a dying TCP connection raises (as opposed to a peer speaking garbage)."""


class LinkLost(Exception):
    """The link a request was on died before its reply arrived; retry after a reconnect."""



def describe_error(exc: BaseException) -> str:
    """A short operator-facing cause for a link error ("connection refused", ...)."""
    if isinstance(exc, anyio.EndOfStream | anyio.IncompleteRead):
        return "closed by the controller"
    return describe_os_error(exc) or str(exc) or type(exc).__name__


class Opened(NamedTuple):
    """The outcome of :func:`open_link`.

    ``stream`` is set only when the candidate is the primary; ``redirect`` is the primary a
    standby named; otherwise ``failure`` says what went wrong, for the log.
    """

    stream: BufferedByteStream | None = None
    redirect: str | None = None
    failure: str = ""
    timed_out: bool = False  # the candidate did not finish the handshake within the timeout
    refused: str | None = None  # it refused our credential or claim, or none could be made
    takeover: float | None = None  # a standby expects to take over in this many seconds


async def open_link(
    cand: Candidate, *, sender: str, auth: AuthMethod, connect_timeout: float, max_frame: int,
    backend: NetworkBackend = TCP, tls: tls_.TLS | None = None,
) -> Opened:
    """Connect to ``cand`` and run the client side of the handshake within ``connect_timeout``.

    With ``tls`` the stream becomes TLS first (:func:`xcecore.tls.handshake`, the candidate's
    address checked against its certificate); a refused certificate is a refusal (reported
    once, not retried as an outage). A method that blocks (``auth.blocking``: munge asks
    munged) makes its credential on a worker thread, never on the loop.
    """
    timeout = connect_timeout
    stream: BufferedByteStream | None = None
    shake: Handshake | None = None
    failure = ""
    refused: str | None = None
    connected = False
    with anyio.move_on_after(timeout) as scope:
        try:
            raw = await backend.connect(cand)
            connected = True
            if tls is not None:
                try:
                    raw = await tls_.handshake(raw, tls, peer=f"controller {cand}",
                                               hostname=cand.host)
                except BaseException:
                    with anyio.CancelScope(shield=True), contextlib.suppress(*LINK_ERRORS):
                        await raw.aclose()
                    raise
            stream = BufferedByteStream(raw)
            hello = await wire.read_message(stream, max_frame)
            if auth.blocking and hello_hint(hello) is None:
                shake, answer = await anyio.to_thread.run_sync(
                    partial(first_answer, hello, auth=auth, sender=sender))
            else:
                shake, answer = first_answer(hello, auth=auth, sender=sender)
            if answer is not None:
                await wire.write_message(stream, answer)
                shake = classify_handshake(await wire.read_message(stream, max_frame))
        except tls_.TLSFailed as exc:
            failure, refused = f"failed the TLS handshake: {exc}", f"TLS: {exc}"
        except ssl.SSLError as exc:  # TLS 1.3: it refused our certificate after the handshake
            assert tls is not None
            text = tls_.describe(exc, f"controller {cand}", tls)
            failure, refused = f"failed the TLS handshake: {text}", f"TLS: {text}"
        except LINK_ERRORS as exc:
            failure = f"refused or closed the connection ({describe_error(exc)})"
        except AuthFailed as exc:
            failure, refused = f"cannot authenticate ({exc})", str(exc)
        except (wire.WireError, AuthError) as exc:
            failure = f"broke the handshake ({exc})"
    if scope.cancelled_caught:
        failure = silence(timeout, connected=connected, tls=tls is not None)
    redirect: str | None = None
    takeover: float | None = None
    if shake is not None and not failure:
        if shake.kind == "primary" and stream is not None:
            return Opened(stream=stream)
        redirect, takeover = shake.primary, shake.takeover
        failure = failure_of(shake)
        if shake.kind == "denied":
            refused = shake.message
    if stream is not None:
        with anyio.CancelScope(shield=True), contextlib.suppress(*LINK_ERRORS):
            await stream.aclose()
    return Opened(redirect=redirect, failure=failure, timed_out=scope.cancelled_caught,
                  refused=refused, takeover=takeover)


class _Pending:
    __slots__ = ("event", "reply", "sent_at", "written")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.reply: dict[str, Any] | None = None
        self.written = False  # its frame was handed to the socket (or the stream)
        self.sent_at: float | None = None  # when its wait began: from then a reply is owed


_Entry = tuple[bytes, Call | None, _Pending]
"""A frame in a link's outbox, the call it belongs to, and its reply slot."""


class Link:
    """A live, handshaken connection and its outstanding requests.

    ``on_push(link, msg)`` runs on the reader for every push (it may raise
    :class:`xcecore.wire.WireError` to reject a malformed one); ``on_lost(link, reason)`` runs
    once when the link dies, whoever notices. ``joined`` and ``next_seq`` are the owner's
    per-connection bookkeeping.

    Liveness: the link dies when no frame has come for ``liveness_timeout`` while a reply is
    owed (counting from the later of the last frame and the oldest unanswered send). On
    asyncio one timer per link watches that (armed by the first request that finds it idle,
    re-armed by itself while replies are owed, gone when none is), so a request waits on its
    event alone: no cancel scope and no timer per request. On another backend each waiting
    request keeps its own deadline scope. An idle link costs no task and no timer at all.
    """

    __slots__ = ("_ids", "_loop", "_on_lost", "_on_push", "_outbox", "_reading", "_timer",
                 "_woken", "alive", "candidate", "joined", "last_rx", "liveness_timeout",
                 "max_frame", "next_seq", "pending", "reason", "scope", "send_lock", "sock",
                 "stream")

    def __init__(
        self,
        candidate: Candidate,
        stream: BufferedByteStream,
        *,
        max_frame: int,
        liveness_timeout: float,
        on_push: Callable[[Link, dict[str, Any]], None],
        on_lost: Callable[[Link, str], None],
    ) -> None:
        self.candidate = candidate
        self.stream = stream
        self.sock: wire.HasFileno | None = tls_.raw_socket(stream)  # None on TLS
        self.max_frame = max_frame
        self.liveness_timeout = liveness_timeout
        self.pending: dict[int, _Pending] = {}
        self.send_lock = anyio.Lock(fast_acquire=True)  # one frame at a time on the socket
        self.scope = anyio.CancelScope()
        self.alive = True
        self.reason = ""
        self.last_rx = anyio.current_time()  # when the last frame arrived (the loop's clock)
        self.next_seq = 1
        self.joined = False
        self._ids = itertools.count(1)
        self._on_push = on_push
        self._on_lost = on_lost
        self._reading = True
        self._timer: asyncio.TimerHandle | None = None
        self._outbox: list[_Entry] = []  # frames not yet written (see _send)
        self._woken = 0  # requests handed their reply whose callers have not run yet
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): every request keeps its own deadline
            self._loop = None

    def kill(self, reason: str) -> int | None:
        """Mark the link dead and fail its requests; how many were in flight (None: was dead)."""
        if not self.alive:
            return None
        self.alive = False
        self.reason = reason
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self.pending = self.pending, {}
        for p in pending.values():
            p.event.set()
        if self._reading:  # a reader that has already ended needs no cancelling
            self.scope.cancel()
        return len(pending)

    async def request(self, op: str, args: dict[str, Any], rid: str | None,
                      call: Call | None = None) -> dict[str, Any]:
        """Send one request and return its reply; :class:`LinkLost` if the link dies first.

        ``call.sent`` is set the moment the frame starts to go out: from then on, a reply that
        never comes leaves the call's outcome unknown (a request refused before that was not
        sent at all).
        """
        if not self.alive:
            raise LinkLost(f"lost connection to {self.candidate} ({self.reason})")
        n = next(self._ids)
        msg: dict[str, Any] = {"id": n, "op": op, "args": args}
        if rid is not None:
            msg["rid"] = rid
        pending = _Pending()
        self.pending[n] = pending
        entry: _Entry = (wire.encode(msg), call, pending)
        try:
            try:
                await self._send(entry)
            except LINK_ERRORS as exc:
                self._on_lost(self, describe_error(exc))
            loop = self._loop
            if loop is None:
                await self._await_reply(pending, anyio.current_time())
            elif self.alive and not pending.event.is_set():
                pending.sent_at = loop.time()  # the loop's clock: anyio.current_time()
                if self._timer is None:
                    self._timer = loop.call_at(pending.sent_at + self.liveness_timeout,
                                               self._check_liveness)
                await pending.event.wait()  # set by its reply, or by the link's death
        finally:
            if pending.reply is not None:  # the reader counted it among the woken
                self._woken -= 1
            if not pending.written:  # given up before it went out: it must never go out
                with contextlib.suppress(ValueError):
                    self._outbox.remove(entry)
            if pending.reply is None:
                self.pending.pop(n, None)
        if pending.reply is None:
            raise LinkLost(f"lost connection to {self.candidate} ({self.reason})")
        return pending.reply

    async def _send(self, entry: _Entry) -> None:
        """Put ``entry`` in the outbox and see it written, with whatever else is there.

        Whoever holds the send lock writes the whole outbox with one system call; a request
        whose frame went out that way just returns. When the reader has just handed out
        replies whose callers have not run yet (a burst), those callers tend to send again in
        this same loop pass, so the holder first yields once to let their frames join. One
        call at a time (nobody else woken) writes at once. A holder cancelled in that yield
        leaves the others' frames to the next holder, and its own never goes out.
        """
        self._outbox.append(entry)
        async with self.send_lock:  # fast_acquire: no loop pass when it is free
            if entry[2].written:  # it went out with an earlier holder's batch
                return
            if not self.alive:  # it died while we waited for the lock: nothing sent
                raise LinkLost(f"lost connection to {self.candidate} ({self.reason})")
            if self._woken:
                await checkpoint()
                if not self.alive:  # died meanwhile: none of the outbox went out
                    raise LinkLost(f"lost connection to {self.candidate} ({self.reason})")
            batch, self._outbox = self._outbox, []
            for _, call, pending in batch:
                pending.written = True
                if call is not None:
                    call.sent = True
            frame = batch[0][0] if len(batch) == 1 else b"".join([e[0] for e in batch])
            # Holding the lock, nothing of ours is unsent: try the socket directly and leave
            # only a remainder (a full socket buffer) to the stream.
            sent = wire.write_now(self.sock, frame)
            if sent == 0:
                await self.stream.send(frame)
            elif sent < len(frame):
                # Half a frame is out: a cancellation now would garble the stream (the
                # link's own death still ends this send, by closing it).
                with anyio.CancelScope(shield=True):
                    await self.stream.send(frame[sent:])

    def _check_liveness(self) -> None:
        """The link's liveness timer (asyncio): kill a link gone silent while a reply is
        owed, else re-arm for the oldest reply still owed; with none owed, stay unarmed."""
        self._timer = None
        if not self.alive:
            return
        owed = [p.sent_at for p in self.pending.values() if p.sent_at is not None]
        if not owed:
            return  # the next request arms it again
        oldest, timeout = min(owed), self.liveness_timeout
        assert self._loop is not None
        now = self._loop.time()
        if liveness_expired(now, self.last_rx, oldest, timeout):
            self._on_lost(self, f"no frame for {timeout:g} s with {len(self.pending)} "
                                "request(s) outstanding: liveness timeout")
            return
        self._timer = self._loop.call_at(max(self.last_rx, oldest) + timeout,
                                         self._check_liveness)

    async def _await_reply(self, pending: _Pending, sent_at: float) -> None:
        """Wait for ``pending``'s reply or the link's death; kill a link gone silent."""
        timeout = self.liveness_timeout
        while not pending.event.is_set():
            with anyio.CancelScope(deadline=max(self.last_rx, sent_at) + timeout):
                await pending.event.wait()
            if pending.event.is_set():
                return
            if liveness_expired(anyio.current_time(), self.last_rx, sent_at, timeout):
                self._on_lost(self, f"no frame for {timeout:g} s with {len(self.pending)} "
                                    "request(s) outstanding: liveness timeout")
                return  # the link is dead (its owner kills it): the caller raises LinkLost

    async def serve(self) -> None:
        """Run the reader until the link dies; then close the socket."""
        try:
            with self.scope:
                reason = await self._read_loop()
                self._reading = False
                self._on_lost(self, reason)
        finally:
            self._reading = False
            self._on_lost(self, "closed")  # a no-op unless cancelled from outside
            with anyio.CancelScope(shield=True):
                # A plain close, not aclose_forcefully: that one cancels a scope, and anyio
                # formats the current task into every cancel's message (costly in a storm).
                with contextlib.suppress(*LINK_ERRORS):
                    await self.stream.aclose()

    async def _read_loop(self) -> str:
        """Hand replies to their callers and pushes to ``on_push``; return why it ended."""
        stream, max_frame, pending = self.stream, self.max_frame, self.pending
        try:
            while True:
                msg = await wire.read_message(stream, max_frame)
                self.last_rx = anyio.current_time()
                mid = msg.get("id")
                waiter = pending.pop(mid, None) if type(mid) is int else None
                if waiter is not None:
                    waiter.reply = msg
                    waiter.event.set()
                    self._woken += 1
                elif "push" in msg:
                    self._on_push(self, msg)
                # else: the reply to a request whose caller gave up (cancelled); drop it
        except wire.WireError as exc:
            return f"protocol error: {exc}"
        except LINK_ERRORS as exc:
            return describe_error(exc)
