"""The API server's Prometheus figures (``xce_apiserver_*``; see :mod:`xcecore.metrics`).

:class:`RequestMetrics` is an ASGI middleware that counts each request by method, route
template (``/xce/v1/jobs/{jobid}``, never the raw path: a client cannot grow the label set)
and status, and observes its latency per route; :func:`families` adds the backend breaker's
state and the replica's size at a scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from xcecore.metrics import Histogram

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds from a request's arrival to its response's first byte."""
UNMATCHED = "(no route)"


class RequestStats:
    """Counts by (method, route, status) and latency by (method, route), under one lock (the
    loop writes, the exporter's thread reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route)
        with self.lock:
            full = (method, route, str(status))
            self.counts[full] = self.counts.get(full, 0) + 1
            hist = self.latency.get(key)
            if hist is None:
                hist = self.latency[key] = Histogram(LATENCY_BUCKETS)
            hist.observe(seconds)


class RequestMetrics:
    """ASGI middleware feeding :class:`RequestStats` (HTTP requests only)."""

    def __init__(self, app: ASGIApp, stats: RequestStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            method = scope.get("method", "?") if template != UNMATCHED else "-"
            self.stats.observe(method, template, status, time.perf_counter() - started)


def families(role: Any) -> list[Any]:
    """Every ``xce_apiserver_*`` family of ``role`` (the ``session.ApiServerRole``; not
    imported: it imports this module) now, on the exporter's thread."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    stats = role.requests
    requests = CounterMetricFamily("xce_apiserver_requests", "HTTP requests by method, route "
                                   "template and status", labels=["method", "route", "status"])
    latency = HistogramMetricFamily("xce_apiserver_request_seconds", "request arrival -> "
                                    "response start, by method and route template",
                                    labels=["method", "route"])
    with stats.lock:
        for (method, route, status), n in sorted(stats.counts.items()):
            requests.add_metric([method, route, status], float(n))
        for (method, route), hist in sorted(stats.latency.items()):
            latency.add_metric([method, route], hist.cumulative(), sum_value=hist.total)
    breaker = GaugeMetricFamily("xce_apiserver_backend_breaker", "the controller breaker: 1 in "
                                "the state named, else 0", labels=["state"])
    client = role.ctx.client
    now = role.health.verdict(client is not None and bool(client.connected)).state
    for state in ("closed", "grace", "open"):
        breaker.add_metric([state], 1.0 if state == now else 0.0)
    jobs = GaugeMetricFamily("xce_apiserver_replica_jobs", "jobs in the API server's replica")
    jobs.add_metric([], float(len(role.store.index)))
    hub = role.store.hub  # the dashboard's event streams (xce_apiserver.stream)
    streams = GaugeMetricFamily("xce_apiserver_streams", "open GET /stream event streams")
    streams.add_metric([], float(len(hub.clients)))
    sent = CounterMetricFamily("xce_apiserver_stream_messages", "coalesced messages sent on "
                               "event streams")
    sent.add_metric([], float(hub.sent))
    dropped = CounterMetricFamily("xce_apiserver_stream_dropped", "event streams dropped "
                                  "because the client did not read")
    dropped.add_metric([], float(hub.dropped))
    lag = role.lag  # xce_apiserver.looplag
    with lag.lock:
        lag_hist = HistogramMetricFamily(
            "xce_apiserver_loop_lag_seconds", "how late a ticker task woke (asked every "
            f"{lag.tick * 1000:g} ms): how long the event loop was busy elsewhere")
        lag_hist.add_metric([], lag.hist.cumulative(), sum_value=lag.hist.total)
    worst = GaugeMetricFamily("xce_apiserver_loop_lag_recent_max_seconds", "the worst loop lag "
                              f"of the last {lag.window:g} to {2 * lag.window:g} seconds")
    worst.add_metric([], lag.recent_worst())
    return [requests, latency, breaker, jobs, streams, sent, dropped, lag_hist, worst]
