"""The replica: records kept by the sync's rules (snapshot reset, deltas, newest revision wins,
removals, scopes, volatile kinds) and the observer that follows it."""

from __future__ import annotations

from typing import Any

import pytest
from loguru import logger

from xcecore.replica import CLUSTER_KEY, Replica, ReplicaObserver, record_key
from xcecore.role import ALL_PUSHES, NO_PUSHES, Subscription


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def caplog_xce() -> Any:
    lines = Lines()
    handler = logger.add(lambda m: lines.lines.append(m.record["message"]), level="DEBUG")
    yield lines
    logger.remove(handler)


class Spy(ReplicaObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        self.calls.append(("begin", mode, kinds))

    def changed(self, kind: str, key: Any, old: Any, new: Any) -> None:
        self.calls.append(("changed", kind, key, None if old is None else old.get("rev"),
                           None if new is None else new.get("rev")))

    def sync_ended(self, mode: str) -> None:
        self.calls.append(("end", mode))


def job(jobid: int, rev: int, state: str = "PEND", host: str | None = None) -> dict[str, Any]:
    alloc = [{"host": host, "ntasks": 1}] if host else []
    return {"jobid": jobid, "rev": rev, "state": state, "alloc": alloc}


def sync(rep: Replica, mode: str, frames: list[tuple[str, Any]], rev: int = 10, store: str = "s1") -> None:
    rep.apply("sync_begin", {"mode": mode, "store": store, "rev": rev, "since": None})
    for event, data in frames:
        rep.apply(event, data)
    rep.apply("sync_end", {"rev": rev})


def test_a_snapshot_replaces_and_a_delta_keeps_what_is_held() -> None:
    spy = Spy()
    rep = Replica(ALL_PUSHES, observer=spy)
    assert not rep.complete
    sync(rep, "snapshot", [("sync_records", {"kind": "jobs", "items": [job(1, 3), job(2, 4)]}),
                           ("sync_records", {"kind": "hosts", "items": [{"name": "h1", "rev": 5}]}),
                           ("sync_records", {"kind": "cluster", "items": [{"name": "c", "rev": 1}]})])
    assert rep.complete and rep.syncs == 1 and rep.rev == 10 and rep.store == "s1"
    assert sorted(rep.records("jobs")) == [1, 2] and rep.get("cluster", CLUSTER_KEY)["name"] == "c"
    assert spy.calls[0] == ("begin", "snapshot", ALL_PUSHES.kinds)
    assert spy.calls[-1] == ("end", "snapshot")
    spy.calls.clear()
    sync(rep, "delta", [("sync_records", {"kind": "jobs", "items": [job(2, 11), job(3, 12)]}),
                        ("sync_removed", {"kind": "jobs", "keys": [1]})], rev=12)
    assert sorted(rep.records("jobs")) == [2, 3] and rep.get("jobs", 2)["rev"] == 11
    assert rep.count("hosts") == 1  # kept: a delta only brings what changed
    assert spy.calls == [("begin", "delta", frozenset({"resvals", "pend_reasons", "jusage", "members"})),
                         ("changed", "jobs", 2, 4, 11), ("changed", "jobs", 3, None, 12),
                         ("changed", "jobs", 1, 3, None), ("end", "delta")]
    spy.calls.clear()
    sync(rep, "snapshot", [("sync_records", {"kind": "jobs", "items": [job(9, 13)]})], rev=13)
    assert list(rep.records("jobs")) == [9] and rep.count("hosts") == 0
    assert spy.calls[1] == ("changed", "jobs", 9, None, 13)  # the reset itself is sync_begun's


def test_newest_revision_wins_and_a_removal_during_a_sync_is_not_undone() -> None:
    rep = Replica(ALL_PUSHES)
    rep.apply("sync_begin", {"mode": "snapshot", "store": "s", "rev": 10})
    rep.apply("job", job(5, 12, "RUN"))  # an ordinary push, before the snapshot's copy of 5
    rep.apply("job_removed", {"jobids": [6], "rev": 13})
    rep.apply("sync_records", {"kind": "jobs", "items": [job(5, 8), job(6, 9), job(7, 9)]})
    assert rep.get("jobs", 5)["state"] == "RUN"  # the older copy lost
    assert rep.get("jobs", 6) is None  # removed at 13: its copy of rev 9 does not bring it back
    assert rep.put("jobs", job(5, 12, "USUSP"))  # an equal revision is applied (>=)
    rep.apply("sync_end", {"rev": 10})
    assert sorted(rep.records("jobs")) == [5, 7]
    # After the sync the tombstones are gone; a record without a revision is always applied.
    assert rep.put("hosts", {"name": "h"}) and rep.put("hosts", {"name": "h", "x": 1})
    assert rep.get("hosts", "h") == {"name": "h", "x": 1}
    assert not rep.put("jobs", job(5, 11))


def test_scopes_keep_only_what_the_member_subscribed_to() -> None:
    sub = Subscription.of(jobs="host", hosts="own", resvals="own", queues="all")
    rep = Replica(sub, host="n1")
    sync(rep, "snapshot", [("sync_records", {"kind": "jobs", "items": [
        job(1, 1, "RUN", "n1"), job(2, 1, "RUN", "n2"), job(3, 1, "PEND")]}),
        ("sync_records", {"kind": "hosts", "items": [{"name": "n1", "rev": 1}, {"name": "n2", "rev": 1}]}),
        ("sync_records", {"kind": "resvals", "items": [{"host": "n1", "values": {}},
                                                       {"host": "n2", "values": {}}]})])
    assert list(rep.records("jobs")) == [1] and list(rep.records("hosts")) == ["n1"]
    assert list(rep.records("resvals")) == ["n1"]
    rep.apply("job", job(1, 2, "DONE", "n1"))  # sent once more as it left the scope: dropped
    assert rep.count("jobs") == 0
    assert rep.apply("member", {"identity": "x", "role": "r", "joined": True})  # not subscribed
    assert rep.count("members") == 0 and set(rep) == sub.kinds == {"jobs", "hosts", "resvals", "queues"}
    unfinished = Replica(Subscription.of(jobs="unfinished"))
    sync(unfinished, "snapshot", [("sync_records", {"kind": "jobs", "items": [
        job(1, 1, "PEND"), job(2, 1, "PSUSP"), job(3, 1, "RUN", "n"), job(4, 1, "EXIT")]})])
    assert sorted(unfinished.records("jobs")) == [1, 2, 3]
    unfinished.apply("job", job(3, 2, "DONE", "n"))
    assert sorted(unfinished.records("jobs")) == [1, 2]


def test_volatile_kinds_are_replaced_by_every_sync_and_follow_their_pushes() -> None:
    spy = Spy()
    rep = Replica(ALL_PUSHES, observer=spy)
    sync(rep, "snapshot", [("sync_records", {"kind": "pend_reasons", "items": [{"jobid": 1, "reason": "a"}]}),
                           ("sync_records", {"kind": "members", "items": [{"identity": "s@h", "role": "s"}]})])
    rep.apply("pend_reasons", {"reasons": {"2": "b", "1": None}})
    rep.apply("resvals", {"host": "h1", "values": {"r1m": 1.0}})
    rep.apply("jusage", {"jobid": 4, "usage": {"cpu": 1}})
    rep.apply("member", {"identity": "w@n", "role": "worker", "joined": True})
    rep.apply("member", {"identity": "s@h", "role": "s", "joined": False})
    assert rep.records("pend_reasons") == {2: {"jobid": 2, "reason": "b"}}
    assert list(rep.records("members")) == ["w@n"]
    assert rep.get("members", "w@n") == {"identity": "w@n", "role": "worker"}
    assert rep.get("resvals", "h1")["values"] == {"r1m": 1.0} and rep.count("jusage") == 1
    # A delta (say, to a new primary that has none of them) replaces the volatile kinds.
    sync(rep, "delta", [("sync_records", {"kind": "pend_reasons", "items": [{"jobid": 3, "reason": "c"}]})])
    assert list(rep.records("pend_reasons")) == [3]
    assert rep.count("resvals") == rep.count("members") == rep.count("jusage") == 0


def test_malformed_frames_are_logged_and_skipped_and_other_events_are_the_roles(caplog_xce) -> None:
    class Boom(ReplicaObserver):
        def changed(self, kind: str, key: Any, old: Any, new: Any) -> None:
            raise RuntimeError("observer bug")

    rep = Replica(ALL_PUSHES, observer=Boom(), name="probe@h")
    assert rep.apply("signal", {"jobid": 1}) is False and rep.apply("shutdown", {}) is False
    assert rep.apply("sync_begin", {"mode": "sideways"})  # handled (and refused)
    assert not rep.syncing
    rep.apply("sync_begin", {"mode": "snapshot", "store": "s", "rev": 1})
    rep.apply("sync_records", {"kind": "jobs", "items": [{"jobid": "x"}, 5, {"no": 1}, job(1, 1)]})
    rep.apply("sync_records", {"kind": "jobs", "items": "nope"})
    rep.apply("sync_records", ["not", "an", "object"])
    rep.apply("sync_removed", {"kind": "jobs", "keys": 7})
    rep.apply("job", {"jobid": 2.5})
    rep.apply("pend_reasons", {"reasons": {"abc": "x"}})
    rep.apply("sync_end", {"rev": 1})
    assert list(rep.records("jobs")) == [1] and rep.complete  # the good record, despite the observer
    text = caplog_xce.text
    assert "3 malformed jobs record(s) in a sync frame skipped" in text
    assert "malformed sync_begin push ignored" in text and "observer failed on jobs 1" in text
    assert "malformed job push ignored" in text and "malformed pend_reasons push ignored" in text
    rep.apply("sync_end", {"rev": 2})
    assert "sync_end without a sync in progress" in caplog_xce.text and rep.syncs == 1


def test_nothing_subscribed_holds_nothing_and_keys_are_checked() -> None:
    rep = Replica(NO_PUSHES)
    sync(rep, "snapshot", [("sync_records", {"kind": "jobs", "items": [job(1, 1)]})])
    assert rep.complete and list(rep) == [] and rep.records("jobs") == {}
    assert record_key("hosts", {"name": "h"}) == "h"
    with pytest.raises(TypeError, match="jobid must be an integer"):
        record_key("jobs", {"jobid": "1"})
    with pytest.raises(TypeError, match="name must be a string"):
        record_key("queues", {"name": 1})
    with pytest.raises(KeyError):
        record_key("members", {})


def test_subscription_records_check_kinds_and_scopes() -> None:
    sub = Subscription.of(jobs="unfinished", cluster="all", hosts="all")
    assert sub.to_wire() == {"cluster": "all", "hosts": "all", "jobs": "unfinished"}
    assert sub.scope("jobs") == "unfinished" and sub.scope("members") is None
    assert NO_PUSHES.to_wire() == {} and set(ALL_PUSHES.to_wire().values()) == {"all"}
    with pytest.raises(ValueError, match="unknown kind 'job'"):
        Subscription.of(job="all")
    with pytest.raises(ValueError, match="kind 'queues' takes scope 'all', not 'own'"):
        Subscription.of(queues="own")
    with pytest.raises(ValueError, match="given twice"):
        Subscription((("jobs", "all"), ("jobs", "host")))


def test_a_snapshot_pauses_the_cyclic_collector_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import xcecore.replica as replica_module

    assert gc.isenabled()
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    try:
        rep = Replica(ALL_PUSHES)
        rep.apply("sync_begin", {"mode": "snapshot", "store": "s", "rev": 1})
        assert not gc.isenabled()
        rep.apply("sync_records", {"kind": "jobs", "items": [job(1, 1)]})
        rep.apply("sync_end", {"rev": 1})
        assert gc.isenabled() and frozen == [1]
        rep.apply("sync_begin", {"mode": "delta", "store": "s", "rev": 2})
        assert gc.isenabled(), "a delta brings little: the collector stays on"
        rep.apply("sync_end", {"rev": 2})
        # A snapshot that does not end in time gets the collector back at its next frame.
        monkeypatch.setattr(replica_module, "GC_PAUSE_MAX", 0.0)
        rep.apply("sync_begin", {"mode": "snapshot", "store": "s", "rev": 3})
        assert not gc.isenabled()
        rep.apply("sync_records", {"kind": "jobs", "items": []})
        assert gc.isenabled() and frozen == [1]
        quiet = Replica(ALL_PUSHES, manage_gc=False)
        quiet.apply("sync_begin", {"mode": "snapshot", "store": "s", "rev": 1})
        assert gc.isenabled()
    finally:
        gc.enable()
