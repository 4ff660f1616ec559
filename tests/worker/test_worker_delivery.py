"""Fast report delivery: the journal's group commit and unsynced acks, per-job ordered
concurrent delivery (``Journal.take`` and notifier lanes), and the wrapper's status file."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from xce_worker.notifier import Notifier
from xce_worker.procman import ProcessManager
from xce_worker.spool import Journal

from xcecore.testing import wait_for

pytestmark = pytest.mark.timeout(60)


def start(jobid: int) -> dict[str, Any]:
    return {"jobid": jobid, "event": "start", "pid": 100 + jobid, "attempt": 0}


def finish(jobid: int) -> dict[str, Any]:
    return {"jobid": jobid, "event": "finish", "exit_status": 0, "attempt": 0}


def count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr("xce_worker.spool.os.fsync", fsync)
    return calls


def _run_until_drained(n: Notifier, j: Journal) -> None:
    """Run the notifier on its own thread until every report is delivered, then stop it."""
    stop = threading.Event()
    t = threading.Thread(target=n.run, args=(stop,))
    t.start()
    try:
        assert j.wait_drained(10)
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_acks_are_written_not_fsynced_and_survive_reopen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs = count_fsyncs(monkeypatch)
    j = Journal(tmp_path / "j.jsonl")
    assert j.claim(1, 0) and len(fsyncs) == 1
    n1 = j.record_run(1, 0, 101, 5.0, "/s", note=start(1))
    assert n1 is not None and len(fsyncs) == 2  # the run record and its start note: one fsync
    n2 = j.notify(finish(1))
    assert len(fsyncs) == 3
    j.ack(n1)
    assert len(fsyncs) == 3  # an ack is not fsynced: losing it only means a redelivery
    j.close()
    k = Journal(tmp_path / "j.jsonl")  # a crashed process's writes are in the page cache
    assert [n.n for n in k.pending()] == [n2]
    entry = k.known(1, 0)
    assert entry is not None and entry.pid == 101 and entry.ended


def test_take_keeps_each_jobs_order_and_lets_other_jobs_through(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    a1, a2, b1 = j.notify(start(1)), j.notify(finish(1)), j.notify(start(2))
    first = j.take(0)
    assert first is not None and first.n == a1
    second = j.take(0)  # job 1's finish waits for its start: job 2 goes meanwhile
    assert second is not None and second.n == b1
    assert j.take(0) is None
    j.release(a1)  # not delivered: taken again before anything of job 1 that follows it
    again = j.take(0)
    assert again is not None and again.n == a1
    j.ack(a1)
    third = j.take(0)
    assert third is not None and third.n == a2
    j.ack(b1)
    j.ack(a2)
    assert j.pending() == [] and j.take(0) is None


def test_notes_published_out_of_order_are_delivered_in_order(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    with j._lock:  # two notes written; the newer one becomes durable first
        older = j._new_note(finish(1))
        newer = j._new_note(finish(2))
        j._write({"k": "note", "n": older, "args": finish(1)},
                 {"k": "note", "n": newer, "args": finish(2)})
    j._publish(newer)
    j._publish(older)
    assert [n.n for n in j.pending()] == [older, newer]


def test_concurrent_appends_share_fsyncs_and_lose_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs = count_fsyncs(monkeypatch)
    j = Journal(tmp_path / "j.jsonl")

    def report(base: int) -> None:
        for i in range(50):
            j.notify(finish(base + i))

    threads = [threading.Thread(target=report, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = [n.n for n in j.pending()]
    assert numbers == sorted(numbers) and len(numbers) == 200
    assert len(fsyncs) <= 200
    j.close()
    assert len(Journal(tmp_path / "j.jsonl").pending()) == 200


def test_compaction_keeps_notes_written_but_not_yet_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Journal, "COMPACT_AFTER", 2)
    j = Journal(tmp_path / "j.jsonl")
    n1 = j.notify(finish(1))
    with j._lock:  # another thread has written note 2 and not yet fsynced it
        n2 = j._new_note(finish(2))
        j._write({"k": "note", "n": n2, "args": finish(2)})
    j.ack(n1)  # compacts
    j._publish(n2)
    j.close()
    assert [n.n for n in Journal(tmp_path / "j.jsonl").pending()] == [n2]


def test_lanes_deliver_jobs_concurrently_each_once_and_in_job_order(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    for jobid in range(1, 21):
        j.notify(start(jobid))
        j.notify(finish(jobid))
    lock = threading.Lock()
    sent: list[tuple[int, str]] = []
    inflight, most = [0], [0]

    def call(op: str, args: dict[str, Any]) -> Any:
        with lock:
            inflight[0] += 1
            most[0] = max(most[0], inflight[0])
        time.sleep(0.005)  # a round trip to the controller
        with lock:
            inflight[0] -= 1
            sent.append((args["jobid"], args["event"]))
        return {}

    n = Notifier("h", j, call, retry_delay=0.01, lanes=4)
    _run_until_drained(n, j)
    assert sorted(sent) == sorted((i, e) for i in range(1, 21) for e in ("start", "finish"))
    for jobid in range(1, 21):
        assert sent.index((jobid, "start")) < sent.index((jobid, "finish"))
    assert most[0] > 1 and n.delivered == 40


def test_failed_delivery_is_retried_before_that_jobs_later_reports(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.notify(start(1))
    j.notify(finish(1))
    j.notify(finish(2))
    failures = [RuntimeError("no primary")]
    sent: list[tuple[int, str]] = []
    lock = threading.Lock()

    def call(op: str, args: dict[str, Any]) -> Any:
        with lock:
            if args["jobid"] == 1 and args["event"] == "start" and failures:
                raise failures.pop()
            sent.append((args["jobid"], args["event"]))
        return {}

    n = Notifier("h", j, call, retry_delay=0.01, lanes=3)
    _run_until_drained(n, j)
    assert sent.index((1, "start")) < sent.index((1, "finish")) and len(sent) == 3


def test_wrapper_writes_the_status_in_place(tmp_path: Path) -> None:
    pm = ProcessManager("h1", Journal(tmp_path / "s" / "journal.jsonl"), tmp_path / "s",
                        kill_grace=0.5)
    assert pm.start({"jobid": 7, "attempt": 0, "command": "exit 3", "state": "RUN",
                     "alloc": [{"host": "h1", "ntasks": 1}]})
    # The job leaves `running` a moment before its finish is journaled: wait for the report.
    wait_for(lambda: len(pm.journal.pending()) == 2, 10, what="job 7's finish report")
    status = tmp_path / "s" / "jobs" / "7.0.status"
    assert status.read_text() == "3\n"
    assert not list((tmp_path / "s" / "jobs").glob("*.tmp"))
    reports = [n.args for n in pm.journal.pending()]
    assert [r["event"] for r in reports] == ["start", "finish"]
    assert reports[1]["exit_status"] == 3
