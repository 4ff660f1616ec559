"""Storage faults keep the primary up: a commit that fails rolls back what was not committed,
writes are refused with STORAGE (naming the cause and the file) while reads, heartbeats and
pushes go on, and writes resume by themselves once the store commits again. Against a store
that fails on demand (an I/O error, through the store hook) and against a real, full tmpfs."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from ctl_testlib import Proc, RawClient, follow, join_synced, settings, start_controller, wait_listening
from loguru import logger
from test_ctl_fuzz import SyncClient
from xce_controller.jobs import Job, job_from_row
from xce_controller.server import Controller, serve
from xce_controller.state import ClusterConf, ClusterState
from xce_controller.store import SQLiteStore, Write

from xcecore.testing import wait_for
from xcecore.testing.disks import fill, tmpfs

pytestmark = pytest.mark.timeout(120)
QUEUES = ({"name": "normal", "priority": 30}, {"name": "priority", "priority": 43})


# -- rolling records back (pure) ----------------------------------------------------------------


def _copy(value: Any) -> Any:
    """A record as a store that committed it would give it back (a job: from its blobs)."""
    if isinstance(value, Job):
        return job_from_row(value._spec, value.row())
    return orjson.loads(orjson.dumps(value))


def images(st: ClusterState, keys: list[tuple[str, Any]]) -> dict[tuple[str, Any], Any]:
    """What a store that committed ``st`` as it is now would hold for ``keys``."""
    tables: dict[str, Any] = {"jobs": st.jobs, "hosts": st.hosts, "queues": st.queues}
    return {(t, k): (_copy(tables[t][k]) if k in tables[t] else None) for t, k in keys}


def fresh(imgs: dict[tuple[str, Any], Any]) -> dict[tuple[str, Any], Any]:
    """A decoded copy, as each rollback reads it from the store anew."""
    return {k: None if v is None else _copy(v) for k, v in imgs.items()}


def test_restore_undoes_a_dispatch_a_submit_a_queue_and_a_new_host() -> None:
    st = ClusterState(ClusterConf(queues=QUEUES))
    st.join_worker({"hname": "n1", "ncpus": 4}, 0.0)
    a = st.submit({"command": "a", "user": "u", "ntasks": 2}, 0.0).result["jobid"]
    committed = images(st, [("jobs", a), ("jobs", a + 1), ("hosts", "n1"), ("hosts", "n2"),
                            ("queues", "normal")])
    # What the failed writes did, in memory:
    st.dispatch(a, [{"host": "n1", "ntasks": 2}], False)
    b = st.submit({"command": "b", "user": "u"}, 0.0).result["jobid"]
    st.queue_control("normal", "close")
    st.join_worker({"hname": "n2", "ncpus": 1}, 0.0)
    st.set_resvals("n1", {"r1m": 0.5})  # volatile: kept
    st.restore(committed)
    assert st.jobs[a].state == "PEND" and st.jobs[a].alloc == ()
    assert b not in st.jobs and st.next_jobid == b + 1  # ids given out stay given out
    assert st.hosts["n1"]["used_slots"] == 0 and "n1" not in st.jobs.active_on
    assert st.hosts["n1"]["resvals"] == {"r1m": 0.5}
    assert "n2" not in st.hosts and "n2" not in st.last_seen
    assert st.queues["normal"]["open"] is True and st.queues["normal"]["status"] == "Open:Active"
    assert st.queues["normal"]["priority"] == 30


def test_restore_of_a_finish_gives_the_slots_back_to_the_job() -> None:
    st = ClusterState(ClusterConf(queues=QUEUES))
    st.join_worker({"hname": "n1", "ncpus": 2}, 0.0)
    j = st.submit({"command": "a", "user": "u"}, 0.0).result["jobid"]
    st.dispatch(j, [{"host": "n1", "ntasks": 1}], False)
    st.set_jusage("n1", j, {"mem": 1.0})
    committed = images(st, [("jobs", j), ("hosts", "n1")])
    st.notify("n1", {"jobid": j, "event": "finish", "exit_status": 0}, 1.0)
    st.set_jusage("n1", j, {"mem": 2.0})
    st.restore(fresh(committed))
    assert st.jobs[j].state == "RUN" and st.hosts["n1"]["used_slots"] == 1
    assert st.jobs.active_on["n1"] == {j} and st.jobs[j].usage == {"mem": 2.0}
    st.restore(fresh(committed), keep_volatile=False)  # a record that cannot be encoded: all of it
    assert st.jobs[j].usage == {"mem": 1.0}


# -- a store that fails on demand (through the store hook) ------------------------------------------


class FlakyStore(SQLiteStore):
    """SQLite whose commits fail with an I/O error while ``failing`` is set."""

    failing = False

    def commit_now(self, writes: list[Write]) -> None:
        if self.failing:
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorname = "SQLITE_IOERR_WRITE"  # type: ignore[attr-defined]
            raise exc
        super().commit_now(writes)


@contextlib.asynccontextmanager
async def flaky(state_dir: Path) -> AsyncIterator[tuple[Controller, FlakyStore]]:
    stores: list[FlakyStore] = []

    def make(d: str) -> FlakyStore:
        stores.append(FlakyStore(d))
        return stores[-1]

    async with anyio.create_task_group() as tg:
        ctl: Controller = await tg.start(
            lambda task_status: serve(settings(state_dir, storage_retry=0.1), store_factory=make,
                                      task_status=task_status))
        with anyio.fail_after(10):
            await ctl.promoted.wait()
        try:
            yield ctl, stores[0]
        finally:
            tg.cancel_scope.cancel()


@pytest.fixture
def lines() -> Iterator[list[str]]:
    got: list[str] = []
    handler = logger.add(got.append, level="INFO", format="{message}")
    yield got
    logger.remove(handler)


@pytest.mark.anyio
async def test_a_failing_store_rolls_back_refuses_writes_and_recovers(tmp_path: Path, lines: list[str]) -> None:
    async with flaky(tmp_path) as (ctl, store):
        sched = await RawClient.connect(ctl.address, "scheduler@s")
        _, sched_view = await join_synced(sched, {"role": "scheduler"})
        worker = await RawClient.connect(ctl.address, "worker@n1")
        _, worker_view = await join_synced(worker, {"role": "worker", "attrs": {"hname": "n1", "ncpus": 2}})
        admin = await RawClient.connect(ctl.address, "cli@x")
        a = (await admin.ok("jobsubmit", {"command": "a"}, rid="ka"))["jobid"]

        store.failing = True
        sent = [await admin.send("jobdispatch", {"jobid": a, "alloc": [{"host": "n1", "ntasks": 1}]}),
                await admin.send("jobsubmit", {"command": "b"}, rid="kb"),
                await admin.send("jobsubmit", {"command": "c"}, rid="kc")]
        read = await admin.send("jobinfo")
        for n in sent:
            err = (await admin.reply(n))["error"]
            assert err["code"] == "STORAGE" and "I/O error" in err["message"], err
            assert err["path"] == str(tmp_path / "state.db") and "SQLITE_IOERR_WRITE" in err["cause"]
        got = await admin.reply(read)  # waited on the failed writes: answered from the rollback
        assert [(j["jobid"], j["state"], j["alloc"]) for j in got["result"]["jobs"]] == [(a, "PEND", [])]

        # Read-only while it fails: reads, heartbeats and volatile updates are served.
        jobs = (await admin.ok("jobinfo"))["jobs"]
        assert [(j["jobid"], j["state"], j["alloc"]) for j in jobs] == [(a, "PEND", [])]
        assert (await admin.ok("hostinfo"))["hosts"][0]["used_slots"] == 0
        assert await worker.ok("heartbeat")
        assert await worker.ok("update_resvals", {"values": {"r1m": 0.25}})
        refused = (await admin.call("jobsubmit", {"command": "d"}, rid="kd"))["error"]
        assert refused["code"] == "STORAGE" and "nothing changed" in refused["message"]
        assert (await admin.ok("resval", {"host": "n1"}))["hosts"]["n1"] == {"r1m": 0.25}

        # Members never saw a rolled-back change; each was synced again after the rollback.
        got = await follow(sched, sched_view, syncs=1, timeout=10)
        jobs_seen = [(p["data"]["jobid"], p["data"]["state"]) for p in got if p["push"] == "job"]
        assert jobs_seen == [(a, "PEND")]
        assert [(j["jobid"], j["state"]) for j in sched_view.records("jobs").values()] == [(a, "PEND")]
        seqs = [p["seq"] for p in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(got)))  # withdrawn: no gap
        assert sched_view.complete and sched_view.syncs == 2
        await follow(worker, worker_view, syncs=1, timeout=10)
        assert worker_view.count("jobs") == 0 and worker_view.syncs == 2  # n1: nothing runs

        store.failing = False  # the disk works again: a probe commits, writes are taken
        with anyio.fail_after(10):
            while not (reply := await admin.call("jobsubmit", {"command": "d"}, rid="kd"))["ok"]:
                assert reply["error"]["code"] == "STORAGE"
                await anyio.sleep(0.05)
        d = reply["result"]["jobid"]
        assert (await admin.ok("jobdispatch", {"jobid": a, "alloc": [{"host": "n1", "ntasks": 1}]}))["state"] == "RUN"
        assert [j["jobid"] for j in (await admin.ok("jobinfo"))["jobs"]] == [a, d]
        final = await admin.ok("jobinfo")
    fault = [m for m in lines if "cannot commit to the state store" in m]
    back = [m for m in lines if "commits again" in m]
    assert len(fault) == 1 and len(back) == 1, lines
    assert "I/O error" in fault[0] and "refusing writes" in fault[0]
    # What the primary held is what the store holds: a new primary loads the same.
    async with flaky(tmp_path) as (ctl2, _):
        c = await RawClient.connect(ctl2.address, "cli@y")
        assert await c.ok("jobinfo") == final


# -- a real full file system ---------------------------------------------------------------------


class Writers:
    """Threads submitting jobs one at a time, each recording every outcome."""

    def __init__(self, address: str, n: int) -> None:
        self.address = address
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: dict[str, int] = {}  # name -> jobid
        self.refused: list[str] = []
        self.other: list[tuple[str, Any]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        c = SyncClient(self.address, f"apiserver@w{i}")
        k = 0
        while not self.stop.is_set():
            name = f"w{i}-{k}"
            reply = c.call("jobsubmit", {"command": "sleep 0 " + "x" * 200, "name": name, "user": "u"})
            with self.lock:
                if reply["ok"]:
                    self.ok[name] = reply["result"]["jobid"]
                elif reply["error"]["code"] == "STORAGE":
                    self.refused.append(name)
                    assert "state.db" in reply["error"]["path"]
                else:
                    self.other.append((name, reply))
            k += 1
        c.close()

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.ok), len(self.refused)


def test_a_full_disk_keeps_every_candidate_up_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state", "12m") as state_dir:
        procs = [start_controller(state_dir, tmp_path, None, "--storage-retry", "0.2")]
        writers = Writers(procs[0].address, 3)
        try:
            wait_listening(procs[0].address, state="primary")
            procs += [start_controller(state_dir, tmp_path, None, "--storage-retry", "0.2") for _ in range(2)]
            for p in procs[1:]:
                wait_listening(p.address, state="standby")
            sched = SyncClient(procs[0].address, "scheduler@s")
            assert sched.call("join", {"role": "scheduler"})["ok"]
            for t in writers.threads:
                t.start()
            wait_for(lambda: writers.counts()[0] >= 100, 30, what="writes before the disk fills")
            fill(state_dir / "filler")
            wait_for(lambda: writers.counts()[1] >= 30, 60, what="writes refused on a full disk")
            # The disk stays full while the writers are refused some more (the probes fail
            # too): reads are served, standbys stand by, nothing exits.
            reader = SyncClient(procs[0].address, "apiserver@reader")
            deadline = time.monotonic() + 60
            while writers.counts()[1] < 1000:
                assert time.monotonic() < deadline, "writers stopped being refused"
                try:
                    assert reader.call("jobinfo", {"limit": 1})["ok"] and reader.call("status")["ok"]
                except ConnectionError:
                    time.sleep(0.5)  # (only to let a dying candidate's exit be seen)
                    all_alive(procs)
                    raise
                assert all(standby_state(p) == "standby" for p in procs[1:])
                assert (state_dir / "filler").exists()
            refused_at_free = writers.counts()[1]
            ok_at_free = writers.counts()[0]
            (state_dir / "filler").unlink()
            wait_for(lambda: writers.counts()[0] >= ok_at_free + 100, 60, what="writes after space returns")
            writers.stop.set()
            for t in writers.threads:
                t.join(20)
            assert not writers.other, writers.other[:3]
            assert refused_at_free >= 1000
            # Pushes went on throughout: the member got a push for every acknowledged job.
            pushed: set[str] = set()
            with contextlib.suppress(TimeoutError):
                sched.sock.settimeout(2)
                while len(pushed) < len(writers.ok):
                    msg = sched.recv()
                    if msg.get("push") == "job":
                        pushed.add(msg["data"]["name"])
            assert pushed == set(writers.ok)

            def names(address: str) -> dict[str, int]:
                c = SyncClient(address, "apiserver@check")
                try:
                    out: dict[str, int] = {}
                    args: dict[str, Any] = {"limit": 1000}
                    while True:
                        page = c.call("jobinfo", args)["result"]
                        out.update((j["name"], j["jobid"]) for j in page["jobs"])
                        if page["next"] is None:
                            return out
                        args["cursor"] = page["next"]
                finally:
                    c.close()

            held = names(procs[0].address)
            assert held == writers.ok  # every acknowledged write, no refused one
            assert not set(held) & set(writers.refused)
            all_alive(procs)
            log = procs[0].log.read_text()
            assert log.count("cannot commit to the state store") == log.count("commits again") >= 1
            assert "no space left on the device (SQLITE_FULL" in log
            # Durable, too: a standby that takes over loads exactly the acknowledged writes.
            procs[0].kill()
            new = wait_for(lambda: next((p for p in procs[1:] if standby_state(p) == "primary"), None),
                           20, what="a standby promoted")
            assert names(new.address) == writers.ok
            reader.close()
            sched.close()
        finally:
            writers.stop.set()
            for p in procs:
                p.kill()


def all_alive(procs: list[Proc]) -> None:
    """Every candidate runs (else: which one ended, how, and its last words)."""
    for p in procs:
        rc = p.popen.poll()
        assert rc is None, f"candidate {p.address} exited with {rc}:\n{p.log.read_text()[-3000:]}"


def standby_state(proc: Proc) -> str | None:
    try:
        c = SyncClient(proc.address, "apiserver@probe")
    except OSError:
        return None
    try:
        return str(c.status.get("state"))
    finally:
        c.close()
