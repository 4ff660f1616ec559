"""A standby's Delta from watch events (pure: xce_etcd.follow.delta_of) and the value layout."""

from __future__ import annotations

import orjson
import pytest
from xce_controller.jobs import Job
from xce_etcd.client import Compacted, Event, events_of
from xce_etcd.follow import delta_of
from xce_etcd.layout import (
    group_name,
    group_results,
    group_rids,
    group_value,
    job_of,
    job_value,
    second_bound,
    second_of,
)

S = b"/x/s/"
IDEM = b"/x/i/"


def job_event(i: int, rev: int, etcd_rev: int, state: str = "PEND") -> Event:
    j = Job(orjson.dumps({"command": "true"}), i, "u", "normal", "", 1, state, 1.0)
    return Event(S + b"jobs/%020d" % i, job_value(b"%d " % rev, j.row(), j._spec), etcd_rev, False)


def meta_rev(rev: int, etcd_rev: int) -> Event:
    return Event(S + b"meta/rev", str(rev).encode(), etcd_rev, False)


def test_a_job_value_holds_its_fields_and_its_submission() -> None:
    j = Job(orjson.dumps({"command": "echo 'a\nb'"}), 3, "u", "normal", "", 1, "PEND", 1.0)
    rev, data, spec = job_of(job_value(b"17 ", j.row(), j._spec))
    assert (rev, data, spec) == (17, j.row(), j._spec)  # a newline in a command is escaped


def test_events_become_records_removals_keys_and_a_rev() -> None:
    host = orjson.dumps({"name": "h1"})
    events = [
        job_event(1, 4, 100), job_event(2, 4, 100), meta_rev(4, 100),
        Event(IDEM + b"1700000000/5.1", b"r1\n{}\nr 2\nnull", 100, False),  # a group of 2 keys
        Event(IDEM + b"r0", b"1700000000.500 {}", 100, False),  # an earlier layout's: not read
        job_event(2, 5, 101, "RUN"), meta_rev(5, 101),  # job 2 changed again: the last wins
        Event(S + b"jobs/%020d" % 1, b"", 102, True), meta_rev(7, 102),  # job 1 removed at rev 7
        Event(S + b"hosts/h1", b"6 " + host, 102, False),
        Event(S + b"hosts/h9", b"", 102, True),
        Event(S + b"meta/next_jobid", b"40", 102, False),
        Event(IDEM + b"1600000000/4.9", b"", 103, True),  # an expired group: nothing to apply
        Event(b"/x/leader", b"a:1", 104, False), Event(b"/x/w", b"chain", 104, False),
        job_event(3, 8, 105), meta_rev(8, 105),
        Event(S + b"jobs/%020d" % 3, b"", 106, True), meta_rev(9, 106),  # made, then removed
    ]
    d = delta_of(events, S, IDEM, since=3)
    assert [(j.jobid, j.state) for j in d.jobs] == [(2, "RUN")]
    assert sorted(d.removed) == [("hosts", "h9", 7), ("jobs", 1, 7), ("jobs", 3, 9)]
    assert d.hosts == {"h1": {"name": "h1"}} and d.queues == {}
    assert d.idem == [("r1", 1700000000.0), ("r 2", 1700000000.0)]
    assert (d.since, d.rev, d.next_jobid) == (3, 9, 40)
    assert [c.rev for c in d.changes] == sorted(c.rev for c in d.changes)
    assert {(c.kind, c.key, c.removed) for c in d.changes} == {
        ("jobs", 2, False), ("hosts", "h1", False), ("jobs", 1, True), ("hosts", "h9", True),
        ("jobs", 3, True)}


def test_a_watch_cancelled_by_compaction_says_so() -> None:
    with pytest.raises(Compacted) as got:
        events_of({"canceled": True, "compact_revision": "42"})
    assert got.value.compact_revision == 42
    assert events_of({"created": True}) == []
    (ev,) = events_of({"events": [{"type": "DELETE", "kv": {"key": "L3gvYQ==", "mod_revision": "9"}}]})
    assert ev == Event(b"/x/a", b"", 9, True)


def test_an_idempotency_group_holds_its_keys_and_results_under_its_second() -> None:
    value = group_value([(b"a", b'{"jobid":1}'), (b"b c", b"null")])
    assert group_rids(value) == [b"a", b"b c"]
    assert group_results(value) == {b"a": b'{"jobid":1}', b"b c": b"null"}
    name = group_name(1700000001, "1f.3")
    assert name == b"1700000001/1f.3" and second_of(name) == 1700000001
    assert second_bound(1700000001) < name < second_bound(1700000002)  # a range by seconds
    assert second_of(b"r1") is None and second_of(b"1700000001x") is None  # no group's key
    with pytest.raises(ValueError, match="newline"):
        group_value([(b"a\nb", b"null")])
