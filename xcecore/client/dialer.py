"""The dialer: the candidate walk, redirects and the handshake, over an injectable ``dial``.

Pure decisions with two thin drivers. :class:`Walk` is one pass over the controller
candidates: it hands out the next candidate to dial, and, told how a dial failed, logs it and
follows a standby's redirect at once (to a listed candidate only, unless configured
otherwise; never twice to one candidate in a pass). :func:`walk` (blocking) and
:func:`walk_async` drive a walk with a ``dial(candidate)`` that does the I/O -- a plain socket
for the one-shot commands, an anyio stream for the event-loop client, an in-memory stream in
tests -- so both clients walk, redirect and log exactly alike.

The handshake's decisions live here too (:func:`first_answer`, :func:`classify_handshake`):
what the server's first message says, the one credential step (``xcecore.auth``), and what
its verdict tells the client to do. No I/O, no anyio: the one-shot commands import this.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence

from xcecore.candidates import Candidate, CandidateError, parse_address
from xcecore.schema.limits import takeover_of

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any, Literal, TypeVar

    from xcecore.auth import AuthMethod

    HandshakeKind = Literal["primary", "redirect", "no_primary", "denied", "invalid"]
    L = TypeVar("L")

# ------------------------------------------------------------------------- handshake


class Handshake(tuple["HandshakeKind", "str | None", "str | None", str, "float | None"]):
    """What a server's handshake status tells the client to do.

    ``primary``: stay. ``redirect``: go to ``primary`` at once. ``no_primary``: a standby that
    knows no primary, try the next candidate -- unless ``takeover`` is set: the standby watches
    a primary that stopped beating and expects to take over in ``takeover`` seconds, so wait
    for it (:class:`Walk`). ``denied``: the server refused us (``message``). ``invalid``: the
    status is not what the protocol says.

    A ``(kind, server, primary, message, takeover)`` tuple with named fields, written out:
    ``typing.NamedTuple`` would make the one-shot commands import ``typing``.
    """

    __slots__ = ()

    def __new__(cls, kind: HandshakeKind, server: str | None = None, primary: str | None = None,
                message: str = "", takeover: float | None = None) -> Handshake:
        return super().__new__(cls, (kind, server, primary, message, takeover))

    @property
    def kind(self) -> HandshakeKind:
        return self[0]

    @property
    def server(self) -> str | None:
        return self[1]

    @property
    def primary(self) -> str | None:
        return self[2]

    @property
    def message(self) -> str:
        return self[3]

    @property
    def takeover(self) -> float | None:
        return self[4]

    def __repr__(self) -> str:
        return (f"Handshake(kind={self[0]!r}, server={self[1]!r}, primary={self[2]!r}, "
                f"message={self[3]!r}, takeover={self[4]!r})")


def hello_hint(hello: dict[str, Any]) -> Handshake | None:
    """What a server's first message already says: a standby names its primary there, so a
    client need not authenticate to be redirected (None: answer the challenge as usual)."""
    if hello.get("state") != "standby":
        return None
    return classify_handshake({**hello, "ok": True})


def classify_handshake(status: dict[str, Any]) -> Handshake:
    """Classify the server's third handshake message (see docs/protocol.md, "Handshake")."""
    if status.get("ok") is not True:
        err = status.get("error")
        message = err.get("message", "") if isinstance(err, dict) else ""
        code = err.get("code", "?") if isinstance(err, dict) else "?"
        if code == "AUTH" and message:  # it says "authentication failed: ..." itself
            return Handshake("denied", message=message)
        return Handshake("denied", message=f"{code}: {message}" if message else str(code))
    server = status.get("server")
    server = server if isinstance(server, str) else None
    state = status.get("state")
    if state == "primary":
        return Handshake("primary", server=server)
    if state == "standby":
        primary = status.get("primary")
        if isinstance(primary, str) and primary:
            return Handshake("redirect", server=server, primary=primary)
        return Handshake("no_primary", server=server, takeover=takeover_of(status))
    return Handshake("invalid", server=server, message=f"unknown server state {state!r}")


def first_answer(hello: dict[str, Any], *, auth: AuthMethod, sender: str) -> \
        tuple[Handshake | None, dict[str, Any] | None]:
    """The client's move after the server's hello: ``(verdict, None)`` when the hello already
    says where to go (a standby), else ``(None, answer)`` -- the credential to send.

    The credential step is :func:`xcecore.auth.client_answer` with the configured method, the
    one both clients use. Raises :class:`xcecore.auth.AuthError` on a protocol mismatch and
    :class:`xcecore.auth.AuthFailed` when no credential can be made for this server.
    """
    hint = hello_hint(hello)
    if hint is not None:
        return hint, None
    from xcecore.auth import client_answer

    return None, client_answer(auth, sender, hello)


def describe_os_error(exc: BaseException) -> str | None:
    """A short operator-facing cause ("connection refused") from an ``OSError`` found in
    ``exc`` or its causes (libraries wrap it), or None if there is none."""
    import os

    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno:
            if seen.errno < 0:  # a name-lookup error (gaierror): os.strerror does not know it
                return (seen.strerror or str(seen)).lower()
            return os.strerror(seen.errno).lower()
        seen = seen.__cause__ or seen.__context__
    return None


def silence(limit: float, *, connected: bool, tls: bool) -> str:
    """Why a candidate gave us nothing within ``limit`` seconds, for the log and the error.

    A candidate that accepted the connection but sent no hello is hung or overloaded -- or
    it has ``[tls]`` set while this client has not: a TLS candidate waits for the client's
    TLS hello, a plain client for the candidate's hello, so neither says anything (the other
    way round is named at once: the TLS client reads a plain hello).
    """
    if not connected:
        return f"did not accept the connection within {limit:.3g} s"
    if tls:
        return f"accepted the connection but did not finish the handshake within {limit:.3g} s"
    return (f"accepted the connection but sent no hello within {limit:.3g} s (hung, "
            "overloaded, or it has [tls] set and this client has not)")


def failure_of(shake: Handshake) -> str:
    """Why a handshake that is not ``primary`` did not give us a link, for the log."""
    if shake.kind == "no_primary" and shake.takeover is not None:
        return (f"is a standby taking over from a primary that stopped beating in "
                f"{shake.takeover * 1000:.0f} ms")
    return {
        "redirect": f"is a standby; primary is {shake.primary}",
        "no_primary": "is a standby that knows no primary",
        "denied": f"refused the handshake: {shake.message}",
    }.get(shake.kind, f"broke the handshake ({shake.message})")


# -------------------------------------------------------------------- candidate order


def resolve_redirect(
    primary: str, candidates: Sequence[Candidate], allow_unlisted: bool
) -> tuple[Candidate | None, str]:
    """Where a redirect to ``primary`` may go: ``(candidate, "")`` or ``(None, why not)``."""
    try:
        target = parse_address(primary)
    except CandidateError as exc:
        return None, f"the redirect names a malformed address ({exc})"
    if target in candidates or allow_unlisted:
        return target, ""
    return None, (
        f"{target} is not a listed candidate "
        "(set cluster.allow_unlisted_redirect = true to follow such redirects)"
    )


def candidate_order(
    candidates: Sequence[Candidate], first: Candidate | None, lost: Candidate | None = None
) -> list[Candidate]:
    """The candidates in configured order, rotated to start at ``first`` (the last that worked).

    An unlisted ``first`` (a followed unlisted redirect) is tried first, then the whole list.
    ``lost``, the candidate whose connection just died, goes last: it is most likely the dead
    primary, and a dead host costs a whole connect timeout, while a live one is reached through
    a standby's redirect at the price of one short connection.
    """
    if first is None:
        order = list(candidates)
    elif first in candidates:
        i = list(candidates).index(first)
        order = [*candidates[i:], *candidates[:i]]
    else:
        order = [first, *candidates]
    if lost is not None and lost in order:
        order.remove(lost)
        order.append(lost)
    return order


# ----------------------------------------------------------------------------- the walk

class Dialed:
    """Why dialing one candidate gave no link (a dial that reaches the primary returns the
    link itself: :func:`walk`).

    ``redirect`` is the primary a standby named; ``failure`` says what went wrong, for the
    log; ``timed_out``: the candidate did not finish the handshake within the connect timeout
    (it is busy); ``refused``: the candidate refused our credential or claim (its words);
    ``takeover``: a standby expects to take over in this many seconds.
    """

    __slots__ = ("failure", "redirect", "refused", "takeover", "timed_out")

    def __init__(self, redirect: str | None = None, failure: str = "", timed_out: bool = False,
                 refused: str | None = None, takeover: float | None = None) -> None:
        self.redirect = redirect
        self.failure = failure
        self.timed_out = timed_out
        self.refused = refused
        self.takeover = takeover

    def __repr__(self) -> str:
        return (f"Dialed(redirect={self.redirect!r}, failure={self.failure!r}, "
                f"timed_out={self.timed_out!r}, refused={self.refused!r}, takeover={self.takeover!r})")


TAKEOVER_MIN_WAIT = 0.01
"""The shortest wait for a standby that takes over ("0 ms": the fence is under way)."""
TAKEOVER_RECHECK = 0.5
"""The longest wait for a standby's takeover before asking it again: a primary that resumes
beating meanwhile is found at most this late, and a wrong or hostile promise costs no more."""


def takeover_wait(seconds: float) -> float:
    """How long to wait for a standby that promised to take over in ``seconds``."""
    return min(max(seconds, TAKEOVER_MIN_WAIT), TAKEOVER_RECHECK)


class Walk:
    """One pass over the candidates in ``order``, following redirects.

    Iterate it for the candidates to dial; after each failed dial, call :meth:`failed` and
    log what it returns. ``last_error`` is the last failure, ``failures`` every candidate's
    (for the give-up message),
    ``timed_out`` whether some candidate was too busy to finish its handshake, ``takeover``
    the standby that promised to take over from a hung primary, and in how many seconds: the
    pass ends there (the other standbys watch the same primary, and the hung primary would only
    time out), and the machine waits for that standby instead of backing off.
    """

    def __init__(self, order: Sequence[Candidate], candidates: Sequence[Candidate], *,
                 allow_unlisted: bool, name: str) -> None:
        self._queue = deque(order)
        self.candidates = tuple(candidates)
        self.allow_unlisted = allow_unlisted
        self.name = name
        self.tried: set[Candidate] = set()
        self.failures: list[tuple[Candidate, str]] = []  # what each failed dial met, in order
        self.last_error: BaseException | None = None
        self.timed_out = False
        self.refused: tuple[Candidate, str] | None = None
        self.takeover: tuple[Candidate, float] | None = None
        self._redirect: Candidate | None = None

    def __iter__(self) -> Iterator[Candidate]:
        return self

    def __next__(self) -> Candidate:
        target, self._redirect = self._redirect, None
        while target is None or target in self.tried:
            if not self._queue:
                raise StopIteration
            target = self._queue.popleft()
        self.tried.add(target)
        return target

    def failed(self, cand: Candidate, dialed: Dialed) -> tuple[str, str]:
        """``cand`` did not give a link: record it, choose the redirect; the ``(level, line)``
        to log."""
        self.last_error = ConnectionError(f"{cand} {dialed.failure}")
        self.failures.append((cand, str(dialed.failure)))
        self.timed_out = self.timed_out or dialed.timed_out
        if dialed.refused is not None:
            # Not an outage: the machine reports it once (Machine.auth_refused), not per dial.
            self.refused = (cand, dialed.refused)
            return "DEBUG", f"{self.name}: candidate {cand} {dialed.failure}; trying the next candidate"
        if dialed.takeover is not None and dialed.redirect is None:
            self.takeover = (cand, dialed.takeover)
            self._queue.clear()
            # DEBUG: the machine says it once per takeover (Machine.pass_failed).
            return "DEBUG", (f"{self.name}: candidate {cand} {dialed.failure}; waiting for it "
                             "(not dialing the hung primary)")
        primary = dialed.redirect
        if primary is None:
            return "WARNING", f"{self.name}: candidate {cand} {dialed.failure}; trying the next candidate"
        target, why = resolve_redirect(primary, self.candidates, self.allow_unlisted)
        if target is None:
            self.last_error = ConnectionError(f"{cand} redirected to unlisted {primary}")
            self.failures[-1] = (cand, f"redirected to unlisted {primary}")
            return "WARNING", (f"{self.name}: candidate {cand} is a standby redirecting to "
                               f"{primary}, not followed: {why}")
        if target in self.tried:
            return "WARNING", (f"{self.name}: candidate {cand} is a standby redirecting to "
                               f"{target}, already tried in this pass; going on")
        self._redirect = target
        return "WARNING", f"{self.name}: candidate {cand} is a standby, following redirect to {target}"


Logger = Callable[[str, str], None]
"""``log(level, line)``: how a driver reports each failed dial."""


def walk(pass_: Walk, dial: Callable[[Candidate], L | Dialed], log: Logger) -> L | None:
    """Drive ``pass_`` with a blocking ``dial`` (the primary's link, or a :class:`Dialed`
    saying why not): the primary's link, or None."""
    for cand in pass_:
        dialed = dial(cand)
        if not isinstance(dialed, Dialed):
            return dialed
        log(*pass_.failed(cand, dialed))
    return None


async def walk_async(pass_: Walk, dial: Callable[[Candidate], Awaitable[L | Dialed]],
                     log: Logger) -> L | None:
    """Drive ``pass_`` with an async ``dial`` (as :func:`walk`'s): the primary's link, or None."""
    for cand in pass_:
        dialed = await dial(cand)
        if not isinstance(dialed, Dialed):
            return dialed
        log(*pass_.failed(cand, dialed))
    return None
