"""THE one wrapper around the core client that every write path of the API server uses.

Job submit, job control, queue control, host control and force-run all go through
:meth:`Backend.call`, which

1. fails fast with :class:`BackendUnavailableError` while the backend is marked degraded,
   without touching the connection;
2. calls the controller with a bounded retry budget (``backend_retries`` re-sends and failed
   connect passes) and deadline (``backend_timeout`` seconds), so an HTTP request never
   waits forever, and marks the backend degraded for ``degraded_ttl`` when the budget runs
   out;
3. leaves the post-call rejoin to the core client: the API server declares its rejoin points
   (:data:`REJOIN_POINTS`) and the client re-joins after such a call when one is pending.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio
from loguru import logger

from xce_apiserver.health import BackendHealth

REJOIN_POINTS = ("jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch")
"""The ops after which the core client re-joins when a rejoin is pending."""

# Grace on top of the core's own deadline: the core should give up first; this only bounds a
# client that does not honour its deadline.
_GRACE = 1.0


class CoreClient(Protocol):
    """What the wrapper needs of ``xcecore.client.Client``."""

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = ...,
        *,
        deadline: float | None = ...,
        retry_budget: int | None = ...,
    ) -> Any:
        """Send one request and return its result."""


class BackendUnavailableError(Exception):
    """The controller cannot be reached now; the route answers 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def _core_unavailable() -> tuple[type[BaseException], ...]:
    """The core's "budget exhausted" exceptions (imported late: the module is not small).

    ``OutcomeUnknown`` (a write sent whose reply was lost) is answered like an exhausted
    budget, 503, as before the client told the two apart; the REST edge is to answer it 504
    with the idempotency key (issue #15).
    """
    from xcecore.client import BackendUnavailable, OutcomeUnknown

    return (BackendUnavailable, OutcomeUnknown)


class Backend:
    """Forwards writes to the controller under the health check and a bounded budget."""

    def __init__(
        self,
        client: CoreClient | None,
        health: BackendHealth,
        *,
        timeout: float = 3.0,
        retries: int | None = 10,
        degraded_ttl: float = 5.0,
    ) -> None:
        self.client = client
        self.retries = retries
        self.health = health
        self.timeout = timeout
        self.degraded_ttl = degraded_ttl
        self._unavailable = _core_unavailable()

    def _fail_fast(self) -> BackendUnavailableError:
        reason = self.health.reason or "the controller did not answer within the retry budget"
        wait = self.health.retry_after()
        return BackendUnavailableError(
            f"backend unavailable: {reason}; retry in {max(1, round(wait))} s", wait
        )

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        """Call ``op`` on the controller; errors replies propagate as the core raises them.

        Raises :class:`BackendUnavailableError` at once while degraded, and after marking the
        backend degraded when the call's budget is exhausted.
        """
        if self.health.is_degraded():
            raise self._fail_fast()
        if self.client is None:
            raise BackendUnavailableError("backend unavailable: no controller client", 1.0)
        try:
            with anyio.fail_after(self.timeout + _GRACE):
                result = await self.client.call(
                    op, args, deadline=self.timeout, retry_budget=self.retries
                )
        except TimeoutError as exc:
            self._degrade(op, f"{op} got no answer within {self.timeout:g} s")
            raise self._fail_fast() from exc
        except self._unavailable as exc:
            self._degrade(op, f"{op} exhausted its retry budget ({exc})")
            raise self._fail_fast() from exc
        # A write went through: whatever marked the backend degraded is over.
        self.health.mark_healthy()
        return result

    def _degrade(self, op: str, reason: str) -> None:
        logger.warning(
            "apiserver: {}; marking the backend degraded for {:g} s (writes answer 503 until "
            "then or until the client re-joins)", reason, self.degraded_ttl,
        )
        self.health.mark_degraded(self.degraded_ttl, reason)
