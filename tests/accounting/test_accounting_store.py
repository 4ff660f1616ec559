"""The accounting store on both dialects: a real SQLite file and a real PostgreSQL server.

Migrations, idempotent writes, the last view after a restart, filters, paging, the summary
against known rows, retention, and the delegated-query authorization on top of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xce_accounting.queries import answer
from xce_accounting.record import attempt_row
from xce_accounting.store import Batch, Filters, Store
from xce_accounting.timeline import Tracker

from xcecore.wire import RemoteError

NOW = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        st = Store.sqlite(tmp_path / "acct.db")
    else:
        st = Store.postgresql(request.getfixturevalue("pg_dsn"))
    try:
        yield st
    finally:
        st.close()


def job(jobid: int, user: str, **kw: Any) -> dict[str, Any]:
    base = {"jobid": jobid, "user": user, "queue": "normal", "project": "default", "name": f"j{jobid}",
            "ntasks": 1, "state": "PEND", "attempt": 0, "alloc": [], "submit_time": NOW - 100,
            "start_time": None, "end_time": None, "pend_reason": None, "usage": {},
            "command": "true", "resreq": ""}
    base.update(kw)
    return base


def run_to_end(tr: Tracker, st: Store, j: dict[str, Any], *, host: str, wait: float, wall: float,
               code: int, cpu: float) -> None:
    """Feed a job's life, one version at a time, committing each batch."""
    st.write(tr.on_job(dict(j), NOW, st.views))
    j.update(state="RUN", alloc=[{"host": host, "ntasks": j["ntasks"]}])
    st.write(tr.on_job(dict(j), NOW, st.views))
    j.update(start_time=j["submit_time"] + wait, pid=7)
    st.write(tr.on_job(dict(j), NOW, st.views))
    j.update(state="DONE" if code == 0 else "EXIT", exit_status=code,
             end_time=j["start_time"] + wall, usage={"cputime": cpu, "max_mem": 100.0},
             reason=None if code == 0 else f"exit status {code}")
    st.write(tr.on_job(dict(j), NOW, st.views))


def test_migrations_are_versioned_and_applied_once(store: Store) -> None:
    assert store.version() == 1
    assert store.migrate() == 1  # again: nothing new
    assert [tuple(r) for r in store._exec("SELECT version FROM schema_version").fetchall()] == [(1,)]


def test_writes_are_idempotent_and_resume_from_the_stored_view(store: Store) -> None:
    tr = Tracker(store.marks())
    j = job(1, "alice")
    run_to_end(tr, store, j, host="n1", wait=5, wall=10, code=0, cpu=8)
    again = tr.on_sync({"server": "a:1", "jobs": [dict(j)], "hosts": [], "members": []}, NOW, store.views)
    assert not again.events and not again.attempts  # a re-delivery yields nothing
    batch = Batch()
    batch.attempts.append(attempt_row(j, 0, "DONE", ("n1",), j["start_time"], j["end_time"], None, 0))
    store.write(batch)  # the same key twice: nothing written twice
    assert store._exec("SELECT count(*) FROM attempts").fetchone()[0] == 1
    # A restarted role continues from the committed view: a new attempt after a requeue.
    tr2 = Tracker(store.marks())
    j.update(state="PEND", attempt=1, alloc=[], start_time=None, end_time=None, exit_status=None)
    out = tr2.on_job(dict(j), NOW + 1, store.views)
    assert [e.kind for e in out.events] == ["requeued"] and out.events[0].seq == 5
    store.write(out)
    found = store.job(1)
    assert found is not None and [e["seq"] for e in found["events"]] == [1, 2, 3, 4, 5]
    assert found["gaps"] == 0


def _fill(store: Store) -> None:
    tr = Tracker()
    specs = [  # jobid, user, queue, host, wait, wall, code, cpu
        (1, "alice", "normal", "n1", 1.0, 100.0, 0, 50.0),
        (2, "alice", "normal", "n2", 2.0, 200.0, 1, 100.0),
        (3, "alice", "short", "n1", 3.0, 300.0, 0, 150.0),
        (4, "bob", "normal", "n_2", 10.0, 400.0, 1, 200.0),
        (5, "bob", "short", "n1", 20.0, 500.0, 137, 250.0),
    ]
    for jobid, user, queue, host, wait, wall, code, cpu in specs:
        j = job(jobid, user, queue=queue, project=f"p{jobid % 2}", submit_time=NOW - 10_000 + jobid * 1000)
        run_to_end(tr, store, j, host=host, wait=wait, wall=wall, code=code, cpu=cpu)


def test_filters_paging_and_summary_against_known_rows(store: Store) -> None:
    _fill(store)
    ids = lambda f: sorted(r["jobid"] for r in store.jobs(f, 100)[0])  # noqa: E731
    assert ids(Filters(owner="alice")) == [1, 2, 3]
    assert ids(Filters(queue="short")) == [3, 5]
    assert ids(Filters(project="p1")) == [1, 3, 5]
    assert ids(Filters(host="n1")) == [1, 3, 5]
    assert ids(Filters(host="n_2")) == [4]  # '_' is not a wildcard
    assert ids(Filters(state="EXIT")) == [2, 4, 5]
    ends = {r["jobid"]: r["end_time"] for r in store.jobs(Filters(), 100)[0]}
    assert ids(Filters(since=ends[3])) == [3, 4, 5]
    assert ids(Filters(until=ends[3])) == [1, 2]
    page, nxt = store.jobs(Filters(), 2)
    assert [r["jobid"] for r in page] == [5, 4] and nxt is not None
    page2, nxt2 = store.jobs(Filters(), 2, nxt)
    page3, nxt3 = store.jobs(Filters(), 2, nxt2)
    assert [r["jobid"] for r in page2 + page3] == [3, 2, 1] and nxt3 is None
    s = store.summary(Filters())
    assert (s["jobs"], s["done"], s["exit"]) == (5, 2, 3)
    assert s["cpu_hours"] == pytest.approx(750 / 3600) and s["wall_hours"] == pytest.approx(1500 / 3600)
    assert (s["wait"]["p50"], s["wait"]["p90"], s["wait"]["p99"]) == (3.0, 20.0, 20.0)
    assert s["failures"] == {"exit status 1": 2, "exit status 137": 1}
    bob = store.summary(Filters(owner="bob"))
    assert (bob["jobs"], bob["wait"]["mean"]) == (2, 15.0)


def test_authorization_from_the_attached_identity(store: Store) -> None:
    _fill(store)
    alice, ops = {"user": "alice", "admin": False}, {"user": "ops", "admin": True}
    assert {r["jobid"] for r in answer(store, "history.jobs", {}, alice)["rows"]} == {1, 2, 3}
    assert len(answer(store, "history.jobs", {}, ops)["rows"]) == 5
    with pytest.raises(RemoteError, match="only their own"):
        answer(store, "history.jobs", {"owner": "bob"}, alice)
    with pytest.raises(RemoteError, match="belongs to bob"):
        answer(store, "history.job", {"jobid": 4}, alice)
    with pytest.raises(RemoteError, match="belongs to bob"):
        answer(store, "history.events", {"jobid": 4}, alice)
    assert answer(store, "history.job", {"jobid": 4}, ops)["user"] == "bob"
    assert answer(store, "history.summary", {}, alice)["jobs"] == 3
    with pytest.raises(RemoteError) as bad:
        answer(store, "history.jobs", {"cursor": "nonsense"}, ops)
    assert bad.value.code == "INVALID" and "argument 'cursor'" in bad.value.message
    # Numbers that parse but are no time or id of this store (the REST fuzzer's finds: "inf"
    # and "nan" reached int() and a 1e30 id SQLite's integers, and the API answered 500).
    for op, args in (("history.jobs", {}), ("history.events", {}), ("history.events", {"jobid": 1})):
        for cursor in ("inf", "nan", "-inf", "1e30", "1:2", "1e30:1:1", "1:1e30:1", "nan:1:1"):
            if op == "history.jobs" and cursor.count(":") != 2:
                cursor = f"{cursor}:1:1"
            with pytest.raises(RemoteError) as odd:
                answer(store, op, {**args, "cursor": cursor}, ops)
            assert odd.value.code == "INVALID", (op, cursor)
    with pytest.raises(RemoteError) as none:
        answer(store, "history.job", {"jobid": 99}, ops)
    assert none.value.code == "NOT_FOUND"


def test_retention_by_age_and_size_in_bounded_batches(store: Store) -> None:
    _fill(store)
    count = lambda t: int(store._exec(f"SELECT count(*) FROM {t}").fetchone()[0])  # noqa: E731
    assert store.prune(keep_days=365, max_rows=0, batch=100, now=NOW) == 0
    assert store.prune(keep_days=0, max_rows=3, batch=1, now=NOW) == 1  # one a pass
    assert count("attempts") == 4
    store.prune(keep_days=0, max_rows=3, batch=100, now=NOW)
    assert count("attempts") == 3
    assert sorted(r["jobid"] for r in store.jobs(Filters(), 10)[0]) == [3, 4, 5]  # oldest went
    store.prune(keep_days=1, max_rows=0, batch=1000, now=NOW + 3 * 86400)
    assert count("attempts") == 0 and count("events") == 0


def test_a_large_batch_written_twice_is_written_once(store: Store) -> None:
    tr = Tracker()
    batch = Batch()
    for jobid in range(1, 101):  # 400 events, 100 attempts: PostgreSQL takes them through COPY
        j = job(jobid, "alice")
        for change in ({}, {"state": "RUN", "alloc": [{"host": "n1", "ntasks": 1}]}, {"start_time": NOW - 5},
                       {"state": "DONE", "end_time": NOW, "exit_status": 0}):
            j.update(change)
            batch.extend(tr.on_job(dict(j), NOW, store.views))
    store.write(batch)
    store.write(batch)
    count = lambda t: int(store._exec(f"SELECT count(*) FROM {t}").fetchone()[0])  # noqa: E731
    assert (count("attempts"), count("events")) == (100, 400)
    assert store.views([7])[7].state == "DONE"
