"""Reservations and exclusive hosts with a real scheduler and a real worker: two jobs whose
rusage does not fit together on the host never run at the same time (each records when it
ran), and an exclusive job never shares its host; the waiting job's pend reason says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_worker_cluster import admin, host_up, job_state, start_worker

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]

SITE = 'resources = [{ name = "licenses", type = "numeric", consumable = true }]\n'


def timed(tmp: Path, tag: str) -> str:
    """A job that writes when it started and ended (and runs long enough to overlap)."""
    return (f"date +%s.%N > {tmp / (tag + '.start')}; sleep 1.5; "
            f"date +%s.%N > {tmp / (tag + '.end')}")


def span(tmp: Path, tag: str) -> tuple[float, float]:
    return float((tmp / f"{tag}.start").read_text()), float((tmp / f"{tag}.end").read_text())


def done(c: Any, jobid: int) -> dict[str, Any]:
    return wait_for(lambda: (j := job_state(c, jobid))["state"] in ("DONE", "EXIT") and j,  # type: ignore[no-any-return]
                    60, what=f"job {jobid} ended")


def test_reservations_and_exclusive_hosts_keep_jobs_apart(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1, cluster_extra=SITE)
    start_worker(cl, "r1", tmp_path / "w", "w", "worker.slots=4", "worker.numbers={licenses=10}")
    cl.start_role("scheduler", name="sched")
    with admin(cl) as c:
        wait_for(lambda: host_up(c, "r1"), 20, what="host r1")
        # 6 + 6 licenses of 10: one at a time; a job needing 4 fits beside either.
        a = c.call("jobsubmit", {"command": timed(tmp_path, "a"), "resreq": "rusage[licenses=6]"})["jobid"]
        b = c.call("jobsubmit", {"command": timed(tmp_path, "b"), "resreq": "rusage[licenses=6]"})["jobid"]
        small = c.call("jobsubmit", {"command": timed(tmp_path, "s"), "resreq": "rusage[licenses=4]"})["jobid"]
        waiting = wait_for(lambda: (j := job_state(c, b))["pend_reason"] and j, 30,
                           what="the second job's pend reason")
        assert waiting["state"] == "PEND" and "reserved" in waiting["pend_reason"]
        for jobid in (a, b, small):
            assert done(c, jobid)["state"] == "DONE"
        (a0, a1), (b0, b1), (s0, _) = span(tmp_path, "a"), span(tmp_path, "b"), span(tmp_path, "s")
        assert a1 <= b0 or b1 <= a0, "the two 6-license jobs ran at the same time"
        assert s0 < max(a1, b1)  # the small one did not wait for both (it fit beside one)

        # An exclusive job takes the host alone: the shared job waits for it, and the next
        # exclusive job waits for the shared one.
        x = c.call("jobsubmit", {"command": timed(tmp_path, "x"), "exclusive": True})["jobid"]
        wait_for(lambda: job_state(c, x)["state"] == "RUN", 30, what="the exclusive job RUN")
        shared = c.call("jobsubmit", {"command": timed(tmp_path, "y")})["jobid"]
        x2 = c.call("jobsubmit", {"command": timed(tmp_path, "z"), "exclusive": True})["jobid"]
        rec = wait_for(lambda: (j := job_state(c, shared))["pend_reason"] and j, 30,
                       what="the shared job's pend reason")
        assert rec["state"] == "PEND" and "exclusive" in rec["pend_reason"]
        for jobid in (x, shared, x2):
            assert done(c, jobid)["state"] == "DONE"
        (_, x1), (y0, y1), (z0, z1) = span(tmp_path, "x"), span(tmp_path, "y"), span(tmp_path, "z")
        assert x1 <= y0 and (y1 <= z0 or z1 <= y0), "a job shared an exclusive job's host"
