"""THE one wrapper around the core client that every write path of the API server uses.

Job submit, job control, queue control, host control and force-run all go through
:meth:`Backend.call`, which

1. asks the breaker (:mod:`xce_apiserver.health`): open -> :class:`BackendUnavailableError`
   at once, the request never sent (HTTP 503); in the grace after a lost link -> waits for
   the client to reconnect, at most the rest of the grace, and fails the same way if it does
   not;
2. hands the write to the client with its idempotency key as the request's ``rid`` and a
   bounded retry budget (``backend_retries``) and deadline (``backend_timeout``), so an HTTP
   request never waits forever;
3. reports a write that was handed over and did not come back as
   :class:`OutcomeUnknownError` (HTTP 504 with the key): it may have been applied, and a
   retry with the same key is safe (the controller answers it from its idempotency table);
4. acts for the logged-on user: every write names the user it is for (``user``). The API
   server is a service identity the controller trusts to say whom it acts for; the
   controller applies that user's rights and records both ("alice via apiserver@h1");
5. leaves the post-call rejoin to the core client: the API server declares its rejoin points
   (:data:`REJOIN_POINTS`) and the client re-joins after such a call when one is pending.

The breaker fast-fails only writes it did not send; a write that was sent is a 503 only when
the client knows it was not applied (``BackendUnavailable``: it never reached a primary), and
a 504 otherwise (``OutcomeUnknown``).
"""

from __future__ import annotations

import errno
from typing import Any, Protocol

import anyio
from loguru import logger

from xce_apiserver.health import BackendHealth, Verdict

REJOIN_POINTS = ("jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch", "revoke_token")
"""The ops after which the core client re-joins when a rejoin is pending."""

RETRY_AFTER = 1.0
"""Seconds a 503 asks the client to wait: about one heartbeat, which is what closes it."""

# Grace on top of the core's own deadline: the core should give up first; this only bounds a
# client that does not honour its deadline.
_GRACE = 1.0


class CoreClient(Protocol):
    """What the wrapper needs of the core client (``xcecore.client.Client``)."""

    @property
    def connected(self) -> bool:
        """True while a live link to a primary exists."""

    async def connect(self, *, deadline: float | None = ..., retry_budget: int | None = ...) -> Any:
        """Connect if not connected."""

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = ...,
        *,
        deadline: float | None = ...,
        retry_budget: int | None = ...,
        rid: str | None = ...,
    ) -> Any:
        """Send one request (under idempotency key ``rid``) and return its result."""


class BackendUnavailableError(Exception):
    """The controller cannot be reached and the write was not sent: HTTP 503."""

    def __init__(self, message: str, retry_after: float = RETRY_AFTER) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class OutcomeUnknownError(Exception):
    """A write was sent and no answer came: it may or may not have been applied (HTTP 504).

    ``rid`` is the idempotency key it was sent with; retrying with it is safe.
    """

    def __init__(self, message: str, op: str, rid: str) -> None:
        super().__init__(message)
        self.message, self.op, self.rid = message, op, rid


def _core_errors() -> tuple[type[BaseException], type[BaseException]]:
    """The core's "not applied" and "outcome unknown" exceptions (imported late: the client
    package is not small)."""
    from xcecore.client import BackendUnavailable, OutcomeUnknown

    return BackendUnavailable, OutcomeUnknown


PROBE_TIMEOUT = 0.2
"""Seconds a candidate may take to accept or refuse the breaker's TCP probe."""


async def nobody_listening(client: Any) -> bool:
    """True when every candidate of ``client`` refuses a TCP connection (ECONNREFUSED).

    Once per outage, in the grace: then no process listens on any candidate address, so no
    standby can promote within the grace and waiting it out would only delay the 503. A
    candidate that accepts, does not answer, or fails otherwise counts as possibly alive.
    """
    candidates = getattr(getattr(client, "config", None), "candidates", None)
    if not candidates:
        return False
    refused: list[bool] = []

    async def probe(host: str, port: int) -> None:
        try:
            with anyio.fail_after(PROBE_TIMEOUT):
                stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
            refused.append(False)
        except Exception as exc:
            refused.append(_refused(exc))

    async with anyio.create_task_group() as tg:
        for cand in candidates:
            tg.start_soon(probe, cand.host, cand.port)
    return all(refused)


def _refused(exc: BaseException | None) -> bool:
    for _ in range(4):  # anyio wraps the OS error ("All connection attempts failed")
        if exc is None:
            return False
        if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Backend:
    """Forwards writes to the controller under the breaker and a bounded budget."""

    def __init__(
        self,
        client: CoreClient | None,
        health: BackendHealth,
        *,
        timeout: float = 3.0,
        retries: int | None = 10,
    ) -> None:
        self.client = client
        self.retries = retries
        self.health = health
        self.timeout = timeout
        self._unavailable, self._unknown = _core_errors()
        interval = getattr(getattr(client, "config", None), "heartbeat_interval", None)
        self._heartbeats = interval != 0  # unknown: assume the client beats

    def connected(self) -> bool:
        """Whether the client has a live link to a primary right now."""
        return self.client is not None and bool(getattr(self.client, "connected", True))

    async def verdict(self) -> Verdict:
        """The breaker now; in a grace, first (once per outage) whether anyone listens."""
        v = self.health.verdict(self.connected())
        if v.state == "grace" and self.health.take_probe() and await nobody_listening(self.client):
            self.health.down_for_sure("no controller candidate is listening (every one refused "
                                      "a connection)")
            v = self.health.verdict(self.connected())
        return v

    async def degraded(self) -> str | None:
        """Why writes fail fast now, or None while they go through (``/readyz``)."""
        v = await self.verdict()
        return v.reason if v.open else None

    def _refuse(self, reason: str) -> BackendUnavailableError:
        if self.health.first_open():
            logger.warning("apiserver: backend unavailable: {}; writes answer 503 at once until "
                           "a heartbeat reaches a primary again", reason)
        return BackendUnavailableError(f"backend unavailable: {reason}; nothing was sent, retry "
                                       f"in {RETRY_AFTER:g} s")

    async def call(self, op: str, args: dict[str, Any], *, rid: str, user: str) -> Any:
        """Call ``op`` for ``user`` on the controller with idempotency key ``rid``; error
        replies propagate as the core raises them (:class:`xcecore.wire.RemoteError`).

        Raises :class:`BackendUnavailableError` when the write was not sent (breaker open, or
        no primary within the grace) and :class:`OutcomeUnknownError` when it was sent and no
        answer came within the budget.
        """
        if not user:
            raise ValueError(f"{op}: the API server acts for a user and must name one")
        args = {**args, "user": user}
        if self.client is None:
            raise BackendUnavailableError("backend unavailable: no controller client")
        v = await self.verdict()
        if v.open and not self._heartbeats:
            # Nothing probes the link between writes (heartbeats are off): this write does,
            # within one grace; with heartbeats on, an open breaker never costs a write time.
            v = Verdict("grace", self.health.grace, v.reason)
        if v.open:
            raise self._refuse(v.reason)
        if v.state == "grace":
            try:
                await self.client.connect(deadline=max(v.remaining, 0.001))
            except Exception:  # no primary within the grace: the breaker is open now
                v = self.health.verdict(self.connected())
                raise self._refuse(v.reason or f"no primary within {self.health.grace:g} s") from None
        try:
            with anyio.fail_after(self.timeout + _GRACE):
                return await self.client.call(op, args, deadline=self.timeout,
                                              retry_budget=self.retries, rid=rid)
        except TimeoutError:  # the client did not honour its deadline: it was sent, no answer
            raise self._lost(op, rid, f"no answer within {self.timeout:g} s") from None
        except self._unknown as exc:  # sent, and its reply never came
            raise self._lost(op, rid, str(exc)) from None
        except self._unavailable as exc:  # the client says: not applied (never reached a primary)
            raise self._refuse(str(exc)) from None

    def _lost(self, op: str, rid: str, why: str) -> OutcomeUnknownError:
        logger.warning("apiserver: {} (key {}) was sent and got no answer ({}); answering 504: "
                       "its outcome is unknown, a retry with the same Idempotency-Key is safe",
                       op, rid, why)
        return OutcomeUnknownError(f"{op}: outcome unknown ({why})", op, rid)
