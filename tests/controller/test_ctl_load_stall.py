"""A cold load does not hold the event loop (issue #17): a real controller process loading
a store of many jobs answers ``status`` and acknowledges a write all through the load, and the
load leaves nothing in the collector's young generation for the next collection to walk."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import anyio
import pytest
from ctl_testlib import RawClient, start_controller, wait_listening
from xce_controller.jobs import Job, JobTable
from xce_controller.store import SQLiteStore
from xce_controller.storeread import UPSERT

pytestmark = pytest.mark.anyio

JOBS = 200_000
"""Enough for a load of a second or more here (the 1,000,000-job figure: bench_scale.py
``ctl_load_stall``)."""
HANG = 10.0
"""No answer for this long is a hang (a primary whose loop stalls that long is fenced)."""


def _jobs(n: int, first: int = 1) -> list[Job]:
    return [Job(b'{"command":"true"}', i, "u", "normal", f"j{i}", 1, "PEND", 0.0)
            for i in range(first, first + n)]


def _write_state(state_dir: Path, n: int) -> None:
    """A store holding ``n`` pending jobs, written directly (a fill by submissions would
    take a minute): the rows a controller writes, through its schema."""
    store = SQLiteStore(str(state_dir))
    store.open()
    db = store.db
    db.execute("BEGIN")
    db.executemany(UPSERT["jobs"], ((j.jobid, j.jobid, j._spec, j.row()) for j in _jobs(n)))
    db.executemany(UPSERT["meta"], [("rev", b"%d" % n), ("next_jobid", b"%d" % (n + 1))])
    db.execute("COMMIT")
    store.close()


def test_a_load_leaves_the_young_generation_empty() -> None:
    jobs = _jobs(20_000)
    gc.collect()
    try:
        table = JobTable.load(iter(jobs))
        young = len(gc.get_objects(generation=0))
        assert len(table) == 20_000 and table[7].name == "j7"
        # The jobs (and the test's list of them) are frozen: a collection of generation 0
        # now walks only what was made after the load, not 20,000 jobs and their indexes.
        assert young < 1_000, young
        assert gc.get_freeze_count() >= 20_000
        assert gc.isenabled()
    finally:
        gc.unfreeze()


async def test_the_loop_answers_and_takes_writes_while_a_large_store_loads(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _write_state(state, JOBS)
    proc = start_controller(state, tmp_path)
    try:
        await anyio.to_thread.run_sync(wait_listening, proc.address, 30.0, "primary")
        cli = await RawClient.connect(proc.address, "apiserver@load")
        answered_loading = 0
        longest = 0.0
        written = None
        with anyio.fail_after(300):
            while True:
                t0 = time.monotonic()
                st = await cli.ok("status")
                longest = max(longest, time.monotonic() - t0)
                if not st.get("loading"):
                    break
                answered_loading += 1
                if written is None:
                    written = await cli.ok("jobsubmit", {"command": "true", "user": "u",
                                                         "queue": "normal"})
        assert longest < HANG, f"status took {longest:.1f} s during the load"
        # Answered again and again while the jobs loaded (the load is a thread's), and a
        # write was acknowledged before the load ended, with the next id after the store's.
        assert answered_loading >= 3, answered_loading
        assert written is not None and written["jobid"] == JOBS + 1
        page = await cli.ok("jobinfo", {"user": "u", "limit": 2, "state": "PEND"})
        assert [j["jobid"] for j in page["jobs"]] == [1, 2]
        assert "loaded 200001 jobs" in proc.text() or "loaded 200000 jobs" in proc.text()
        await cli.aclose()
    finally:
        proc.kill()
        proc.popen.wait(30)
