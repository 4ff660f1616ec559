"""The worker's journal survives a full disk (ENOSPC) and a failing one (EIO): reports stay in
memory, are delivered all the same, and the journal file is rewritten once the disk takes it
again. Against a real, small tmpfs filled and freed, in a unit test and with a real worker
whose job finishes while its state directory is full."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loguru import logger
from test_worker_cluster import admin, host_up, job_state, run_job, start_worker, wait_log
from xce_worker.spool import Journal

from xcecore.testing import LocalCluster, wait_for
from xcecore.testing.disks import fill, tmpfs

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    yield lines
    logger.remove(sink)


def note(jobid: int, event: str = "finish") -> dict[str, object]:
    return {"jobid": jobid, "event": event, "exit_status": 0, "attempt": 0}


def test_journal_on_a_full_tmpfs_delivers_and_rewrites_once_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    monkeypatch.setattr(Journal, "RETRY_INTERVAL", 0.05)
    with tmpfs(tmp_path / "disk", "256k") as disk:
        path = disk / "journal.jsonl"
        j = Journal(path)
        try:
            check_full_then_freed(j, path, disk, logs)
        finally:
            j.close()


def check_full_then_freed(j: Journal, path: Path, disk: Path, logs: list[str]) -> None:
    assert j.claim(1, 0) and j.claim(2, 0)
    j.record_run(1, 0, 101, 1.0, None, note=note(1, "start"))
    ballast = disk / "ballast"
    fill(ballast)
    for i in range(3, 300):  # each claim a write: the disk is full long before the end
        assert j.claim(i, 0)
    assert j.degraded
    n = j.notify(note(1))  # job 1's finish, the report that used to be lost
    assert n in [x.n for x in j.pending()]  # deliverable although not on disk
    taken = j.take(0)
    assert taken is not None and taken.n == 1  # job 1's start first, then its finish
    j.ack(taken.n)
    taken = j.take(0)
    assert taken is not None and taken.n == n
    j.ack(n)
    j.notify(note(2))  # still to deliver when the disk comes back
    assert j.degraded
    failed = [x for x in logs if "failed (No space left on device)" in x]
    assert len(failed) == 1, logs  # once, however many writes failed
    ballast.unlink()
    wait_for(lambda: not j.degraded, 10, what="the journal to be rewritten")
    assert sum("writable again" in x for x in logs) == 1, logs
    j.claim(400, 0)  # appends again
    j.close()
    k = Journal(path)  # what the file holds: every claim and the one unacknowledged report
    try:
        assert [x.args for x in k.pending()] == [note(2)]
        assert k.known(299, 0) is not None and k.known(400, 0) is not None
        assert {e.jobid for e in k.active()} == {*range(3, 300), 400}  # 1 and 2 ended
        assert not k.claim(150, 0)  # claimed while the disk was full: never started again
    finally:
        k.close()


def test_a_failing_fsync_degrades_and_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    # EIO cannot be produced on demand by a real disk here: os.fsync fails through a patch.
    monkeypatch.setattr(Journal, "RETRY_INTERVAL", 0.05)
    real = os.fsync
    broken = [True]

    def fsync(fd: int) -> None:
        if broken[0]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    monkeypatch.setattr("xce_worker.spool.os.fsync", fsync)
    j.notify(note(7))
    assert j.degraded and [x.args for x in j.pending()] == [note(7)]
    assert sum("fsync failed (Input/output error)" in x for x in logs) == 1
    broken[0] = False
    wait_for(lambda: not j.degraded, 10, what="recovery")
    j.close()
    assert [x.args for x in Journal(path).pending()] == [note(7)]


def test_jobs_finishing_while_the_state_disk_is_full_are_reported(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    # tmpfs allocates whole pages: the first appends after the fill may still fit in the
    # journal's last page. 40 finish reports and their acks (~4.4 kB) cannot.
    njobs = 40
    cl = xce_cluster(1)
    with tmpfs(tmp_path / "w", "2m") as state:
        # The jobs' own files (status, re-adoption info, output) on another file system: a
        # job's info file removed at its end would free a page of the full disk for the
        # journal. Only the journal (and the monitors' files) stay on the full one.
        (tmp_path / "jobs").mkdir()
        (state / "jobs").symlink_to(tmp_path / "jobs")
        w = start_worker(cl, "full1", state, "w-full", f"worker.slots={njobs}")
        try:
            with admin(cl) as c:
                wait_for(lambda: host_up(c, "full1"), 20, what="host full1")
                gate = tmp_path / "gate"  # the jobs end once the disk is full
                jobs = [run_job(c, "full1", f"while [ ! -e {gate} ]; do sleep 0.2; done; exit 5")
                        for _ in range(njobs)]
                for jobid in jobs:
                    wait_log(w, f"reported job {jobid} start")
                ballast = state / "ballast"
                fill(ballast)
                gate.touch()
                for jobid in jobs:
                    job = wait_for(lambda j=jobid: (r := job_state(c, j))["state"] == "EXIT" and r,
                                   30, what=f"job {jobid}'s finish report while the disk is full")
                    assert job["exit_status"] == 5
                assert "write failed (No space left on device)" in w.text()
                assert "writable again" not in w.text()  # every report arrived while full
                ballast.unlink()
                wait_log(w, "writable again")
                later = run_job(c, "full1", "exit 6")  # the worker goes on normally
                wait_for(lambda: job_state(c, later)["state"] == "EXIT", 20, what="a later job")
            assert w.text().count("failed (No space left on device)") == 1
            assert w.text().count("writable again") == 1
        finally:
            w.stop(10)
        k = Journal(state / "journal.jsonl")
        try:
            assert k.pending() == [] and k.active() == []
            assert k.known(jobs[-1], 0) is None or k.known(jobs[-1], 0).ended  # type: ignore[union-attr]
        finally:
            k.close()
