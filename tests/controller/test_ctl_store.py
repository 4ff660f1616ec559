"""The SQLite store, the election, and recovery of state by a new primary (in process)."""

from __future__ import annotations

import queue
import threading

import anyio
import orjson
import pytest
from ctl_testlib import RawClient, running
from xce_controller.election import FileLockElection
from xce_controller.jobs import Job, JobTable
from xce_controller.state import ClusterConf, ClusterState
from xce_controller.store import SQLiteStore, Write

pytestmark = pytest.mark.anyio


def _job_row(i: int) -> tuple[str, int, bytes, bytes]:
    job = Job(b'{"command":"x"}', i, "u", "normal", "", 1, "PEND", 0.0)
    return ("jobs", i, job.row(), job._spec)


def test_group_commit_revs_and_idempotency_keys(tmp_path):
    store = SQLiteStore(str(tmp_path))
    store.open()
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    for i in range(1, 501):
        store.submit(Write([_job_row(i)], f"r{i}", orjson.dumps({"jobid": i}), rev=i))
    store.stop()
    batches: list[int] = []
    store.run_writer(lambda b: batches.append(len(b)))
    assert sum(batches) == 500 and len(batches) == store.commits == 1  # one transaction
    assert orjson.loads(store.lookup("r7") or b"") == {"jobid": 7}
    store.close()
    again = SQLiteStore(str(tmp_path))
    again.open()
    head = again.head()
    assert (head.rev, head.max_jobid, head.next_jobid) == (500, 500, 501)
    assert len(again.load_jobs(head.max_jobid, 60.0)) == 500
    keys: dict[str, float] = {}
    assert again.load_idem(0.0, keys.__setitem__) == 500 and "r500" in keys
    assert again.db.execute("SELECT rev FROM jobs WHERE key = 7").fetchone() == (7,)
    window, floor = again.load_window(100, 0)
    assert [c.rev for c in window] == list(range(401, 501)) and floor == 400
    again.close()


def test_failed_commit_fails_its_epoch_and_the_writer_goes_on(tmp_path):
    store = SQLiteStore(str(tmp_path))
    store.open()
    reports: queue.SimpleQueue[list[Write]] = queue.SimpleQueue()
    writer = threading.Thread(target=store.run_writer, args=(reports.put,), daemon=True)
    writer.start()
    try:
        store.submit(Write([("nosuchtable", 1, b"{}", None)], "r1", rev=1))
        failed = reports.get(timeout=10)
        assert [w.rid for w in failed] == ["r1"]
        fault = failed[0].error
        assert fault is not None and "unknown table" in fault.cause and fault.path == str(store.path)
        # Built (by the caller) on the failed write: failed too, without an attempt.
        store.submit(Write([_job_row(1)], "r2", rev=2))
        doomed = reports.get(timeout=10)
        assert [w.rid for w in doomed] == ["r2"] and doomed[0].error == fault
        assert store.commits == 0
        store.resume()  # the caller rolled back: a new epoch is attempted again
        store.submit(Write([_job_row(2)], "r3", rev=1))
        ok = reports.get(timeout=10)
        assert [w.rid for w in ok] == ["r3"] and ok[0].error is None
    finally:
        store.stop()
        writer.join(10)
    assert not writer.is_alive()
    assert store.lookup("r1") is None and store.lookup("r2") is None
    assert store.lookup("r3") == b"null" and store.commits == 1
    images = store.committed([("jobs", 1), ("jobs", 2)])
    assert images[("jobs", 1)] is None and images[("jobs", 2)] == (_job_row(2)[2], _job_row(2)[3])
    assert store.head().rev == 1
    store.close()


def test_election_lock_and_address(tmp_path):
    a, b = FileLockElection(str(tmp_path), "h:1"), FileLockElection(str(tmp_path), "h:2")
    assert a.try_acquire() and not b.try_acquire()
    a.publish()
    assert b.current_primary() == "h:1"
    got = threading.Event()
    t = threading.Thread(target=lambda: b.wait() and got.set(), daemon=True)
    t.start()
    assert not got.wait(0.1)
    a.release()
    assert got.wait(2) and b.is_primary
    assert b.current_primary() is None  # a released primary withdraws its address
    b.release()


def test_state_load_recomputes_slots(tmp_path):
    st = ClusterState(ClusterConf(queues=({"name": "normal", "priority": 30},)))
    st.join_worker({"hname": "n1", "ncpus": 4}, 0.0)
    j = st.submit({"command": "x", "user": "u", "ntasks": 3}, 0.0).result["jobid"]
    st.dispatch(j, [{"host": "n1", "ntasks": 3}], False)

    st2 = ClusterState(st.conf)
    st2.take_head({"n1": {**st.hosts["n1"], "used_slots": 0}}, {}, 1, 1.0)
    st2.take_jobs(JobTable.build(list(st.jobs.values())))
    assert st2.hosts["n1"]["used_slots"] == 3 and st2.next_jobid == j + 1


async def test_new_primary_recovers_everything(tmp_path):
    async with running(tmp_path) as ctl:
        w = await RawClient.connect(ctl.address, "worker@n1")
        await w.ok("join", {"role": "worker", "attrs": {"hname": "n1", "ncpus": 4}})
        admin = await RawClient.connect(ctl.address, "cli@x")
        ids = [(await admin.ok("jobsubmit", {"command": f"c{i}"}, rid=f"k{i}"))["jobid"] for i in range(5)]
        await admin.ok("jobdispatch", {"jobid": ids[0], "alloc": [{"host": "n1", "ntasks": 1}]})
        await admin.ok("queuectrl", {"queue": "priority", "action": "close"}, rid="q1")
        await admin.ok("hostctrl", {"host": "n1", "action": "close", "comment": "disk"})
        before = await admin.ok("jobinfo")
        hosts_before = await admin.ok("hostinfo")
    async with running(tmp_path) as ctl2:
        c = await RawClient.connect(ctl2.address, "cli@x")
        assert await c.ok("jobinfo") == before
        h = (await c.ok("hostinfo"))["hosts"][0]
        assert h["closed"] and h["comment"] == "disk" and h["used_slots"] == 1
        assert h == {**hosts_before["hosts"][0], "joined_at": h["joined_at"]}
        assert (await c.ok("queueinfo", {"queues": ["priority"]}))["queues"][0]["open"] is False
        # the stored result is returned, nothing is applied again
        assert (await c.ok("jobsubmit", {"command": "c3"}, rid="k3"))["jobid"] == ids[3]
        assert len((await c.ok("jobinfo"))["jobs"]) == 5
        assert (await c.ok("jobsubmit", {"command": "new"}))["jobid"] == ids[-1] + 1


async def test_duplicate_rid_while_first_copy_commits(tmp_path):
    async with running(tmp_path) as ctl:
        c = await RawClient.connect(ctl.address, "apiserver@x")
        n = [await c.send("jobsubmit", {"command": "dup", "user": "u"}, rid="same") for _ in range(20)]
        results = [await c.reply(i) for i in n]
        assert all(r["ok"] and r["result"] == results[0]["result"] for r in results)
        assert len((await c.ok("jobinfo"))["jobs"]) == 1


async def test_pipelined_writes_are_grouped(tmp_path):
    async with running(tmp_path) as ctl:
        c = await RawClient.connect(ctl.address, "apiserver@x")
        n = [await c.send("jobsubmit", {"command": "p", "user": "u"}, rid=f"p{i}") for i in range(300)]
        with anyio.fail_after(10):
            results = [await c.reply(i) for i in n]
        assert [r["result"]["jobid"] for r in results] == list(range(1, 301))
        assert ctl.store.commits < 300


class NeverElected(FileLockElection):
    """A swapped-in election (as a site's hook would return) that never wins."""

    def try_acquire(self) -> bool:
        return False

    def wait(self) -> bool:
        self._abandoned.wait()
        return False


async def test_standby_without_primary_answers_no_primary(tmp_path):
    from ctl_testlib import settings
    from xce_controller.server import serve

    async with anyio.create_task_group() as tg:
        ctl = await tg.start(lambda task_status: serve(settings(tmp_path), election_factory=NeverElected,
                                                       task_status=task_status))
        c = await RawClient.connect(ctl.address)
        assert {k: v for k, v in c.hello.items() if k != "identity"} == \
            {"ok": True, "server": ctl.address, "state": "standby", "primary": None}
        assert c.hello["identity"]["method"] == "key"
        e = (await c.call("jobinfo"))["error"]
        assert e["code"] == "NO_PRIMARY" and e["primary"] is None
        (tmp_path / "primary").write_text("10.0.0.9:7600\n")
        assert (await c.call("hello"))["error"] == {
            "primary": "10.0.0.9:7600", "code": "REDIRECT", "message": "standby; primary is 10.0.0.9:7600"}
        await c.aclose()
        tg.cancel_scope.cancel()


def test_new_store_keys_hot_tables_without_rowid_and_an_older_store_still_works(tmp_path):
    """meta, idem and events are WITHOUT ROWID in a new store (one b-tree page per commit
    each, not two); a store whose tables were made as rowid tables opens, commits and is
    read back by the same SQL."""
    import sqlite3

    store = SQLiteStore(str(tmp_path / "new"))
    store.open()
    sql = dict(store.db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    assert {t for t in ("meta", "idem", "events") if "WITHOUT ROWID" in sql[t]} == {"meta", "idem", "events"}
    assert "WITHOUT ROWID" not in sql["jobs"]
    store.close()
    old = tmp_path / "old"
    old.mkdir()
    db = sqlite3.connect(old / "state.db")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, data BLOB);"
        "CREATE TABLE idem (rid TEXT PRIMARY KEY, result BLOB, ts REAL, rev INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE events (key TEXT PRIMARY KEY, rev INTEGER NOT NULL, data BLOB NOT NULL);")
    db.close()
    for path in (tmp_path / "new", old):
        s = SQLiteStore(str(path))
        s.open()
        s.submit(Write([_job_row(1), ("events", "000000000001", b'{"seq":1}', None)], "k1",
                       orjson.dumps({"jobid": 1}), rev=1))
        s.stop()
        s.run_writer(lambda b: None)
        assert orjson.loads(s.lookup("k1") or b"") == {"jobid": 1}
        assert s.head().rev == 1
        assert s.db.execute("SELECT data FROM events").fetchall() == [(b'{"seq":1}',)]
        s.close()
    assert "WITHOUT ROWID" not in dict(sqlite3.connect(old / "state.db").execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'"))["idem"]
