"""The one-shot client: a blocking shell over a plain socket, for commands that make a few
calls and exit (``xce jobs``, ``xce submit``).

It drives the same :class:`~xcecore.client.machine.Machine` and
:class:`~xcecore.client.dialer.Walk` as the event-loop client -- candidate walk, redirects to
listed candidates only, the lost candidate tried last, jittered back-off, retries with one
idempotency key per call, NOT_JOINED -> join and one retry, liveness, unknown outcomes -- but
has no event loop, no threads and no background work: a command that starts, calls and exits
pays only for a socket. It imports no anyio, loguru, pluggy or orjson (the standard
library's ``json`` encodes its few small frames; orjson's import alone would cost more than
the call).

The deadline bounds each whole call, connects and back-off sleeps included: a command never
waits forever.
"""

from __future__ import annotations

import _socket  # socket's C module: see _connect_socket
import itertools
import json
import os
import sys
import time
from collections.abc import Callable

from xcecore import wire
from xcecore.auth import AuthFailed
from xcecore.candidates import Candidate
from xcecore.client.backoff import Backoff
from xcecore.client.dialer import (
    Dialed,
    Handshake,
    classify_handshake,
    describe_os_error,
    failure_of,
    first_answer,
    silence,
    walk,
)
from xcecore.client.errors import AuthenticationFailed, BackendUnavailable, OutcomeUnknown
from xcecore.client.machine import Budget, Call, Effect, Log, Machine, judge_reply
from xcecore.client.settings import ClientConfig
from xcecore.tls import TLSFailed

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}


def stderr_logger(level: str = "WARNING") -> Callable[[str, str], None]:
    """A ``log(level, line)`` that writes lines at ``level`` or above to stderr (the time
    stamp's modules are imported by the first line written: most commands write none)."""
    floor = LEVELS.get(level.upper(), 30)

    def log(at: str, text: str) -> None:
        if LEVELS.get(at, 30) >= floor:
            from xcecore.log import stamp

            sys.stderr.write(f"{stamp()} {at:<7} xce | {text}\n")

    return log


class _Lost(Exception):
    """The socket died (or went silent) before the reply came."""


class _Expired(Exception):
    """The call's deadline passed."""


def _encode(msg: dict[str, Any]) -> bytes:
    return wire.frame(json.dumps(msg, separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False).encode())


def _decode(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, absurd depth
        raise wire.WireError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise wire.WireError(f"frame must hold a JSON object, got {type(obj).__name__}")
    return obj


def _is_ssl_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``ssl.SSLError`` other than an end of stream (checked without
    importing ``ssl``, which a plain-TCP command never loads)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(exc, ssl.SSLError) and not isinstance(
        exc, ssl.SSLEOFError | ssl.SSLZeroReturnError)


def _connect_socket(cand: Candidate, timeout: float, *, plain: bool) -> _socket.socket:
    """A connected TCP socket. An IP literal is connected without a name lookup (which would
    load the ``idna`` codec: a few ms of a command's start-up); ``plain``: as an object of
    ``_socket``, the C module the ``socket`` module wraps: importing ``socket`` (its enum
    classes of constants, ``selectors``) costs ~3 ms of a ~45 ms command, and a blocking
    connect, send and receive are the C module's own methods. Not ``plain`` (TLS: ``ssl``
    wraps ``socket``'s own class, and imports it anyway) and for a host name (through
    ``socket.create_connection``: every address the name has, in turn), a ``socket.socket``."""
    if plain:
        make: type[_socket.socket] = _socket.socket
    else:
        import socket

        make = socket.socket
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, cand.host)
        except OSError:
            continue
        sock = make(family, _socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((cand.host, cand.port))
        except BaseException:
            sock.close()
            raise
        break
    else:
        import socket

        sock = socket.create_connection((cand.host, cand.port), timeout=timeout)
    sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    return sock


class _Conn:
    """One handshaken socket to the primary."""

    __slots__ = ("candidate", "flags", "identity", "ids", "joined", "max_frame", "sock")

    def __init__(self, sock: _socket.socket, candidate: Candidate, max_frame: int) -> None:
        self.sock = sock
        # A TLS socket takes no recv flags; it returns a record at a time, and the loop
        # below asks again for the rest.
        self.flags = 0 if hasattr(sock, "cipher") else _socket.MSG_WAITALL
        self.candidate = candidate
        self.max_frame = max_frame
        self.ids = itertools.count(1)
        self.joined = False
        self.identity: dict[str, Any] = {}  # who the controller authenticated us as

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(_encode(msg))

    def read(self, timeout: float) -> dict[str, Any]:
        """The next frame, waiting at most ``timeout`` for each part of it."""
        self.sock.settimeout(timeout)
        (size,) = wire.FRAME_HEADER.unpack(self._exactly(4))
        wire.check_size(size, self.max_frame)
        return _decode(self._exactly(size))

    def _exactly(self, n: int) -> bytes:
        data = self.sock.recv(n, self.flags)
        while len(data) < n:
            if not data:
                raise EOFError("closed by the controller")
            more = self.sock.recv(n - len(data), self.flags)
            if not more:
                raise EOFError("closed by the controller")
            data += more
        return data

    def close(self) -> None:
        self.sock.close()


class OneShotClient:
    """A blocking client for one command: ``with OneShotClient(cfg) as c: c.call(...)``.

    ``role`` names the client (a command joins only if a controller asks it to, with
    ``join_attrs``); ``log(level, line)`` receives the client's log lines (default: warnings
    and errors to stderr). Not thread-safe: one command, one thread.
    """

    def __init__(self, config: ClientConfig, *, role: str = "cli",
                 join_attrs: dict[str, Any] | None = None,
                 log: Callable[[str, str], None] | None = None) -> None:
        self.config = config
        self.role = role
        self.join_attrs = dict(join_attrs or {})
        self._name = f"xce client {config.sender}"
        self.machine = Machine(config.candidates, name=self._name,
                               allow_unlisted=config.allow_unlisted_redirect,
                               connect_timeout=config.connect_timeout)
        self._log = log if log is not None else stderr_logger()
        self._conn: _Conn | None = None
        self._uuid = os.urandom(16).hex()
        self._rids = itertools.count(1)

    def __enter__(self) -> OneShotClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    @property
    def candidate(self) -> Candidate | None:
        """The primary the client is connected to, or None."""
        return self._conn.candidate if self._conn is not None else None

    def whoami(self, *, deadline: float | None = None) -> dict[str, Any]:
        """Who the primary authenticated this client as (``{"user", "uid", "gid",
        "method"}``), connecting first if needed."""
        conn = self._conn
        if conn is None:
            end = None if deadline is None else time.monotonic() + deadline
            try:
                conn = self._connect(Call("connect", "", Budget(None)), end)
            except _Expired:
                exc = self.machine.deadline_error("connect", deadline or 0.0, None, Budget(None))
                self._do(self.machine.gave_up("connect", exc))
                raise exc from None
        return dict(conn.identity)

    # ------------------------------------------------------------------ calls
    def call(self, op: str, args: dict[str, Any] | None = None, *, deadline: float | None = None,
             retry_budget: int | None = None, rid: str | None = None) -> Any:
        """Send ``op`` and return its result; the errors and retries of ``Client.call``.

        ``deadline`` (seconds from now) bounds everything, connecting included; with neither
        it nor ``retry_budget`` the call tries until a primary answers.
        """
        call = Call(op, rid or f"{self._uuid}-{next(self._rids)}", Budget(retry_budget))
        end = None if deadline is None else time.monotonic() + deadline
        try:
            return self._attempts(call, args or {}, end)
        except _Expired:
            exc = self.machine.deadline_error(op, deadline or 0.0, call, call.budget)
            self._do(self.machine.gave_up(op, exc))
            raise exc from call.budget.last_error
        except AuthenticationFailed:  # logged where it was found
            raise
        except (BackendUnavailable, OutcomeUnknown) as exc:
            self._do(self.machine.gave_up(op, exc))
            raise

    def outcome(self, rid: str, *, deadline: float | None = None) -> dict[str, Any]:
        """What became of the write with key ``rid``: see ``Client.outcome``."""
        result: dict[str, Any] = self.call("outcome", {"rid": rid}, deadline=deadline)
        return result

    def probe(self, cand: Candidate, timeout: float | None = None) -> str:
        """What ``cand`` says it is: ``primary``, ``standby``, ``denied`` or ``down``."""
        conn, shake, _, _, _ = self._shake(cand, self.config.connect_timeout if timeout is None else timeout)
        if conn is not None:
            conn.close()
        if shake is None:
            return "down"
        if shake.kind == "primary":
            return "primary"
        return "standby" if shake.kind in ("redirect", "no_primary") else "denied"

    def _attempts(self, call: Call, args: dict[str, Any], end: float | None) -> Any:
        op, machine = call.op, self.machine
        retried_not_joined = False
        while True:
            conn = self._conn or self._connect(call, end)
            try:
                reply = self._request(conn, call, args, end)
            except _Lost as exc:
                self._drop(conn, str(exc))
                call.link_lost()
                call.spend(ConnectionError(f"lost connection to {conn.candidate} ({exc})"))
                continue
            call.answered()
            verdict = judge_reply(op, reply, retried_not_joined)
            if verdict.kind == "ok":
                if op == "join":
                    conn.joined = True
                    self._do(machine.joined(machine.rejoin.done(machine.rejoin.sending()),
                                            self.role, conn.candidate))
                return verdict.result
            if verdict.kind == "wrong_server":
                self._drop(conn, f"it answered {verdict.code} to {op}: it is no longer the primary",
                           redirect=verdict.extra.get("primary"), retrying=True)
                call.spend(wire.RemoteError(verdict.code, verdict.message, verdict.extra))
                continue
            if verdict.kind == "not_joined":
                retried_not_joined = True
                self._log("INFO", f"{self._name}: {conn.candidate} answered NOT_JOINED to {op}; "
                                  "re-joining, then retrying once")
                join = Call("join", f"{self._uuid}-{next(self._rids)}", call.budget)
                self._attempts(join, {"role": self.role, "attrs": self.join_attrs}, end)
                continue
            raise wire.RemoteError(verdict.code, verdict.message, verdict.extra)

    def _request(self, conn: _Conn, call: Call, args: dict[str, Any], end: float | None) -> dict[str, Any]:
        """Send one attempt of ``call`` on ``conn`` and wait for its reply."""
        n = next(conn.ids)
        msg: dict[str, Any] = {"id": n, "op": call.op, "args": args, "rid": call.rid}
        liveness = self.config.liveness_timeout
        try:
            call.sent = True
            conn.send(msg)
            while True:
                wait = liveness if end is None else min(liveness, self._left(end))
                try:
                    reply = conn.read(wait)
                except TimeoutError:
                    if end is not None and time.monotonic() >= end:
                        raise _Expired() from None
                    raise _Lost(f"no frame for {liveness:g} s with 1 request(s) outstanding: "
                                "liveness timeout") from None
                if reply.get("id") == n:
                    return reply
                # a push (the command joined after a NOT_JOINED): commands do not keep state
        except (OSError, EOFError) as exc:
            raise _Lost(describe_os_error(exc) or str(exc)) from None
        except wire.WireError as exc:
            raise _Lost(f"protocol error: {exc}") from None

    # ------------------------------------------------------------------ connecting
    def _connect(self, call: Call, end: float | None) -> _Conn:
        """Walk the candidates (passes with back-off) until a primary answers."""
        machine = self.machine
        backoff = Backoff(self.config.backoff_base, self.config.backoff_cap)
        while True:
            pass_ = machine.start_pass()
            conn = walk(pass_, lambda cand: self._dial(cand, end), self._log)
            machine.pass_over(pass_)
            if conn is not None:
                _, _, effects = machine.connected(conn.candidate, time.monotonic())
                self._do(effects)
                self._conn = conn
                machine.candidate = conn.candidate
                return conn
            refused = machine.auth_refused()
            if refused is not None:  # not an outage: say so now, do not retry
                self._do(refused[1])
                raise refused[0]
            if not call.budget.take(machine.last_error):
                raise call.give_up(call.budget.exhausted())
            delay, effects = machine.pass_failed(backoff)
            self._do(effects)
            time.sleep(delay if end is None else min(delay, max(0.0, end - time.monotonic())))
            self._left(end)

    def _dial(self, cand: Candidate, end: float | None) -> _Conn | Dialed:
        """Connect to ``cand`` and run the handshake: its connection if it is the primary."""
        limit = self.config.connect_timeout
        if end is not None:
            limit = min(limit, self._left(end))
        conn, shake, failure, timed_out, refused = self._shake(cand, limit)
        if shake is not None and shake.kind == "primary" and conn is not None:
            return conn
        if conn is not None:
            conn.close()
        if shake is None:
            return Dialed(None, failure, timed_out, refused)
        return Dialed(shake.primary, failure_of(shake),
                      refused=shake.message if shake.kind == "denied" else None,
                      takeover=shake.takeover)

    def _shake(self, cand: Candidate, limit: float) -> \
            tuple[_Conn | None, Handshake | None, str, bool, str | None]:
        """Connect and handshake within ``limit`` seconds: ``(connection, verdict, failure,
        timed out, no credential)``; the connection is open only when there is a verdict."""
        cfg = self.config
        stop = time.monotonic() + limit
        sock: _socket.socket | None = None
        try:
            sock = _connect_socket(cand, limit, plain=cfg.tls is None)
            if cfg.tls is not None:
                import socket

                from xcecore.tls import wrap_socket

                assert isinstance(sock, socket.socket)  # not plain: socket's own class
                sock = wrap_socket(sock, cfg.tls, peer=f"controller {cand}", hostname=cand.host)
            conn = _Conn(sock, cand, cfg.max_frame)
            hello = conn.read(max(0.001, stop - time.monotonic()))
            shake, answer = first_answer(hello, auth=cfg.auth, sender=cfg.sender)
            if answer is not None:
                conn.send(answer)
                status = conn.read(max(0.001, stop - time.monotonic()))
                shake = classify_handshake(status)
                who = status.get("identity")
                conn.identity = who if isinstance(who, dict) else {}
            return conn, shake, "", False, None
        except TimeoutError:
            failure = silence(limit, connected=sock is not None, tls=cfg.tls is not None)
            timed_out = True
        except TLSFailed as exc:  # a certificate refused, either way: not an outage
            if sock is not None:
                sock.close()
            return None, None, f"failed the TLS handshake: {exc}", False, f"TLS: {exc}"
        except (OSError, EOFError) as exc:
            if cfg.tls is not None and _is_ssl_error(exc):  # TLS 1.3: refused after the handshake
                from xcecore.tls import describe

                text = describe(exc, f"controller {cand}", cfg.tls)
                if sock is not None:
                    sock.close()
                return None, None, f"failed the TLS handshake: {text}", False, f"TLS: {text}"
            failure, timed_out = f"refused or closed the connection ({describe_os_error(exc) or exc})", False
        except AuthFailed as exc:  # no credential for this server (munged down, another method)
            if sock is not None:
                sock.close()
            return None, None, f"cannot authenticate ({exc})", False, str(exc)
        except Exception as exc:  # WireError, AuthError: a peer that does not speak xce
            failure, timed_out = f"broke the handshake ({exc})", False
        if sock is not None:
            sock.close()
        return None, None, failure, timed_out, None

    @staticmethod
    def _close(sock: _socket.socket | None) -> None:
        if sock is not None:
            sock.close()

    def _left(self, end: float | None) -> float:
        """Seconds left before ``end``; raises :class:`_Expired` when none."""
        if end is None:
            return float("inf")
        left = end - time.monotonic()
        if left <= 0:
            raise _Expired()
        return left

    def _drop(self, conn: _Conn, reason: str, *, redirect: object = None, retrying: bool = False) -> None:
        if conn is self._conn:
            self._conn = None
        conn.close()
        self._do(self.machine.link_lost(conn.candidate, reason, current=True, closing=False,
                                        in_flight=0 if retrying else 1, redirect=redirect,
                                        retrying=retrying, now=time.monotonic()))

    def _do(self, effects: list[Effect]) -> None:
        for effect in effects:
            if type(effect) is Log:
                self._log(effect.level, effect.text)
            # Notify / WakeRejoin / WakeBeat: a command has no observers, pushes or beats.
