"""The picker with synthetic hosts: ordering, matching, the over-commit guard, pend reasons."""

from __future__ import annotations

from typing import Any

import pytest
from sched_records import host, job, load, queue
from xce_scheduler import reasons as R
from xce_scheduler.allocator import Dispatch, ReasonBatch
from xce_scheduler.matching import Requirements, host_map
from xce_scheduler.picker import Picker

from xcecore.resreq import Evaluator

pytestmark = pytest.mark.timeout(60)

SITE = [{"name": "gpu", "type": "bool"}, {"name": "rack", "type": "string"}]


def make(hosts: list[dict[str, Any]], jobs: list[dict[str, Any]], *, queues: Any = None,
         evaluator_for: Any = Evaluator, **kw: Any) -> tuple[Picker, list[Any]]:
    from xce_scheduler.view import SchedulerView

    view = SchedulerView()
    load(view, hosts, jobs, queues, SITE)
    sent: list[Any] = []
    return Picker(view, Requirements(evaluator_for), sent.extend, **kw), sent


def dispatches(sent: list[Any]) -> dict[int, list[dict[str, Any]]]:
    return {d.jobid: d.alloc for d in sent if isinstance(d, Dispatch)}


def reasons(sent: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sent:
        if isinstance(item, ReasonBatch):
            out.update(item.reasons)
    return out


def test_host_map_from_record() -> None:
    rec = host("n1", slots=4, used=1, type="X86_64", resources=["gpu"], resvals={"r1m": 0.3})
    m = host_map(rec)
    assert m["hname"] == "n1" and m["status"] == "ok" and m["gpu"] is True
    assert m["slots"] == 3 and m["maxslots"] == 4 and m["r1m"] == 0.3 and m["ncpus"] == 4
    assert host_map(host("n2", state="closed"))["status"] == "closed"


def test_order_by_queue_priority_then_submit_time() -> None:
    jobs = [job(1, submit_time=1.0), job(2, queue="priority", submit_time=5.0),
            job(3, submit_time=0.5), job(4, submit_time=0.5)]
    picker, sent = make([host("a", slots=1)], jobs)
    assert picker.cycle() == 1
    assert list(dispatches(sent)) == [2], "the higher-priority queue goes first"
    order = []
    for _ in range(3):
        picker.view.apply("job", {**jobs[0], "jobid": order[-1] if order else 2, "state": "DONE"})
        sent.clear()
        picker.view.apply("host", host("a", slots=1))
        picker.cycle()
        order += list(dispatches(sent))
    assert order == [3, 4, 1], "then submit time, then job id"


def test_one_cycle_never_overcommits() -> None:
    jobs = [job(i) for i in range(1, 11)] + [job(11, ntasks=3)]
    picker, sent = make([host("a", slots=2), host("b", slots=2, used=1)], jobs)
    assert picker.cycle() == 3
    per_host: dict[str, int] = {}
    for alloc in dispatches(sent).values():
        for a in alloc:
            per_host[a["host"]] = per_host.get(a["host"], 0) + a["ntasks"]
    assert per_host == {"a": 2, "b": 1}
    sent.clear()
    # The controller has not answered and no push came: nothing more, nothing twice.
    picker.view.apply("host", dict(picker.view.replica.get("hosts", "a")))  # a full cycle
    assert picker.cycle() == 0 and not dispatches(sent)
    assert picker.status.idle_cycles == 0


def test_proposed_slots_count_until_the_push_arrives() -> None:
    picker, sent = make([host("a", slots=2)], [job(1), job(2), job(3)])
    picker.cycle()
    assert sorted(dispatches(sent)) == [1, 2]
    picker.answered(1, True)
    picker.answered(2, True)
    # A stale host push (used 0) must not let job 3 onto the host.
    picker.view.apply("host", host("a", slots=2, used=0))
    sent.clear()
    picker.cycle()
    assert not dispatches(sent)
    picker.view.apply("job", job(1, state="RUN"))
    picker.view.apply("job", job(2, state="DONE"))
    picker.view.apply("host", host("a", slots=2, used=1))
    sent.clear()
    picker.cycle()
    assert list(dispatches(sent)) == [3]


def test_refused_job_waits_for_the_next_push() -> None:
    picker, sent = make([host("a", slots=1)], [job(1)])
    picker.cycle()
    picker.answered(1, False)
    sent.clear()
    picker.cycle()
    assert not dispatches(sent), "same view: the refusal stands"
    picker.view.apply("host", host("a", slots=1))
    picker.cycle()
    assert list(dispatches(sent)) == [1]


def test_select_order_span_same() -> None:
    hosts = [
        host("a", slots=4, type="X86_64", resvals={"r1m": 0.9}),
        host("b", slots=4, type="X86_64", resources=["gpu"], resvals={"r1m": 0.1}, rack="r1"),
        host("c", slots=2, type="ARM", resources=["gpu"], resvals={"r1m": 0.0}, rack="r2"),
        host("d", slots=2, type="ARM", resvals={"r1m": 0.5}, rack="r2"),
    ]
    jobs = [
        job(1, resreq="select[type==X86_64] order[r1m]"),
        job(2, resreq="select[gpu] order[r1m]", ntasks=2),
        job(3, resreq="span[hosts=1] order[-r1m]", ntasks=3),
        job(4, resreq="span[ptile=1]", ntasks=2),
        job(5, resreq="same[rack] order[r1m]", ntasks=3),
    ]
    picker, sent = make(hosts, jobs)
    picker.cycle()
    got = dispatches(sent)
    assert got[1] == [{"host": "b", "ntasks": 1}]
    assert got[2] == [{"host": "c", "ntasks": 2}]
    assert got[3] == [{"host": "a", "ntasks": 3}]
    assert len(got[4]) == 2 and all(a["ntasks"] == 1 for a in got[4])
    # Job 5: rack r2 has c (full) and d (2 free): no fit; r1 has only b (3 left after 1 and 4).
    used = {h: 0 for h in "abcd"}
    for alloc in got.values():
        for a in alloc:
            used[a["host"]] += a["ntasks"]
    assert all(used[h["name"]] <= h["max_slots"] for h in hosts)


def test_same_groups_by_value() -> None:
    hosts = [host("a", slots=1, rack="r1"), host("b", slots=2, rack="r2"),
             host("c", slots=2, rack="r2")]
    picker, sent = make(hosts, [job(1, resreq="same[rack]", ntasks=3)])
    picker.cycle()
    assert sorted(a["host"] for a in dispatches(sent)[1]) == ["b", "c"]


def test_pend_reasons_and_change_only() -> None:
    hosts = [host("a", slots=1), host("b", slots=2, state="closed", resources=["gpu"]),
             host("c", slots=1, used=1, type="ARM")]
    jobs = [
        job(1),                                   # fits on a
        job(2),                                   # a is taken by job 1
        job(3, resreq="select[gpu]"),             # only b, which is closed
        job(4, resreq="select[ncpus>100]"),       # nobody
        job(5, resreq="select[gpus]"),            # typo
        job(6, queue="idle"),                     # inactive queue
        job(7, resreq="select[type==ARM]"),       # c is full
    ]
    queues = [queue("normal", 30), queue("idle", 10, active=False)]
    picker, sent = make(hosts, jobs, queues=queues)
    picker.cycle()
    assert list(dispatches(sent)) == [1]
    got = reasons(sent)
    assert got["2"] == R.NO_SLOTS
    assert got["3"] == R.HOSTS_UNUSABLE
    assert got["4"] == R.NO_HOST
    assert got["5"].startswith(R.BAD_REQUIREMENT) and "gpus" in got["5"]
    assert "6" not in got, "an inactive queue's reason is derived from the queue"
    assert got["7"] == R.NO_SLOTS
    assert "1" not in got
    # Same view again (forced cycle): nothing is re-sent.
    sent.clear()
    picker.view.apply("host", dict(picker.view.replica.get("hosts", "a")))
    picker.cycle()
    assert reasons(sent) == {} and picker.status.idle_cycles == 0
    # The controller pushes the reasons back; then job 4's reason changes.
    picker.view.apply("pend_reasons", {"reasons": got})
    picker.view.apply("host", host("z", slots=500, ncpus=500))
    sent.clear()
    picker.cycle()
    assert 4 in dispatches(sent)
    assert "4" not in reasons(sent) and "2" not in reasons(sent)


def test_max_dispatch_per_cycle_and_status() -> None:
    picker, _sent = make([host("a", slots=10)], [job(i) for i in range(1, 8)], max_dispatch=3)
    assert picker.cycle() == 3
    assert picker.cycle() == 3, "a capped cycle leaves the next one due at once"
    assert picker.cycle() == 1
    assert picker.cycle() == 0
    st = picker.status.as_dict()
    assert st["cycles"] == 4 and st["idle_cycles"] == 1 and st["proposed"] == 7


def test_evaluator_hook_asked_once_per_registry_version(mocker: Any, xce_plugin_manager: Any) -> None:
    import xcecore.resreq.plugin as builtin

    pm = xce_plugin_manager(builtin, builtins=False)
    spy = mocker.spy(pm.pm.hook, "xce_resreq_evaluator")
    picker, _sent = make([host("a", slots=8)], [job(1, resreq="select[gpu]")],
                        evaluator_for=pm.resreq_evaluator)
    for i in range(2, 5):
        picker.view.apply("job", job(i))
        picker.cycle()
    assert spy.call_count == 1
    load(picker.view, [host("a", slots=8)], [job(9)],
         resources=[{"name": "fpga", "type": "bool"}])
    picker.cycle()
    assert spy.call_count == 2


def test_mocked_evaluator_drives_placement(mocker: Any) -> None:
    """A site evaluator (no span/same attributes) is asked per job with current free slots."""

    class Match:
        def __init__(self, name: str, tasks: int) -> None:
            self.name, self.tasks, self.host, self.alternative = name, tasks, {}, None

    fake = mocker.Mock()
    compiled = mocker.Mock(spec=["match"])

    def match(hosts: list[dict[str, Any]], ntasks: int = 1) -> list[Match]:
        best = sorted(hosts, key=lambda h: h["hname"], reverse=True)
        return [Match(h["hname"], min(ntasks, h["slots"]) if i == 0 else 0)
                for i, h in enumerate(best)] if best and best[0]["slots"] >= ntasks else []

    compiled.match.side_effect = match
    fake.compile.return_value = compiled
    factory = mocker.Mock(return_value=fake)
    picker, sent = make([host("a", slots=1), host("b", slots=1)], [job(1), job(2), job(3)],
                        evaluator_for=factory)
    picker.cycle()
    assert dispatches(sent) == {1: [{"host": "b", "ntasks": 1}], 2: [{"host": "a", "ntasks": 1}]}
    assert reasons(sent) == {"3": R.NO_SLOTS}
    factory.assert_called_once()


def test_evaluator_failure_is_a_reason_not_a_crash(mocker: Any) -> None:
    compiled = mocker.Mock(span=None, same=())
    compiled.match.side_effect = RuntimeError("site evaluator bug")
    fake = mocker.Mock()
    fake.compile.return_value = compiled
    picker, sent = make([host("a")], [job(1, resreq="x")],
                        evaluator_for=mocker.Mock(return_value=fake))
    picker.cycle()
    assert reasons(sent)["1"].startswith(R.BAD_REQUIREMENT)


def test_load_values_are_reread_on_the_load_cadence() -> None:
    hosts = [host("a", slots=2, resvals={"r1m": 3.0})]
    picker, sent = make(hosts, [job(1, resreq="select[r1m<1]")], load_interval=3600)
    picker.cycle()
    assert reasons(sent) == {"1": R.NO_HOST}
    picker.view.apply("resvals", {"host": "a", "values": {"r1m": 0.1}})
    picker.cycle()
    assert not dispatches(sent), "a load change alone waits for the load cadence"
    picker.load_interval = 0.0
    picker.cycle()
    assert list(dispatches(sent)) == [1]


def test_rusage_is_held_within_a_cycle_and_while_in_flight() -> None:
    hosts = [host("a", slots=8, resvals={"mem": 5000.0}), host("b", slots=8, resvals={"mem": 3000.0})]
    jobs = [job(i, resreq="rusage[mem=2000] order[mem]") for i in range(1, 6)]
    picker, sent = make(hosts, jobs)
    picker.cycle()
    # a: 5000 -> two jobs (3000, 1000 left); b: 3000 -> one job. Never more than there is.
    per_host: dict[str, int] = {}
    for alloc in dispatches(sent).values():
        for a in alloc:
            per_host[a["host"]] = per_host.get(a["host"], 0) + 1
    assert per_host == {"a": 2, "b": 1}
    assert set(reasons(sent).values()) == {R.RESERVED}  # the slots are free: memory is held
    # Still in flight (no push yet): the next cycle holds the same amounts.
    sent.clear()
    picker.view.apply("host", dict(picker.view.replica.get("hosts", "a")))
    picker.cycle()
    assert not dispatches(sent)


def test_rusage_hold_with_same_uses_the_evaluator() -> None:
    hosts = [host("a", slots=8, rack="r1", resvals={"mem": 3000.0}),
             host("b", slots=8, rack="r1", resvals={"mem": 3000.0})]
    jobs = [job(i, resreq="rusage[mem=2000] same[rack]", ntasks=2) for i in range(1, 4)]
    picker, sent = make(hosts, jobs)
    picker.cycle()
    got = dispatches(sent)
    # Each job lands on one host (2 tasks, 8 slots) and holds 2000 of its 3000 MB.
    assert sorted(a["host"] for alloc in got.values() for a in alloc) == ["a", "b"]
    assert 3 not in got and reasons(sent) == {"3": R.RESERVED}
