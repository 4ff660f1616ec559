"""Whether the backend (the controller) is usable: the API server's circuit breaker.

The breaker follows the core client's link to the primary, which the client's heartbeats
keep probing; it never waits for a write to find out:

- **closed** while the client has a live link to a primary;
- **grace** for ``grace`` seconds after the link was lost (a failover normally reconnects
  in tens of milliseconds): a write waits, at most that long, for the client to reconnect;
- **open** once the link has been down longer than the grace, or at once when it was lost to
  the liveness timeout (the primary stopped answering heartbeats: hung or cut off) or when no
  candidate is even listening (every one refuses a connection: nobody can promote). Every
  write then fails fast (HTTP 503) without touching the connection, and ``/readyz`` answers
  503;
- **closed** again as soon as a heartbeat (or anything) reconnects: the client reports the
  link up (``connected``/``rejoined``), or simply has a live link when asked.

Nothing here expires on a timer: there is no half-open window in which a write probes the
backend, so no write ever pays for discovering an outage that heartbeats already know of.
:func:`verdict` is the pure decision; :class:`BackendHealth` holds its inputs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

State = Literal["closed", "grace", "open"]

LIVENESS_MARK = "liveness"
"""The core client names a link it declared dead for silence with this word (``... liveness
timeout``): such a primary is hung or unreachable, so the breaker opens without a grace."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the breaker says now: ``state``, ``remaining`` grace (s), and why (``reason``)."""

    state: State
    remaining: float = 0.0
    reason: str = ""

    @property
    def open(self) -> bool:
        """Writes fail fast."""
        return self.state == "open"


def verdict(now: float, connected: bool, lost_at: float | None, hung: bool, grace: float,
            reason: str) -> Verdict:
    """The breaker's state from its inputs (pure).

    ``lost_at`` is when the link was lost (None: not known to be lost), ``hung`` whether it
    was lost to the liveness timeout, ``reason`` what the client said about the loss.
    """
    if connected:
        return Verdict("closed")
    since = now if lost_at is None else lost_at
    down = now - since
    if hung or down >= grace:
        why = reason or "no connection to a primary"
        return Verdict("open", 0.0, f"{why} ({down:.1f} s ago)")
    return Verdict("grace", grace - down, reason)


class BackendHealth:
    """The breaker's inputs, safe to use from the event loop and from threads.

    ``clock`` is injectable (monotonic seconds) so tests can pass the grace without sleeping.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace: float = 0.25) -> None:
        if not grace >= 0:
            raise ValueError(f"the breaker's grace must be >= 0 s, got {grace}")
        self.grace = grace
        self._clock = clock
        self._lock = threading.Lock()
        self._lost_at: float | None = None
        self._hung = False
        self._reason = ""
        self._announced = False  # the current outage was logged as open
        self._probed = False  # the current outage's candidates were probed once

    def link_lost(self, detail: str) -> None:
        """The client lost its link (``reconnecting``/``degraded``); keeps the first loss time."""
        with self._lock:
            if self._lost_at is None:
                self._lost_at = self._clock()
                self._reason = detail
            self._hung = self._hung or LIVENESS_MARK in detail

    def link_up(self) -> None:
        """The client reached a primary again (``connected``/``rejoined``)."""
        with self._lock:
            self._lost_at, self._hung, self._reason, self._announced = None, False, "", False
            self._probed = False

    def down_for_sure(self, reason: str) -> None:
        """No candidate can become primary within the grace (none is listening): open now."""
        with self._lock:
            if self._lost_at is None:
                self._lost_at = self._clock()
            self._hung, self._reason = True, reason

    def take_probe(self) -> bool:
        """True once per outage: whether to probe the candidates now."""
        with self._lock:
            if self._probed:
                return False
            self._probed = True
            return True

    def verdict(self, connected: bool) -> Verdict:
        """The breaker now, given whether the client has a live link this instant."""
        with self._lock:
            if connected:
                if self._lost_at is not None:  # up before its hook said so
                    self._lost_at, self._hung, self._reason, self._announced = None, False, "", False
                    self._probed = False
                return Verdict("closed")
            if self._lost_at is None:  # the loss's hook has not run yet
                self._lost_at = self._clock()
            return verdict(self._clock(), False, self._lost_at, self._hung, self.grace, self._reason)

    @property
    def announced(self) -> bool:
        """Whether the current outage was announced (logged) as open."""
        with self._lock:
            return self._announced

    def first_open(self) -> bool:
        """True once per outage, the first time it is seen open (to log it once)."""
        with self._lock:
            if self._announced:
                return False
            self._announced = True
            return True
