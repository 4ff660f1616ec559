"""The API server role's object: the store fed by its pushes and its backend health.

Pushes and connection-state changes start before the role's main runs (the state sync
follows the join), so the role object holds the store and the health from the start; main
builds the REST app over them. This module stays light: FastAPI, pydantic and uvicorn load in
main, on a thread.
"""

from __future__ import annotations

from typing import Any

from loguru import logger

from xce_apiserver.backend import REJOIN_POINTS
from xce_apiserver.health import BackendHealth
from xce_apiserver.looplag import LoopLag
from xce_apiserver.metrics import RequestStats
from xce_apiserver.store import Store
from xcecore.candidates import Candidate
from xcecore.role import Handled, Role, RoleContext


class ApiServerRole(Role):
    """REST under ``/xce/v1`` over a push-fed store; writes go through one backend wrapper."""

    rejoin_points = frozenset(REJOIN_POINTS)
    """Every write op the API server forwards is a rejoin point."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.store = Store(name=ctx.identity)
        self.health = BackendHealth(grace=float(ctx.section["failover_grace"]))
        self.requests = RequestStats()
        self.lag = LoopLag()  # the event loop's stalls (xce_apiserver_loop_lag_*)

    def join_attributes(self) -> dict[str, Any]:
        """The address its REST API listens on, for operators reading ``status``."""
        return {"listen": self.ctx.section["listen"]}

    def metrics(self) -> list[Any]:
        """``xce_apiserver_*`` (:mod:`xce_apiserver.metrics`)."""
        from xce_apiserver.metrics import families

        return families(self)

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """Feed the store's replica (the sync after each join, then the changes)."""
        self.store.apply(event, data)
        return None

    def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> Handled:
        """Feed the breaker: a lost link starts its grace, a link up again (a heartbeat's
        reconnect, a re-join) closes it (see :mod:`xce_apiserver.health`)."""
        health = self.health
        if state in ("rejoined", "connected") and candidate is not None:
            self.store.joined(str(candidate))
        if state in ("rejoined", "connected"):
            if health.announced:  # the outage was logged: say that it is over
                logger.info("apiserver: {} {}; backend reachable again, writes go through", state, candidate)
            health.link_up()
        elif state in ("reconnecting", "degraded"):
            health.link_lost(f"{state}: {detail}")
            self.store.hub.link_lost(f"{state}: {detail}")
        return None

    async def main(self) -> None:
        """Serve the REST API until the role stops."""
        import importlib

        import anyio

        # FastAPI, pydantic and uvicorn take a good part of a second to import: on a thread, so
        # the client's reader and heartbeats on this loop go on meanwhile (a failover during
        # start-up is noticed at once, not after the imports).
        role = await anyio.to_thread.run_sync(importlib.import_module, "xce_apiserver.role")
        await role.run(self)
