"""The checker catches each violation it claims to, and passes a clean run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from xcecore import wire
from xcecore.client import BackendUnavailable, OutcomeUnknown
from xcecore.testing.checker import (
    FAILED,
    OK,
    UNKNOWN,
    Op,
    check,
    illegal,
    promotions_in_logs,
    runs_in,
)
from xcecore.testing.workload import classify

A, B = "127.100.0.1:7600", "127.100.0.1:7601"


def job(jobid: int, name: str, state: str = "DONE", attempt: int = 0) -> dict[str, Any]:
    return {"jobid": jobid, "name": name, "state": state, "attempt": attempt}


def submit(key: str, outcome: str, jobid: int | None, t: float, server: str | None = A) -> Op:
    op = Op("w0", "submit", key, t, outcome=outcome, completed=t + 0.01,
            server=server if outcome == OK else None)
    op.result = {"jobid": jobid} if outcome == OK else None
    return op


def clean_ops() -> list[Op]:
    return [submit("w0-1", OK, 1, 10.0), submit("w0-2", UNKNOWN, None, 11.0),
            submit("w0-3", FAILED, None, 12.0)]


def test_a_clean_run_passes() -> None:
    v = check(clean_ops(), [job(1, "w0-1"), job(2, "w0-2")], runs=[(1, 0, "n1")],
              seen={1: [(0, "PEND"), (0, "RUN")]}, promotions=[(1.0, A)],
              expected_members=["worker@n1"], members=["worker@n1", "scheduler@svc"])
    assert v.ok, v.summary()
    assert v.counts["ok"] == 1 and v.counts["unknown"] == 1 and v.counts["jobs"] == 2


def test_an_unknown_write_may_be_absent() -> None:
    assert check(clean_ops(), [job(1, "w0-1")], promotions=[(1.0, A)]).ok


def test_each_property_can_fail() -> None:
    cases = {
        "acknowledged write lost": dict(jobs=[]),
        "applied twice": dict(jobs=[job(1, "w0-1"), job(2, "w0-2"), job(3, "w0-2")]),
        "refused write applied": dict(jobs=[job(1, "w0-1"), job(3, "w0-3")]),
        "job run twice": dict(jobs=[job(1, "w0-1")], runs=[(1, 0, "n1"), (1, 0, "n2")]),
        "illegal state history": dict(jobs=[job(1, "w0-1", "RUN")], seen={1: [(0, "DONE")]}),
        "role not re-joined": dict(jobs=[job(1, "w0-1")], expected_members=["worker@n2"],
                                   members=["worker@n1"]),
    }
    for prop, kw in cases.items():
        kw.setdefault("promotions", [(1.0, A)])
        v = check(clean_ops(), **kw)  # type: ignore[arg-type]
        assert not v.ok and v.violations[prop], (prop, v.summary())
        assert all(not items for p, items in v.violations.items() if p != prop), (prop, v.summary())


def test_an_acknowledged_kill_must_not_end_done() -> None:
    kill = Op("w0", "kill", "kill:1", 20.0, outcome=OK, completed=20.01, server=A, jobid=1,
              result={"jobid": 1, "attempt": 0})
    assert not check([kill], [job(1, "x", "DONE")], promotions=[(1.0, A)]).ok
    assert check([kill], [job(1, "x", "EXIT")], promotions=[(1.0, A)]).ok


def test_a_zombie_primary_acknowledging_after_a_later_promotion_is_caught() -> None:
    promotions = [(1.0, A), (20.0, B)]
    before = submit("w0-1", OK, 1, 19.0, server=A)  # invoked before B took over: fine
    after = submit("w0-2", OK, 2, 21.0, server=B)
    zombie = submit("w0-3", OK, 3, 22.0, server=A)  # A acknowledges after B's promotion
    jobs = [job(1, "w0-1"), job(2, "w0-2"), job(3, "w0-3")]
    assert check([before, after], jobs[:2], promotions=promotions).ok
    v = check([before, after, zombie], jobs, promotions=promotions)
    assert len(v.violations["two primaries acknowledging"]) == 1, v.summary()
    assert "w0-3" in v.violations["two primaries acknowledging"][0]
    # A primary again later, after a promotion of its own: fine.
    again = submit("w0-4", OK, 4, 31.0, server=A)
    assert check([before, after, again], [*jobs[:2], job(4, "w0-4")],
                 promotions=[*promotions, (30.0, A)]).ok
    # No evidence at all is a finding, not a pass.
    assert not check([before], jobs[:1], promotions=[]).ok


def test_state_histories() -> None:
    assert illegal([(0, "PEND"), (0, "RUN"), (0, "DONE")]) is None
    assert illegal([(0, "PEND"), (0, "EXIT")]) is None  # killed while pending
    assert illegal([(0, "PEND"), (0, "DONE")]) is None  # RUN missed while re-joining
    assert illegal([(0, "RUN"), (0, "DONE"), (1, "PEND"), (1, "RUN")]) is None  # requeued
    assert illegal([(0, "RUN"), (0, "USUSP"), (0, "RUN"), (0, "EXIT")]) is None
    assert "DONE -> RUN" in (illegal([(0, "DONE"), (0, "RUN")]) or "")
    assert "RUN -> PEND" in (illegal([(0, "RUN"), (0, "PEND")]) or "")
    assert "finished" in (illegal([(0, "DONE"), (0, "EXIT")]) or "")
    assert "attempt went back" in (illegal([(1, "PEND"), (0, "PEND")]) or "")


def test_outcomes_of_failed_calls() -> None:
    assert classify(wire.RemoteError("CONFLICT", "queue closed")) == (FAILED, None)
    assert classify(wire.RemoteError("STORAGE", "disk full: rolled back")) == (FAILED, None)
    assert classify(wire.RemoteError("INTERNAL", "boom")) == (UNKNOWN, None)
    assert classify(RuntimeError("link lost")) == (UNKNOWN, None)
    assert classify(BackendUnavailable("no primary: never sent")) == (FAILED, None)
    assert classify(OutcomeUnknown("sent, no reply", rid="r-7", op="jobsubmit")) == (UNKNOWN, "r-7")


def test_an_unknown_write_once_resolved_must_match_the_state() -> None:
    applied = submit("w0-9", UNKNOWN, None, 15.0)
    applied.resolved = "applied"
    gone = submit("w0-8", UNKNOWN, None, 16.0)
    gone.resolved = "not_applied"
    assert check([applied, gone], [job(9, "w0-9")], promotions=[(1.0, A)]).ok
    v = check([applied, gone], [job(8, "w0-8")], promotions=[(1.0, A)])
    assert v.violations["acknowledged write lost"] and v.violations["refused write applied"], v.summary()


def test_evidence_from_logs_and_markers(tmp_path: Path) -> None:
    now = dt.datetime(2026, 1, 2, 10, 0, 0).timestamp()
    (tmp_path / "c0.log").write_text(
        "10:00:01.250 INFO    controller@vm | controller 127.100.0.1:7600: acquired the "
        "state-dir lock; promoted to primary (loaded 0 jobs)\n"
        "10:00:02.000 INFO    controller@vm | something else\n")
    assert promotions_in_logs([tmp_path / "c0.log", tmp_path / "none.log"], near=now) == [(now + 1.25, A)]
    (tmp_path / "c1.log").write_text(  # xcecore.log's lines: ISO 8601 with the offset
        "2026-01-02T09:00:03.500+00:00 INFO    controller@vm | controller 127.100.0.1:7600: "
        "acquired the state-dir lock; promoted to primary (loaded 0 jobs)\n")
    at = dt.datetime(2026, 1, 2, 9, 0, 3, 500000, tzinfo=dt.UTC).timestamp()
    assert promotions_in_logs([tmp_path / "c1.log"]) == [(at, A)]
    (tmp_path / "runs").write_text("1 0\n2 0\ngarbage\n")
    assert runs_in({"n1": tmp_path / "runs", "n2": tmp_path / "missing"}) == [(1, 0, "n1"), (2, 0, "n1")]
