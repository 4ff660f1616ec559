"""The scheduler as a real ``xce run scheduler`` process against three controller candidates.

Hosts are registered by joining as ``worker`` from the test (no worker process is needed for a
job to reach RUN with its alloc); jobs are submitted as ``cli@test``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, Proc, wait_for

pytestmark = pytest.mark.timeout(85)

NO_SLOTS = "not enough free slots on matching hosts"


@contextlib.contextmanager
def client(cluster: LocalCluster, role: str, name: str, **join: Any) -> Iterator[SyncClient]:
    """A SyncClient as ``role@name``, joined with ``join`` attributes when given."""
    _, config = load(cluster.config_path)
    cfg = client_config(config, f"{role}@{name}")
    with SyncClient.open(cfg, role=role, join_attrs=join or None) as c:
        if join:
            c.join()
        yield c


def job(cli: SyncClient, jobid: int) -> dict[str, Any]:
    return cli.call("jobinfo", {"jobids": [jobid]})["jobs"][0]  # type: ignore[no-any-return]


def is_running(cli: SyncClient, jobid: int) -> bool:
    rec = job(cli, jobid)
    return rec["state"] == "RUN" and bool(rec["alloc"])


def submit(cli: SyncClient, **kw: Any) -> int:
    return int(cli.call("jobsubmit", {"command": "true", **kw})["jobid"])


def read_status(path: Path) -> dict[str, Any]:
    try:
        return orjson.loads(path.read_bytes())  # type: ignore[no-any-return]
    except (OSError, orjson.JSONDecodeError):
        return {}


def start_scheduler(cluster: LocalCluster, status_file: Path, standby_first: bool) -> Proc:
    p = cluster.ports
    order = [1, 0, 2] if standby_first else [0, 1, 2]
    peers = ",".join(f"127.0.0.1:{p[i]}" for i in order)
    proc = cluster.start_role("scheduler", f'cluster.peers="{peers}"',
                              f'scheduler.status_file="{status_file}"')
    wait_for(lambda: "joined as scheduler" in proc.text(), 30, what="the scheduler's join")
    return proc


def test_join_via_standby_dispatch_reasons_failover(xce_cluster: Any, tmp_path: Path) -> None:
    cluster: LocalCluster = xce_cluster(3)
    status_file = tmp_path / "status.json"
    sched = start_scheduler(cluster, status_file, standby_first=True)
    log = sched.text()
    assert "is a standby, following redirect" in log, log[-3000:]
    pid = sched.pid
    with client(cluster, "worker", "n1", hname="n1", ncpus=2) as _n1, \
            client(cluster, "worker", "n2", hname="n2", ncpus=1, resources=["gpu"]) as _n2, \
            client(cluster, "cli", "test") as cli:
        # Three slots, four jobs: three run, one waits with a reason.
        ids = [submit(cli) for _ in range(4)]
        wait_for(lambda: sum(is_running(cli, j) for j in ids) == 3, 20, what="3 jobs RUN")
        waiting = [j for j in ids if not is_running(cli, j)]
        assert len(waiting) == 1
        wait_for(lambda: job(cli, waiting[0])["pend_reason"] == NO_SLOTS, 10, what="pend reason")
        hosts = {h["name"]: h for h in cli.call("hostinfo", {})["hosts"]}
        assert hosts["n1"]["used_slots"] == 2 and hosts["n2"]["used_slots"] == 1
        wait_for(lambda: read_status(status_file).get("dispatched") == 3, 5, what=f"status {read_status(status_file)}")

        # Failover: the same scheduler process reconnects, re-joins and keeps dispatching.
        cluster.kill_primary()
        wait_for(lambda: "re-joined as scheduler" in sched.text(), 30, what="the re-join")
        with client(cluster, "worker", "n3", hname="n3", ncpus=2) as _n3:
            late = submit(cli)
            wait_for(lambda: is_running(cli, late) and is_running(cli, waiting[0]), 30,
                     what="dispatch after the failover")
            assert {a["host"] for a in job(cli, late)["alloc"]} == {"n3"}
            assert job(cli, waiting[0])["pend_reason"] is None
    assert sched.alive() and sched.pid == pid
    assert read_status(status_file)["pid"] == pid


def test_picker_cycles_while_allocator_waits_in_reconnect(xce_cluster: Any, tmp_path: Path) -> None:
    cluster: LocalCluster = xce_cluster(3)
    status_file = tmp_path / "status.json"
    sched = start_scheduler(cluster, status_file, standby_first=False)
    with client(cluster, "worker", "n1", hname="n1", ncpus=1) as n1, \
            client(cluster, "cli", "test") as cli:
        first, second = submit(cli), submit(cli)
        wait_for(lambda: is_running(cli, first), 20, what="the first job RUN")
        wait_for(lambda: job(cli, second)["pend_reason"] == NO_SLOTS, 10, what="pend reason")
        # The status file is written by the scheduler's own cycle: the first dispatch may be
        # RUN at the controller before the scheduler has counted its reply.
        wait_for(lambda: read_status(status_file).get("dispatched") == 1, 10,
                 what="the first dispatch counted by the scheduler")
        # Freeze the scheduler, free the slot (its pushes wait in the scheduler's socket),
        # kill every candidate, thaw it: the picker proposes the second job and the
        # allocator's jobdispatch_many can only wait in the reconnect.
        os.kill(sched.pid, signal.SIGSTOP)
        try:
            n1.call("notify_job", {"jobid": first, "event": "finish", "exit_status": 0})
            time.sleep(0.2)
            for proc in list(cluster.candidates.values()):
                proc.kill()
        finally:
            os.kill(sched.pid, signal.SIGCONT)
        wait_for(lambda: read_status(status_file).get("inflight", 0) >= 1, 10,
                 what="the second job proposed")
        before = read_status(status_file)
        wait_for(lambda: read_status(status_file)["cycles"] >= before["cycles"] + 10, 10,
                 what="picker cycles during the reconnect")
        during = read_status(status_file)
        assert during["dispatched"] == before["dispatched"] == 1
        assert during["refused"] == during["failed"] == 0 and during["inflight"] >= 1
        assert during["allocator_busy"] >= 1, "the jobdispatch_many waits in the reconnect"
        assert during["last_cycle"] > before["last_cycle"]
        assert "lost connection" in sched.text()

        for i in range(3):
            cluster.start_candidate(i)
        cluster.wait_primary(30)
        wait_for(lambda: is_running(cli, second), 40, what="dispatch after the restart")
        wait_for(lambda: read_status(status_file)["dispatched"] == 2, 10, what="status")
    assert sched.alive()


PARKED_CONFIG = (
    '[controller]\nadmins = ["root"]\n'
    'queues = [{ name = "normal", priority = 30 }, { name = "parked", priority = 10, active = false }]\n'
)
QUEUE_INACTIVE = "queue is inactive"


def test_failover_sends_no_reason_the_queue_says(xce_cluster: Any, tmp_path: Path) -> None:
    """Jobs parked in an inactive queue show its reason on every primary, and the scheduler
    never sends it: a SIGKILL of the primary costs no set_pend_reason for them (only the one
    job whose reason is the scheduler's own is sent again, to the new primary)."""
    cluster: LocalCluster = xce_cluster(3, extra_config=PARKED_CONFIG)
    status_file = tmp_path / "status.json"
    sched = start_scheduler(cluster, status_file, standby_first=False)
    with client(cluster, "worker", "n1", hname="n1", ncpus=1) as _n1, \
            client(cluster, "cli", "test") as cli:
        parked = [submit(cli, queue="parked") for _ in range(50)]
        running, waiting = submit(cli), submit(cli)
        wait_for(lambda: is_running(cli, running), 20, what="the first job RUN")
        wait_for(lambda: job(cli, waiting)["pend_reason"] == NO_SLOTS, 10, what="its pend reason")
        wait_for(lambda: read_status(status_file).get("reasons_sent") == 1, 10,
                 what=f"one reason sent, {read_status(status_file)}")
        shown = cli.call("jobinfo", {"queue": "parked"})["jobs"]
        assert [j["jobid"] for j in shown] == parked
        assert {j["pend_reason"] for j in shown} == {QUEUE_INACTIVE}

        cluster.kill_primary()
        wait_for(lambda: "re-joined as scheduler" in sched.text(), 30, what="the re-join")
        wait_for(lambda: job(cli, waiting)["pend_reason"] == NO_SLOTS, 20,
                 what="the waiting job's reason on the new primary")
        # The status file is written every cycle: two more cycles and nothing else was sent.
        after = read_status(status_file)
        wait_for(lambda: read_status(status_file).get("cycles", 0) >= after["cycles"] + 2, 10,
                 what="two more picker cycles")
        assert read_status(status_file)["reasons_sent"] == 2, read_status(status_file)
        shown = cli.call("jobinfo", {"queue": "parked"})["jobs"]
        assert {j["pend_reason"] for j in shown} == {QUEUE_INACTIVE} and len(shown) == len(parked)

        # Activated, the queue's jobs are the picker's again: one slot is taken, so they wait
        # for slots, and say so.
        cli.call("queuectrl", {"queue": "parked", "action": "activate"})
        wait_for(lambda: {j["pend_reason"] for j in cli.call("jobinfo", {"queue": "parked"})["jobs"]}
                 == {NO_SLOTS}, 20, what="the activated queue's reasons")
    assert sched.alive()


def test_a_pass_goes_in_one_batch_through_a_sigkill_each_job_runs_once(
        xce_cluster: Any, tmp_path: Path) -> None:
    """150 jobs released at once go in one jobdispatch_many; the primary is frozen before the
    batch reaches it and SIGKILLed while it is in flight: the scheduler's client sends it
    again under its key to the new primary, and every job runs exactly once."""
    cluster: LocalCluster = xce_cluster(3, extra_config=PARKED_CONFIG)
    status_file = tmp_path / "status.json"
    sched = start_scheduler(cluster, status_file, standby_first=False)
    with client(cluster, "worker", "n1", hname="n1", ncpus=100) as _n1, \
            client(cluster, "worker", "n2", hname="n2", ncpus=50) as _n2, \
            client(cluster, "cli", "test") as cli:
        ids = [submit(cli, queue="parked") for _ in range(150)]
        wait_for(lambda: read_status(status_file).get("pending") == 150, 20,
                 what=f"150 parked jobs in the scheduler's view, {read_status(status_file)}")
        primary = cluster.wait_primary()
        victim = cluster.candidates[primary]
        # The scheduler frozen, the queue activated (its push waits in the scheduler's
        # socket), the primary frozen, the scheduler thawed: its batch can only wait.
        os.kill(sched.pid, signal.SIGSTOP)
        try:
            cli.call("queuectrl", {"queue": "parked", "action": "activate"})
            os.kill(victim.pid, signal.SIGSTOP)
        finally:
            os.kill(sched.pid, signal.SIGCONT)
        wait_for(lambda: read_status(status_file).get("inflight") == 150
                 and read_status(status_file).get("allocator_busy", 0) >= 1, 20,
                 what=f"the batch in flight, {read_status(status_file)}")
        victim.kill()
        cluster.wait_primary(30, exclude=primary)

        def running() -> list[dict[str, Any]]:
            return [j for j in cli.call("jobinfo", {"queue": "parked", "limit": 1000})["jobs"]
                    if j["state"] == "RUN"]

        wait_for(lambda: len(running()) == 150, 40, what="every job RUN on the new primary")
        jobs = cli.call("jobinfo", {"queue": "parked", "limit": 1000})["jobs"]
        assert sorted(j["jobid"] for j in jobs) == ids
        assert all(j["attempt"] == 0 and [a["ntasks"] for a in j["alloc"]] == [1] for j in jobs)
        hosts = {h["name"]: h["used_slots"] for h in cli.call("hostinfo", {})["hosts"]}
        assert hosts == {"n1": 100, "n2": 50}
        wait_for(lambda: read_status(status_file).get("dispatched") == 150, 10,
                 what=f"150 accepted dispatches counted, {read_status(status_file)}")
        st = read_status(status_file)
        # Each job accepted once (refusals only while the hosts' workers were re-joining), in
        # a few batches: the one in flight, and any pass that proposed the refused again.
        assert st["dispatched"] == 150 and st["failed"] == 0, st
        assert 1 <= st["batches"] <= 10, st
    assert sched.alive()
