"""The accounting role against a real cluster: three controller candidates, a worker running
real jobs, the scheduler, and the accounting role, all real processes on loopback.

Every finished attempt is recorded exactly once across a SIGKILL of the primary and a
SIGKILL of the accounting role mid-stream; jobs it could not see are marked with a gap; the
history ops reach it through the controller (delegated), authorized from the caller's user.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, Proc, wait_for
from xcecore.wire import RemoteError

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e]

ADMINS = '[controller]\nadmins = ["ops"]\n'


@contextmanager
def cli(cl: LocalCluster) -> Iterator[SyncClient]:
    _, cfg = load(cl.config_path)
    with SyncClient.open(client_config(cfg, "apiserver@test"), role="apiserver") as c:  # a front end: it names users
        yield c


def start_accounting(cl: LocalCluster, db: Path, *extra: str) -> Proc:
    return cl.start_role("accounting", f'accounting.path="{db}"', "accounting.flush_interval=0.02",
                         *extra, name="accounting")


def start_rest(cl: LocalCluster, tmp: Path) -> None:
    cl.start_role("worker", 'worker.hname="node1"', f'worker.state_dir="{tmp / "node1"}"',
                  "worker.monitor_interval=0.1", "worker.slots=4", name="node1")
    cl.start_role("scheduler")


def submit(c: SyncClient, user: str, command: str, n: int) -> list[int]:
    return [int(c.call("jobsubmit", {"command": command, "user": user, "project": f"p-{user}"},
                       deadline=30)["jobid"]) for _ in range(n)]


def finished(c: SyncClient, ids: list[int]) -> bool:
    jobs = c.call("jobinfo", {"jobids": ids}, deadline=30)["jobs"]
    return len(jobs) == len(ids) and all(j["state"] in ("DONE", "EXIT") for j in jobs)


def serves(c: SyncClient) -> bool:
    try:
        c.call("history.events", {"user": "ops", "limit": 1}, deadline=10)
    except RemoteError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        return False
    return True


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(str(db), timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


def recorded(db: Path) -> set[int]:
    return {r[0] for r in rows(db, "SELECT jobid FROM attempts")}


def test_every_attempt_once_across_primary_and_accounting_kills(xce_cluster: Any, tmp_path: Path) -> None:
    cl: LocalCluster = xce_cluster(3, extra_config=ADMINS)
    db = tmp_path / "acct.db"
    start_rest(cl, tmp_path)
    acct = start_accounting(cl, db)
    with cli(cl) as c:
        wait_for(lambda: any(m["role"] == "accounting" for m in
                             c.call("status", {}, deadline=30)["member_list"]), 60,
                 what="the accounting role joined")
        first = submit(c, "alice", "true", 15) + submit(c, "bob", "exit 3", 5)
        cl.kill_primary()  # mid-stream: some of them are still pending or running
        second = submit(c, "alice", "true", 10)
        wait_for(lambda: finished(c, first + second), 60, what="first jobs finished")
        wait_for(lambda: recorded(db) >= set(first + second), 60, what="first jobs recorded")
        acct.kill()  # SIGKILL mid-stream: jobs keep being submitted and finishing
        third = submit(c, "alice", "true", 5)
        unseen = submit(c, "carol", "true", 5)
        wait_for(lambda: finished(c, third + unseen), 60, what="jobs finished while accounting was down")
        with pytest.raises(RemoteError) as refused:  # nobody serves history now
            c.call("history.job", {"jobid": first[0], "user": "alice"}, deadline=10)
        assert refused.value.code == "UNAVAILABLE" and "no member serves history.job" in refused.value.message
        acct = start_accounting(cl, db)
        wait_for(lambda: serves(c), 60, what="the restarted accounting role serves history")
        fourth = submit(c, "bob", "true", 5)
        every = first + second + third + unseen + fourth
        wait_for(lambda: finished(c, every), 60, what="every job finished")
        wait_for(lambda: recorded(db) >= set(every), 60, what="every job recorded")

        attempts = rows(db, "SELECT jobid, attempt FROM attempts")
        assert len(attempts) == len(every), f"one attempt row per finished job: {len(attempts)} vs {len(every)}"
        assert {a[0] for a in attempts} == set(every)
        finishes = rows(db, "SELECT jobid, count(*) FROM events WHERE kind = 'finished' GROUP BY jobid")
        assert {j: n for j, n in finishes} == dict.fromkeys(every, 1), "each job finished once"
        submits = rows(db, "SELECT jobid, count(*) FROM events WHERE kind = 'submitted' GROUP BY jobid")
        assert {j: n for j, n in submits} == dict.fromkeys(every, 1), "each job submitted once"
        gaps = {r[0] for r in rows(db, "SELECT DISTINCT jobid FROM events WHERE kind = 'gap'")}
        assert set(unseen) <= gaps, f"jobs submitted and run while accounting was down: gap {gaps}"
        assert not gaps & set(fourth), "jobs seen live from their submission have no gap"
        promotions = rows(db, "SELECT detail FROM cluster_events WHERE kind = 'promotion'")
        assert len(promotions) == 1, promotions
        states = dict(rows(db, "SELECT jobid, state FROM attempts"))
        assert all(states[j] == "EXIT" for j in first[15:]) and all(states[j] == "DONE" for j in first[:15])

        # Through the controller: delegated, authorized from the caller's user.
        hist = c.call("history.job", {"jobid": first[0], "user": "alice"}, deadline=30)
        kinds = [e["kind"] for e in hist["events"]]
        assert kinds[0] in ("submitted", "gap") and kinds[-1] == "finished", kinds
        assert hist["attempts"][0]["state"] == "DONE" and hist["attempts"][0]["hosts"] == ["node1"]
        assert hist["attempts"][0]["cpu_time"] is not None, hist["attempts"][0]  # the final usage (#21)
        with pytest.raises(RemoteError) as denied:
            c.call("history.job", {"jobid": first[15], "user": "alice"}, deadline=30)
        assert denied.value.code == "DENIED" and "belongs to bob" in denied.value.message
        with pytest.raises(RemoteError) as denied:
            c.call("history.jobs", {"owner": "bob", "user": "alice"}, deadline=30)
        assert denied.value.code == "DENIED"
        mine = c.call("history.jobs", {"user": "alice", "limit": 1000}, deadline=30)["rows"]
        assert {r["jobid"] for r in mine} == set(first[:15] + second + third)
        everyone = c.call("history.jobs", {"user": "ops", "limit": 1000}, deadline=30)["rows"]
        assert {r["jobid"] for r in everyone} == set(every)

        # Filters and the summary, against the known jobs.
        bobs = c.call("history.summary", {"user": "ops", "owner": "bob"}, deadline=30)
        assert (bobs["jobs"], bobs["done"], bobs["exit"]) == (10, 5, 5), bobs
        assert bobs["failures"] == {"exit code 3": 5}, bobs
        assert bobs["wait"]["p50"] is not None and bobs["wall_hours"] > 0
        exits = c.call("history.jobs", {"user": "ops", "state": "EXIT"}, deadline=30)["rows"]
        assert {r["jobid"] for r in exits} == set(first[15:])
        carol = c.call("history.jobs", {"user": "ops", "project": "p-carol"}, deadline=30)["rows"]
        assert {r["jobid"] for r in carol} == set(unseen)
        assert c.call("history.jobs", {"user": "ops", "host": "node2"}, deadline=30)["rows"] == []
        page1 = c.call("history.jobs", {"user": "ops", "limit": 7}, deadline=30)
        page2 = c.call("history.jobs", {"user": "ops", "limit": 1000, "cursor": page1["next"]},
                       deadline=30)
        paged = [r["jobid"] for r in page1["rows"] + page2["rows"]]
        assert sorted(paged) == sorted(every) and page2["next"] is None
    assert acct.alive(), acct.text()[-3000:]


def test_the_role_on_postgresql_records_once_across_its_own_sigkill(xce_cluster: Any, tmp_path: Path,
                                                                   pg_dsn: str) -> None:
    import psycopg

    cl: LocalCluster = xce_cluster(1, extra_config=ADMINS)
    start_rest(cl, tmp_path)
    opts = ['accounting.backend="postgresql"', f'accounting.dsn="{pg_dsn}"', "accounting.flush_interval=0.02"]
    acct = cl.start_role("accounting", *opts, name="accounting")

    def count() -> tuple[int, int]:
        with psycopg.connect(pg_dsn) as conn:
            try:
                a = conn.execute("SELECT count(*), count(DISTINCT jobid) FROM attempts").fetchone()
            except psycopg.errors.UndefinedTable:
                return (0, 0)
        assert a is not None
        return int(a[0]), int(a[1])

    with cli(cl) as c:
        wait_for(lambda: serves(c), 60, what="the accounting role serves history")
        first = submit(c, "alice", "true", 8)
        wait_for(lambda: finished(c, first), 60, what="jobs finished")
        wait_for(lambda: count()[0] >= 8, 60, what="jobs recorded in PostgreSQL")
        acct.kill()
        second = submit(c, "alice", "exit 1", 4)
        wait_for(lambda: finished(c, second), 60, what="jobs finished while accounting was down")
        acct = cl.start_role("accounting", *opts, name="accounting")
        wait_for(lambda: count()[0] >= 12, 60, what="every job recorded after the restart")
        assert count() == (12, 12), "one row per finished attempt, none twice"
        s = c.call("history.summary", {"user": "alice"}, deadline=30)
        assert (s["jobs"], s["done"], s["exit"]) == (12, 8, 4), s
        hist = c.call("history.job", {"jobid": second[0], "user": "alice"}, deadline=30)
        assert hist["gaps"] >= 1, "a job run while accounting was down says so"
    assert acct.alive(), acct.text()[-3000:]
