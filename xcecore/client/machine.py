"""The client's state machine: events in, effects out; no I/O, no anyio, no clock of its own.

Both shells drive it -- the event-loop :class:`~xcecore.client.asyncclient.Client` and the
blocking :class:`~xcecore.client.oneshot.OneShotClient` -- and perform what it returns:

- **connection state** (:data:`STATES`) and the queue of changes the observers are still to
  hear (:class:`StateQueue`);
- **candidate bookkeeping**: which candidate worked last, which one a redirect named, which
  one was just lost (tried last, see :mod:`xcecore.client.dialer`);
- **the rejoin record** (:class:`Rejoin`): is a re-join pending, which requests has a join
  already answered, did heartbeats fail;
- **a call's bookkeeping** (:class:`Call`): its idempotency key, its retry budget, whether a
  send of it is unanswered -- which decides, when it gives up, between
  :class:`~xcecore.client.errors.BackendUnavailable` and
  :class:`~xcecore.client.errors.OutcomeUnknown`;
- **what a reply, a lost link, a failed pass, a heartbeat or a push means**.

Effects are plain records (:class:`Log`, :class:`Notify`, :class:`WakeRejoin`,
:class:`WakeBeat`); every operator-facing log line of the client is written here once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from xcecore.candidates import Candidate
from xcecore.client.backoff import Backoff
from xcecore.client.dialer import Walk, candidate_order, resolve_redirect, takeover_wait
from xcecore.client.errors import AuthenticationFailed, BackendUnavailable, OutcomeUnknown
from xcecore.protocol import KEYED_WRITES
from xcecore.wire import ErrorCode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

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
NOT_JOINED = ErrorCode.NOT_JOINED.value
INTERNAL = ErrorCode.INTERNAL.value


# ----------------------------------------------------------------------------- effects


# Log, WakeRejoin and Verdict are tuples with named fields, written out: ``typing.NamedTuple``
# would make every one-shot command import ``typing`` (~7 ms of its start-up).


class Log(tuple[str, str]):
    """Write ``text`` to the log at ``level`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``)."""

    __slots__ = ()

    def __new__(cls, level: str, text: str) -> Log:
        return super().__new__(cls, (level, text))

    @property
    def level(self) -> str:
        return self[0]

    @property
    def text(self) -> str:
        return self[1]

    def __repr__(self) -> str:
        return f"Log(level={self[0]!r}, text={self[1]!r})"


class Notify:
    """Wake the observer task: a state change is queued in :attr:`Machine.states`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTIFY"


class WakeRejoin(tuple[str]):
    """Re-join in the background (the rejoin task), for ``reason``."""

    __slots__ = ()

    def __new__(cls, reason: str) -> WakeRejoin:
        return super().__new__(cls, (reason,))

    @property
    def reason(self) -> str:
        return self[0]

    def __repr__(self) -> str:
        return f"WakeRejoin(reason={self[0]!r})"


class WakeBeat:
    """Wake the heartbeat task now (the link dropped: try to reconnect at once)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "WAKE_BEAT"


Effect = Log | Notify | WakeRejoin | WakeBeat
NOTIFY = Notify()
"""The one :class:`Notify` (effects without data are singletons, compared by identity)."""
WAKE_BEAT = WakeBeat()
"""The one :class:`WakeBeat`."""


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


# ----------------------------------------------------------------------- the records


class Rejoin:
    """Everything the client knows about re-joining, in one record.

    ``pending``: a re-join is due at the next rejoin point (the post-call path reads only
    this). ``asks`` counts requests for a re-join (:meth:`ask`); ``answered`` is how many of
    them a completed join covers (a join answers every request made before it was sent), so
    two racing re-joins send one join. ``joins`` counts completed joins (on any connection);
    ``joined_once`` is whether this client is a member at all (heartbeats are a member's);
    ``beats_failing`` whether the last heartbeat failed (their recovery re-joins).
    """

    __slots__ = ("answered", "asks", "beats_failing", "joined_once", "joins", "pending")

    def __init__(self) -> None:
        self.pending = False
        self.asks = 0
        self.answered = 0
        self.joins = 0
        self.joined_once = False
        self.beats_failing = False

    def ask(self) -> None:
        """Record that a re-join is needed (``xce_reconnected``, a push gap, a refused join)."""
        self.asks += 1
        self.pending = True

    def sending(self) -> int:
        """A join is being sent: it resends the whole state, so nothing stays pending.

        Returns the requests it answers once it succeeds (pass them to :meth:`done`).
        """
        self.pending = False
        return self.asks

    def done(self, asked: int) -> bool:
        """A join answered the requests made before ``asked``; True if it was a re-join."""
        again = self.joined_once
        self.answered = max(self.answered, asked)
        self.joined_once = True
        return again

    def covered(self, link_joined: bool, want: int | None) -> bool:
        """Does a completed join on the live link already answer ``want`` requests?

        ``want`` None: any join on this link will do (a heartbeat's recovery).
        """
        return link_joined and (want is None or self.answered >= want)


class Budget:
    """A logical operation's retry budget (None: unbounded) and the last error it saw."""

    __slots__ = ("last_error", "left", "total")

    def __init__(self, retries: int | None) -> None:
        if retries is not None and retries < 0:
            raise ValueError(f"retry_budget must be >= 0, got {retries}")
        self.total = retries
        self.left = retries
        self.last_error: BaseException | None = None

    def take(self, error: BaseException | None) -> bool:
        """Charge one retry for ``error``; False when none was left."""
        if error is not None:
            self.last_error = error
        if self.left is None:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def exhausted(self) -> str:
        """Why the budget gave up, for the error message."""
        return f"retry budget of {self.total} exhausted (last error: {self.last_error})"


class Call:
    """One logical call: op, idempotency key, budget, and whether a send of it is unanswered.

    ``keyed``: the op is a keyed write (:data:`xcecore.protocol.KEYED_WRITES`), whose lost
    reply is an unknown outcome. ``sent``: the current attempt's frame has gone (at least
    partly) out and no reply came yet; ``unanswered``: an earlier attempt's reply was lost with
    its link. Only a keyed write that was sent and never answered gives up with
    :class:`OutcomeUnknown`; anything else with :class:`BackendUnavailable`.
    """

    __slots__ = ("budget", "keyed", "op", "rid", "sent", "unanswered")

    def __init__(self, op: str, rid: str, budget: Budget) -> None:
        self.op = op
        self.rid = rid
        self.budget = budget
        self.keyed = op in KEYED_WRITES
        self.sent = False
        self.unanswered = False

    @property
    def outcome_unknown(self) -> bool:
        """Would giving up now leave the caller unsure whether the op was applied?"""
        return self.keyed and (self.sent or self.unanswered)

    def link_lost(self) -> None:
        """The link died before this attempt's reply arrived."""
        if self.sent:
            self.unanswered = True
        self.sent = False

    def answered(self) -> None:
        """A reply to this attempt arrived (any reply)."""
        self.sent = False

    def spend(self, error: BaseException | None) -> None:
        """Charge a retry; raise the give-up error when the budget is spent."""
        if not self.budget.take(error):
            raise self.give_up(self.budget.exhausted())

    def give_up(self, why: str) -> BackendUnavailable | OutcomeUnknown:
        """The error to raise now that the call stops trying (deadline or budget)."""
        last = self.budget.last_error
        if self.outcome_unknown:
            return OutcomeUnknown(
                f"{self.op}: outcome unknown, the reply was lost ({why}); its idempotency key "
                f"{self.rid} tells whether it was applied (outcome), and a retry with that "
                "key is applied at most once", rid=self.rid, op=self.op, last_error=last)
        return BackendUnavailable(why, last)


# ------------------------------------------------------------------------ reply verdicts


_NO_EXTRA: dict[str, Any] = {}  # never mutated


class Verdict(tuple[str, "Any", str, str, "dict[str, Any]"]):
    """What a reply means for its call: ``ok`` (``result``), ``wrong_server`` (reconnect and
    retry: ``code``, ``message``, ``extra``), ``not_joined`` (join, then retry once) or
    ``error`` (raise a RemoteError)."""

    __slots__ = ()

    def __new__(cls, kind: str, result: Any = None, code: str = "", message: str = "",
                extra: dict[str, Any] = _NO_EXTRA) -> Verdict:
        return super().__new__(cls, (kind, result, code, message, extra))

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def result(self) -> Any:
        return self[1]

    @property
    def code(self) -> str:
        return self[2]

    @property
    def message(self) -> str:
        return self[3]

    @property
    def extra(self) -> dict[str, Any]:
        return self[4]

    def __repr__(self) -> str:
        return (f"Verdict(kind={self[0]!r}, result={self[1]!r}, code={self[2]!r}, "
                f"message={self[3]!r}, extra={self[4]!r})")


def reply_error(reply: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(code, message, extra fields)`` of an error reply, tolerant of a sloppy peer."""
    err = reply.get("error")
    if not isinstance(err, dict):
        return INTERNAL, f"malformed error reply: {reply!r:.200}", {}
    code = err.get("code")
    message = err.get("message")
    extra = {k: v for k, v in err.items() if k not in ("code", "message")}
    return (
        code if isinstance(code, str) else INTERNAL,
        message if isinstance(message, str) else "",
        extra,
    )


def judge_reply(op: str, reply: dict[str, Any], retried_not_joined: bool) -> Verdict:
    """The verdict on ``reply`` to ``op`` (``retried_not_joined``: NOT_JOINED came once)."""
    if reply.get("ok") is True:
        return Verdict("ok", reply.get("result"))
    code, message, extra = reply_error(reply)
    if code in WRONG_SERVER:
        return Verdict("wrong_server", None, code, message, extra)
    if code == NOT_JOINED and op != "join" and not retried_not_joined:
        return Verdict("not_joined", None, code, message, extra)
    return Verdict("error", None, code, message, extra)


def seq_gap(expected: int, seq: int) -> int:
    """How many pushes were missed before ``seq`` (0: in order; negative: a replay/reorder)."""
    return seq - expected


def liveness_expired(now: float, last_rx: float, owed_since: float | None, timeout: float) -> bool:
    """True when a frame is owed (``owed_since`` is set) and none came for ``timeout`` seconds.

    The clock starts at the later of the last received frame and the moment a reply became
    owed, so an idle link is never declared dead by its first request.
    """
    if owed_since is None:
        return False
    return now - max(last_rx, owed_since) >= timeout


# --------------------------------------------------------------------------- the machine


class Machine:
    """One client's connection state and the decisions on it (see the module docstring).

    ``name`` prefixes every log line (``xce client scheduler@h1``). Times are the shell's
    clock (seconds, any origin), passed in with the events that need them.
    """

    def __init__(self, candidates: Sequence[Candidate], *, name: str, allow_unlisted: bool,
                 connect_timeout: float) -> None:
        self.candidates = tuple(candidates)
        self.name = name
        self.allow_unlisted = allow_unlisted
        self.connect_timeout = connect_timeout
        self.state = CLOSED
        self.candidate: Candidate | None = None  # the live primary's, once published
        self.ever_connected = False
        self.last_good: Candidate | None = None
        self.preferred: Candidate | None = None  # a primary named by a REDIRECT reply
        self.lost: Candidate | None = None  # whose link died; tried last until one works
        self.lost_at: float | None = None
        self.last_error: BaseException | None = None
        self.walk: Walk | None = None  # the pass under way or last made, while no primary
        self.last_pass: tuple[tuple[Candidate, str], ...] = ()  # the last ended pass's failures
        self.pass_timed_out = False  # a candidate of the last pass timed out: it is busy
        self.refused: tuple[Candidate, str] | None = None  # the last pass's refusal, if any
        self.takeover: tuple[Candidate, float] | None = None  # the last pass's takeover promise
        self.takeover_told: Candidate | None = None  # whose takeover wait was logged
        self.refusal_told = ""  # the refusal last logged (logged once until it changes)
        self.rejoin = Rejoin()
        self.states = StateQueue()

    # ------------------------------------------------------------------ state
    def set_state(self, state: str, candidate: Candidate | None, detail: str) -> list[Effect]:
        """Enter ``state``; observers hear of it unless it is a repeat (a re-join always is news)."""
        if state == self.state and state != REJOINED:
            return []
        self.state = state
        self.states.put(state, candidate, detail)
        return [NOTIFY]

    # ------------------------------------------------------------------ connecting
    def start_pass(self) -> Walk:
        """Plan one walk over the candidates: from a redirect's target, else the last that
        worked; the candidate just lost last (unless a redirect named the way)."""
        preferred = self.preferred
        order = candidate_order(self.candidates, preferred or self.last_good,
                                None if preferred else self.lost)
        self.preferred = None
        self.pass_timed_out = False
        self.walk = Walk(order, self.candidates, allow_unlisted=self.allow_unlisted, name=self.name)
        return self.walk

    def pass_over(self, walk: Walk) -> None:
        """Take what a finished walk learnt (its last error, whether a candidate was busy)."""
        if walk.last_error is not None:
            self.last_error = walk.last_error
        self.last_pass = tuple(walk.failures)
        self.pass_timed_out = self.pass_timed_out or walk.timed_out
        self.refused = walk.refused
        self.takeover = walk.takeover
        if walk.takeover is not None:  # the next pass, a call's or a heartbeat's, starts there
            self.preferred = walk.takeover[0]

    def auth_refused(self) -> tuple[AuthenticationFailed, list[Effect]] | None:
        """After a pass that found no primary: the error to raise at once if a candidate
        refused our credential or claim (not an outage: no back-off, no retry), and the
        effects. The refusal is logged once, and again only when its words change."""
        if self.refused is None:
            return None
        cand, words = self.refused
        effects: list[Effect] = []
        if words != self.refusal_told:
            self.refusal_told = words
            effects.append(Log("ERROR", f"{self.name}: {cand} refused the handshake: {words}; "
                                        "not retrying this call (a member's heartbeat tries "
                                        "again each interval)"))
        effects += self.set_state(DEGRADED, None, words)
        return AuthenticationFailed(f"{words} (controller {cand})", cand), effects

    def pass_failed(self, backoff: Backoff) -> tuple[float, list[Effect]]:
        """A whole pass found no primary: the back-off delay before the next one, and effects.

        A pass in which a candidate timed out met a live but busy controller: the next draw
        is spread over a connect timeout at least, not re-queued within ``backoff_base``.
        A pass that ended at a standby promising to take over from a hung primary waits as
        long as it said (:func:`~xcecore.client.dialer.takeover_wait`), and the next pass
        starts at that standby: no back-off draw, so the client is there when it promotes.
        """
        if self.takeover is not None:
            cand, seconds = self.takeover
            delay = takeover_wait(seconds)
            level = "DEBUG" if cand == self.takeover_told else "WARNING"  # once per takeover
            self.takeover_told = cand
            return delay, [*self.set_state(DEGRADED, None, f"{cand} is taking over from a hung primary"),
                           Log(level, (
                               f"{self.name}: no primary: {cand} takes over from a primary that "
                               f"stopped beating in {seconds * 1000:.0f} ms; next pass in "
                               f"{delay * 1000:.0f} ms, starting there (not dialing the hung "
                               "primary)"))]
        self.takeover_told = None
        delay = backoff.next_delay(self.connect_timeout if self.pass_timed_out else 0.0)
        effects: list[Effect] = []
        if backoff.failures == 1:
            effects += self.set_state(DEGRADED, None, "no controller candidate is primary")
        effects.append(Log("WARNING", (
            f"{self.name}: no primary among {', '.join(map(str, self.candidates))} "
            f"({self.last_error}); next pass in {delay * 1000:.0f} ms")))
        return delay, effects

    def beat_delay(self, quick: Backoff, down: bool, interval: float) -> float:
        """How long the heartbeat task waits before its next beat.

        Up: the heartbeat ``interval``. Down (each beat is a best-effort reconnect pass): the
        wait a standby's takeover promise asks for, else the next draw of ``quick`` (growing
        to the interval; spread over a connect timeout after a pass that met a busy
        candidate, as the call path does).
        """
        if not down:
            quick.reset()
            return interval
        if self.takeover is not None:
            return takeover_wait(self.takeover[1])
        return quick.next_delay(self.connect_timeout if self.pass_timed_out else 0.0)

    def reached(self, candidate: Candidate) -> None:
        """A pass reached the primary at ``candidate``."""
        self.walk, self.last_pass = None, ()  # no longer why there is no primary
        self.last_good = candidate
        self.lost = None
        self.takeover_told = None

    def since_lost(self, now: float) -> str:
        """How long the client has been without a link, for the log."""
        if self.lost_at is None:
            return "an unknown time"
        return f"{(now - self.lost_at) * 1000:.0f} ms"

    def connected(self, candidate: Candidate, now: float) -> tuple[bool, str, list[Effect]]:
        """The failover's pass reached ``candidate``: ``(first connect, how long it took,
        effects)``. A RE-connect then runs ``xce_reconnected`` (the shell's part) and logs
        :meth:`reconnected_line` after it, when it knows whether a rejoin is pending."""
        self.reached(candidate)
        effects = self._accepted()
        if not self.ever_connected:
            self.ever_connected = True
            return True, "", [*effects, Log("INFO", f"{self.name}: connected to {candidate} (primary)")]
        return False, self.since_lost(now), effects

    def _accepted(self) -> list[Effect]:
        """A handshake was accepted: a refusal logged before is over."""
        if not self.refusal_told:
            return []
        self.refusal_told = ""
        return [Log("INFO", f"{self.name}: the controller accepts this client's credential again")]

    def reconnected_line(self, candidate: Candidate, took: str) -> Log:
        """The log line of a re-connect, after the reconnect hook ran."""
        pending = "; rejoin pending" if self.rejoin.pending else ""
        return Log("INFO", f"{self.name}: reconnected to {candidate} after {took}{pending}")

    def heartbeat_reconnected(self, candidate: Candidate, now: float) -> tuple[str, list[Effect]]:
        """The heartbeat's own pass reached ``candidate`` (no hook, no back-off)."""
        self.reached(candidate)
        took = self.since_lost(now)
        effects: list[Effect] = [*self._accepted(), Log(
            "INFO", f"{self.name}: heartbeat reconnected to {candidate} after {took}")]
        return f"reconnected by heartbeat after {took}", effects

    # ------------------------------------------------------------------ losing a link
    def link_lost(self, candidate: Candidate, reason: str, *, current: bool, closing: bool,
                  in_flight: int, redirect: object = None, retrying: bool = False,
                  now: float = 0.0) -> list[Effect]:
        """A link died (``in_flight`` requests failed with it). ``current``: it was the live
        one; ``redirect``: the primary a REDIRECT reply named (go there next)."""
        if isinstance(redirect, str):
            target, _ = resolve_redirect(redirect, self.candidates, self.allow_unlisted)
            self.preferred = target
        elif current:
            self.lost = candidate
        if not current or closing:
            return []
        self.lost_at = now
        nxt = ("reconnecting" if retrying and not in_flight
               else f"reconnecting ({in_flight} request(s) in flight)" if in_flight
               else "will reconnect on the next call or heartbeat")
        effects: list[Effect] = [
            Log("WARNING", f"{self.name}: lost connection to {candidate} ({reason}); {nxt}")]
        effects += self.set_state(RECONNECTING, candidate, reason)
        effects.append(WAKE_BEAT)
        return effects

    # ------------------------------------------------------------------ giving up
    def gave_up(self, what: str, exc: BaseException) -> list[Effect]:
        """A call or connect ran out of deadline or budget with ``exc``."""
        return [Log("WARNING", f"{self.name}: giving up on {what}: {exc}"),
                *self.set_state(DEGRADED, self.candidate, f"{what}: {exc}")]

    def no_primary(self, budget: Budget) -> str:
        """Why no primary answered, for a give-up message: what each candidate of the last
        pass met (``127.0.0.1:7001 refused or closed the connection (connection refused);
        ...``), else the last error the call saw."""
        # The pass under way, and the last one's for candidates it had not dialed yet when
        # the deadline cut it short.
        failures = dict(self.last_pass)
        failures.update(self.walk.failures if self.walk is not None else ())
        if failures:
            return "last pass: " + "; ".join(f"{c} {why}" for c, why in failures.items())
        if budget.last_error is not None:
            return f"last error: {budget.last_error}"
        return "no candidate answered before the deadline"

    def deadline_error(self, what: str, deadline: float, call: Call | None,
                       budget: Budget) -> BackendUnavailable | OutcomeUnknown:
        """The error for ``what`` whose ``deadline`` (seconds) passed."""
        why = f"{what}: no primary within the deadline of {deadline:g} s ({self.no_primary(budget)})"
        if call is None:
            return BackendUnavailable(why, budget.last_error)
        return call.give_up(why)

    # ------------------------------------------------------------------ joins
    def joined(self, again: bool, role: str, where: Candidate | None) -> list[Effect]:
        """A join as ``role`` succeeded on ``where`` (``again``: a re-join)."""
        if again:
            return [Log("INFO", f"{self.name}: re-joined as {role} on {where}"),
                    *self.set_state(REJOINED, where, f"re-joined as {role}")]
        return [Log("INFO", f"{self.name}: joined as {role} on {where}")]

    # ------------------------------------------------------------------ heartbeats
    def beat_reconnected(self, link_joined: bool) -> list[Effect]:
        """A heartbeat's pass reached the primary on a fresh link.

        A fresh connection to the primary is its own proof of life, and a member's beat there
        would only earn NOT_JOINED: re-join at once (one round trip less per member in a
        re-join storm). Returns the effects; the beat itself is skipped when there are any.
        """
        rj = self.rejoin
        if rj.joined_once and not link_joined:
            rj.beats_failing = False
            return [WakeRejoin("heartbeats recovered")]
        return []

    def beat_answered(self, code: str, link_joined: bool, recovered: bool) -> list[Effect]:
        """A heartbeat got an answer (``code`` "" when ok): does it re-join the member?"""
        rj = self.rejoin
        recovered = recovered or rj.beats_failing
        rj.beats_failing = False
        if rj.joined_once and not link_joined and (recovered or code == NOT_JOINED):
            return [WakeRejoin("heartbeats recovered")]
        return []

    # ------------------------------------------------------------------ pushes
    def push_arrived(self, candidate: Candidate, expected: int, seq: int) -> list[Effect]:
        """A push with ``seq`` arrived where ``expected`` was next: a gap re-joins."""
        if not seq_gap(expected, seq):
            return []
        self.rejoin.ask()
        return [Log("WARNING", f"{self.name}: push sequence gap from {candidate}: expected seq "
                               f"{expected}, got {seq}; state may be stale, re-joining for a full state"),
                WakeRejoin(f"push seq gap ({expected} -> {seq})")]
