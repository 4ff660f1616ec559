"""The connection manager's decisions, as pure functions with no I/O.

:mod:`xcecore.connection` is a thin I/O shell around these: what a handshake status means,
where a redirect may lead, in which order to walk the candidates, what an error reply asks the
client to do, whether a push arrived in sequence, when a silent link counts as dead, and which
state changes are still to be told to observers. Each is testable without a socket.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xcecore.candidates import Candidate, CandidateError, parse_address
from xcecore.wire import ErrorCode

# ----------------------------------------------------------------------------- states

CONNECTING = "connecting"
CONNECTED = "connected"
RECONNECTING = "reconnecting"
REJOINED = "rejoined"
DEGRADED = "degraded"
CLOSED = "closed"
STATES = (CONNECTING, CONNECTED, RECONNECTING, REJOINED, DEGRADED, CLOSED)
"""Every value of ``Client.state`` and of the ``xce_connection_state`` hook's ``state``."""

WRONG_SERVER = frozenset({ErrorCode.REDIRECT.value, ErrorCode.NO_PRIMARY.value})
"""Error codes that mean "this candidate is not the primary": reconnect and retry."""


# ------------------------------------------------------------------------- handshake

HandshakeKind = Literal["primary", "redirect", "no_primary", "denied", "invalid"]


@dataclass(frozen=True, slots=True)
class Handshake:
    """What a server's handshake status tells the client to do.

    ``primary``: stay. ``redirect``: go to ``primary`` at once. ``no_primary``: a standby that
    knows no primary, try the next candidate. ``denied``: the server refused us (``message``).
    ``invalid``: the status is not what the protocol says.
    """

    kind: HandshakeKind
    server: str | None = None
    primary: str | None = None
    message: str = ""


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
        return Handshake("no_primary", server=server)
    return Handshake("invalid", server=server, message=f"unknown server state {state!r}")


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


# ---------------------------------------------------------------------------- replies


def reply_error(reply: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(code, message, extra fields)`` of an error reply, tolerant of a sloppy peer."""
    err = reply.get("error")
    if not isinstance(err, dict):
        return ErrorCode.INTERNAL.value, f"malformed error reply: {reply!r:.200}", {}
    code = err.get("code")
    message = err.get("message")
    extra = {k: v for k, v in err.items() if k not in ("code", "message")}
    return (
        code if isinstance(code, str) else ErrorCode.INTERNAL.value,
        message if isinstance(message, str) else "",
        extra,
    )


# ------------------------------------------------------------------------------ pushes


def seq_gap(expected: int, seq: int) -> int:
    """How many pushes were missed before ``seq`` (0: in order; negative: a replay/reorder)."""
    return seq - expected


# ---------------------------------------------------------------------------- liveness


def liveness_expired(now: float, last_rx: float, owed_since: float | None, timeout: float) -> bool:
    """True when a frame is owed (``owed_since`` is set) and none came for ``timeout`` seconds.

    The clock starts at the later of the last received frame and the moment a reply became
    owed, so an idle link is never declared dead by its first request.
    """
    if owed_since is None:
        return False
    return now - max(last_rx, owed_since) >= timeout


# --------------------------------------------------------------------- state observers

StateChange = tuple[str, Candidate | None, str]


class StateQueue:
    """State changes waiting for the observer task: bounded, and coalescing when it lags.

    A repeat of the newest queued state replaces it (only its detail and candidate change);
    past ``limit`` entries the oldest is dropped, so a stalled observer costs bounded memory
    and still hears the latest state. ``dropped`` counts what was lost that way.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self.dropped = 0
        self._items: deque[StateChange] = deque()

    def put(self, state: str, candidate: Candidate | None, detail: str) -> None:
        """Queue one change."""
        if self._items and self._items[-1][0] == state:
            self._items[-1] = (state, candidate, detail)
            return
        if len(self._items) >= self.limit:
            self._items.popleft()
            self.dropped += 1
        self._items.append((state, candidate, detail))

    def take(self) -> list[StateChange]:
        """Remove and return every queued change, oldest first."""
        items = list(self._items)
        self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)
