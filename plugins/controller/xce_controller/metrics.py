"""The controller's Prometheus figures (``xce_controller_*``; see :mod:`xcecore.metrics`).

What the loop keeps is plain counts (:class:`CommitStats`, ``Controller.requests``, its
connections by role, the outboxes' unsent total, the job table's per-(queue, state) counts),
so the controller does not depend on prometheus-client where things happen; :func:`families`
turns them into metric families at a scrape, on the loop, without walking jobs or members.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from xcecore.metrics import Histogram

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds from a write handed to the store to its batch committed."""
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 20000)
"""Writes per committed batch."""
MAX_ROLES = 20
"""Role labels exported at most: a role name is what a client claims, so its values are bounded."""


class CommitStats:
    """Committed batches: their sizes, and the latency of each batch's oldest write."""

    def __init__(self) -> None:
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)

    def observe(self, batch: list[Any]) -> None:
        """A batch committed (on the loop: one call per batch, not per write)."""
        self.batch.observe(len(batch))
        born = getattr(batch[0].extra, "born", None)
        if born is not None:
            self.latency.observe(time.monotonic() - born)


def families(ctl: Any) -> Iterable[Any]:
    """Every ``xce_controller_*`` family from the candidate (a ``server.Controller``; not
    imported: the server imports this module) as it is now."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    role = GaugeMetricFamily("xce_controller_primary", "1 while this candidate is the primary "
                             "(acknowledging writes), else 0", labels=["candidate"])
    role.add_metric([ctl.address], 1.0 if ctl.role == "primary" else 0.0)
    yield role
    since = GaugeMetricFamily("xce_controller_role_since_seconds", "when this candidate took its "
                              "current role (Unix time)", labels=["role"])
    since.add_metric([ctl.role], ctl.since)
    yield since
    promotions = CounterMetricFamily("xce_controller_promotions", "promotions of this candidate "
                                     "to primary (this process)")
    promotions.add_metric([], 1.0 if ctl.promote_ms is not None else 0.0)
    yield promotions
    if ctl.promote_ms is not None:
        took = GaugeMetricFamily("xce_controller_promotion_seconds", "how long the last "
                                 "promotion took as this candidate saw it")
        took.add_metric([], ctl.promote_ms / 1000)
        yield took

    jobs = GaugeMetricFamily("xce_controller_jobs", "jobs in the state", labels=["queue", "state"])
    for (queue, state), n in ctl.state.jobs.counts.items():
        jobs.add_metric([queue, state], float(n))
    yield jobs

    by_role = ctl.conn_roles
    unsent = ctl.unsent.value
    members = GaugeMetricFamily("xce_controller_connections", "client connections by the role "
                                "they claim (beyond the first 20 roles: 'other')", labels=["role"])
    ranked = sorted(by_role.items(), key=lambda kv: (-kv[1], kv[0]))
    other = sum(n for _, n in ranked[MAX_ROLES:])
    for r, n in sorted(ranked[:MAX_ROLES]) + ([("other", other)] if other else []):
        members.add_metric([r], float(n))
    yield members
    push = GaugeMetricFamily("xce_controller_unsent_bytes", "replies and pushes queued to "
                             "clients and not yet taken by the kernel")
    push.add_metric([], float(unsent))
    yield push

    requests = CounterMetricFamily("xce_controller_requests", "requests received by op "
                                   "(heartbeats included: their rate is heartbeats/s)",
                                   labels=["op"])
    for op, n in sorted(ctl.requests.items()):
        requests.add_metric([op], float(n))
    yield requests

    for name, hist, what in (
            ("xce_controller_commit_latency_seconds", ctl.commits.latency,
             "a write handed to the store -> its batch committed (each batch's oldest write)"),
            ("xce_controller_commit_batch_writes", ctl.commits.batch, "writes per committed batch")):
        yield hist.family(name, what)

    for name, value, what in (
            ("xce_controller_rev", ctl.rev, "the state's revision (one per change)"),
            ("xce_controller_committed_rev", ctl.committed_rev, "the highest revision committed"),
            ("xce_controller_writes_pending", len(ctl.unstable), "writes handed to the store, "
             "not yet reported committed"),
            ("xce_controller_idempotency_keys", len(ctl.rids), "idempotency keys remembered")):
        g = GaugeMetricFamily(name, what)
        g.add_metric([], float(value))
        yield g
