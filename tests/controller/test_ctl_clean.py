"""Purging finished jobs after ``[controller] clean_period`` (LSF CLEAN_PERIOD): memory, the
SQLite store, the ``job_removed`` push, the job id counter, and the config key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from ctl_testlib import RawClient, reload, running, start_controller, synced_view, wait_listening
from xce_controller import plugin
from xce_controller.pushes import encode_rows
from xce_controller.settings import config_of, settings_from_config
from xce_controller.state import ClusterConf, ClusterState
from xce_controller.store import SQLiteStore, Write
from xce_controller.subscribe import default_for

from xcecore.auth.key import KeyAuth

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

QUEUES = ({"name": "normal", "priority": 30},)
HOUR = 3600.0


def _commit(state_dir: Path, rows: list[Any]) -> None:
    """Commit ``rows`` through the store's writer thread loop, as the server does."""
    store = SQLiteStore(str(state_dir))
    store.open()
    store.submit(Write(encode_rows(rows, {})))
    store.stop()
    failed: list[str | None] = []
    store.run_writer(lambda batch: failed.extend(w.error for w in batch))
    store.close()
    assert failed == [None]


def _reload(state_dir: Path) -> ClusterState:
    """What a newly promoted primary would hold."""
    return reload(state_dir, ClusterConf(queues=QUEUES))


def _cluster(t0: float) -> tuple[ClusterState, dict[str, int], list[Any]]:
    """Jobs in every situation; returns the state, the ids by name, and every row written."""
    st = ClusterState(ClusterConf(queues=QUEUES))
    rows: list[Any] = list(st.join_worker({"hname": "n1", "ncpus": 8}, t0).rows)
    ids: dict[str, int] = {}
    for name in ("old_done", "old_exit", "running", "pending", "recent", "old_killed_last"):
        ch = st.submit({"command": name, "user": "u"}, t0)
        rows += ch.rows
        ids[name] = ch.result["jobid"]
    for name in ("old_done", "old_exit", "running", "recent"):
        rows += st.dispatch(ids[name], [{"host": "n1", "ntasks": 1}], False).rows
    rows += st.notify("n1", {"jobid": ids["old_done"], "event": "finish", "exit_status": 0}, t0).rows
    rows += st.notify("n1", {"jobid": ids["old_exit"], "event": "finish", "exit_status": 3}, t0).rows
    rows += st.control(ids["old_killed_last"], "kill", t0).rows  # the highest id, finished
    rows += st.notify("n1", {"jobid": ids["recent"], "event": "finish", "exit_status": 0},
                      t0 + HOUR).rows
    return st, ids, rows


def test_old_finished_jobs_leave_memory_and_store(tmp_path: Path) -> None:
    t0 = 1_000_000.0
    st, ids, rows = _cluster(t0)
    _commit(tmp_path, rows)
    assert set(_reload(tmp_path).jobs) == set(ids.values())

    ch = st.clean_finished(t0 + HOUR + 10, HOUR, 1000)
    old = [ids["old_done"], ids["old_exit"], ids["old_killed_last"]]
    assert sorted(ch.result) == sorted(old)
    assert [(e.name, e.data, e.hosts) for e in ch.events] == [
        ("job_removed", {"jobids": ch.result}, frozenset())]  # no worker gets it
    kept = {ids["running"], ids["pending"], ids["recent"]}
    assert set(st.jobs) == kept
    assert st.clean_finished(t0 + HOUR + 10, HOUR, 1000).result == []  # nothing left to do
    _commit(tmp_path, ch.rows)

    again = _reload(tmp_path)  # a restart or a standby's promotion: they do not come back
    assert set(again.jobs) == kept
    assert again.hosts["n1"]["used_slots"] == 1  # the running job only
    # The purged highest id is never handed out again, even though no row holds it any more.
    assert again.next_jobid == ids["old_killed_last"] + 1
    assert again.submit({"command": "next", "user": "u"}, t0).result["jobid"] == ids["old_killed_last"] + 1


def test_recently_finished_jobs_wait_for_their_period_and_passes_are_bounded() -> None:
    t0 = 1_000_000.0
    st, ids, _ = _cluster(t0)
    assert st.clean_finished(t0 + HOUR - 1, HOUR, 1000).result == []  # not old enough yet
    first = st.clean_finished(t0 + HOUR + 1, HOUR, 2)
    assert len(first.result) == 2 and len([r for r in first.rows if r[0] == "jobs"]) == 2
    second = st.clean_finished(t0 + HOUR + 1, HOUR, 2)
    assert len(second.result) == 1 and not set(first.result) & set(second.result)
    assert st.clean_finished(t0 + 2 * HOUR + 1, HOUR, 2).result == [ids["recent"]]
    assert set(st.jobs) == {ids["running"], ids["pending"]}


def _seed_finished_long_ago(state_dir: Path) -> int:
    """A store holding one job that finished in 1970 and one pending job; returns the first id."""
    st = ClusterState(ClusterConf(queues=QUEUES))
    rows: list[Any] = []
    for name in ("ancient", "waiting"):
        ch = st.submit({"command": name, "user": "u"}, 1.0)
        rows += ch.rows
    rows += st.control(1, "kill", 1.0).rows
    _commit(state_dir, rows)
    return 1


async def test_primary_cleans_on_promotion_and_pushes_job_removed(tmp_path: Path) -> None:
    jobid = _seed_finished_long_ago(tmp_path)
    async with running(tmp_path) as ctl:  # clean_period: the default, 3600 s
        with anyio.fail_after(10):  # the first pass runs right after promotion and the load
            # (job 2, the unfinished one, is there once the jobs are loaded: before that, job 1
            # is absent only because it is not loaded yet)
            while 2 not in ctl.state.jobs or jobid in ctl.state.jobs:
                await anyio.sleep(0.01)
        c = await RawClient.connect(ctl.address, "cli@x")
        assert [j["jobid"] for j in (await c.ok("jobinfo"))["jobs"]] == [2]
        assert (await c.call("jobctrl", {"jobid": jobid, "action": "requeue"}))["error"]["code"] == "NOT_FOUND"
        await c.aclose()
    assert set(_reload(tmp_path).jobs) == {2}


async def test_clean_period_zero_keeps_finished_jobs(tmp_path: Path) -> None:
    jobid = _seed_finished_long_ago(tmp_path)
    async with running(tmp_path, clean_period=0) as ctl:
        assert ctl.settings.clean_period == 0
        with anyio.fail_after(10):  # loaded: job 2 is there (before the load job 1 is absent too)
            while 2 not in ctl.state.jobs:
                await anyio.sleep(0.01)
        # A cleaner would make its first pass right after the load: give a wrong one the time.
        await anyio.sleep(0.3)
        assert jobid in ctl.state.jobs
        c = await RawClient.connect(ctl.address, "cli@x")
        assert [j["jobid"] for j in (await c.ok("jobinfo"))["jobs"]] == [1, 2]
        await c.aclose()


async def test_members_drop_purged_jobs_and_ids_continue(tmp_path: Path) -> None:
    store_mod = pytest.importorskip("xce_apiserver.store")
    view_mod = pytest.importorskip("xce_scheduler.view")
    api, view = store_mod.Store(), view_mod.SchedulerView()
    async with running(tmp_path, clean_period=0.2) as ctl:
        sub = await RawClient.connect(ctl.address, "scheduler@x")
        await sub.ok("join", {"role": "scheduler", "since": None})
        while True:  # the (empty) sync, fed to both replicas
            p = await sub.push()
            api.apply(p["push"], p["data"])
            view.apply(p["push"], p["data"])
            if p["push"] == "sync_end":
                break
        c = await RawClient.connect(ctl.address, "cli@x")
        keep = (await c.ok("jobsubmit", {"command": "stays"}))["jobid"]
        gone = (await c.ok("jobsubmit", {"command": "goes"}))["jobid"]
        await c.ok("jobctrl", {"jobid": gone, "action": "kill"})  # PEND -> EXIT, the highest id
        with anyio.fail_after(10):
            while True:
                p = await sub.push()
                api.apply(p["push"], p["data"])
                view.apply(p["push"], p["data"])
                if p["push"] == "job_removed":
                    break
        assert p["data"]["jobids"] == [gone] and p["data"]["rev"] > 0
        assert api.get_job(gone) is None and api.get_job(keep) is not None
        assert set(view.replica.records("jobs")) == {keep}
        assert [j["jobid"] for j in (await c.ok("jobinfo"))["jobs"]] == [keep]
        await c.aclose()
        await sub.aclose()
    async with running(tmp_path, clean_period=0) as ctl2:  # the next primary loads the store
        c = await RawClient.connect(ctl2.address, "cli@x")
        assert [j["jobid"] for j in (await c.ok("jobinfo"))["jobs"]] == [keep]
        assert (await c.ok("jobsubmit", {"command": "new"}))["jobid"] == gone + 1
        await c.aclose()


async def test_real_process_cleans_and_logs(tmp_path: Path) -> None:
    state_dir, logs = tmp_path / "state", tmp_path / "logs"
    logs.mkdir()
    procs = []
    try:
        p = start_controller(state_dir, logs, None, "--clean-period", "0.3")
        procs.append(p)
        wait_listening(p.address, state="primary")
        c = await RawClient.connect(p.address, "cli@x")
        jobid = (await c.ok("jobsubmit", {"command": "x"}))["jobid"]
        await c.ok("jobctrl", {"jobid": jobid, "action": "kill"})
        with anyio.fail_after(15):
            while (await c.ok("jobinfo"))["jobs"]:
                await anyio.sleep(0.05)
        await c.aclose()
        p.kill()
        assert "cleaned 1 finished job(s) older than 0.3 s" in p.log.read_text()
        p2 = start_controller(state_dir, logs, None, "--clean-period", "0")
        procs.append(p2)
        wait_listening(p2.address, state="primary")
        c = await RawClient.connect(p2.address, "cli@x")
        assert (await c.ok("jobinfo"))["jobs"] == []
        assert (await c.ok("jobsubmit", {"command": "y"}))["jobid"] == jobid + 1
        await c.aclose()
    finally:
        for proc in procs:
            proc.kill()


def test_clean_period_config_key() -> None:
    (section,) = plugin.xce_config_sections()
    field = section.fields["clean_period"]
    assert field.default == 3600.0 and "0 keeps" in field.doc
    base = {"state_dir": "/tmp/x"}
    for bad in (-1, -0.5, float("nan"), "soon", True):
        with pytest.raises(ValueError, match="controller.clean_period"):
            config_of(controller={**base, "clean_period": bad})

    def period(**kw: Any) -> float:
        return settings_from_config(config_of(controller={**base, **kw}), KeyAuth(None)).clean_period

    assert period() == 3600.0
    assert period(clean_period=0) == 0.0
    assert period(clean_period=90) == 90.0


def test_meta_row_holds_the_counter(tmp_path: Path) -> None:
    st, _, rows = _cluster(1_000_000.0)
    ch = st.clean_finished(1e7, HOUR, 1000)
    assert ("meta", "next_jobid", st.next_jobid) in ch.rows
    _commit(tmp_path, rows + ch.rows)
    store = SQLiteStore(str(tmp_path))
    store.open()
    assert store.head().meta["next_jobid"] == st.next_jobid
    row = store.db.execute("SELECT data FROM meta WHERE key = 'next_jobid'").fetchone()
    assert orjson.loads(row[0]) == st.next_jobid
    store.close()


def test_worker_view_lists_only_its_active_jobs_through_the_host_index(tmp_path: Path) -> None:
    """A worker's (re-)join sync holds its running and suspended jobs, found through the
    host index (kept on dispatch, finish, requeue and load), never another host's."""
    t0 = time.time() - 60
    st, ids, rows = _cluster(t0)
    rows += st.join_worker({"hname": "n2", "ncpus": 8}, t0).rows
    other = st.submit({"command": "elsewhere", "user": "u"}, t0)
    rows += other.rows + st.dispatch(other.result["jobid"], [{"host": "n2", "ntasks": 1}], False).rows
    susp = st.submit({"command": "stopped", "user": "u"}, t0)
    rows += susp.rows + st.dispatch(susp.result["jobid"], [{"host": "n1", "ntasks": 1}], False).rows
    rows += st.control(susp.result["jobid"], "stop", t0).rows

    def view(state: ClusterState, host: str) -> list[str]:
        jobs = synced_view(state, default_for("worker", host)).records("jobs").values()
        return [j["command"] for j in jobs]

    assert view(st, "n1") == ["running", "stopped"]
    assert view(st, "n2") == ["elsewhere"]
    assert view(st, "n3") == []
    _commit(tmp_path / "state", rows)
    again = _reload(tmp_path / "state")  # the index is rebuilt by a newly promoted primary
    assert view(again, "n1") == ["running", "stopped"] and view(again, "n2") == ["elsewhere"]
    st.notify("n1", {"jobid": ids["running"], "event": "finish", "exit_status": 0}, t0)
    st.control(other.result["jobid"], "requeue", t0)
    assert view(st, "n1") == ["stopped"] and view(st, "n2") == []
    assert st.jobs.active_on["n1"] == {susp.result["jobid"]} and "n2" not in st.jobs.active_on
