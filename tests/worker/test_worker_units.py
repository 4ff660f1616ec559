"""Worker units with mocked hooks and fakes: join attributes, rejoin points, config checks,
monitor scheduling, the push inbox and handler, the journal and the notifier."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pytest_mock import MockerFixture
from xce_worker import plugin
from xce_worker.attrs import join_attributes
from xce_worker.monitors import ResvalBoard, _loop, system_monitor
from xce_worker.notifier import Notifier
from xce_worker.pushes import SUBSCRIPTION, PushHandler, PushInbox
from xce_worker.settings import SECTION, WorkerSettings
from xce_worker.spool import Journal

from xcecore.client import BackendUnavailable
from xcecore.config import ConfigError, validate
from xcecore.role import Monitor
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(30)

FACTS = {"type": "X86_64", "model": "Test CPU", "ncpus": 8, "ncores": 4, "nthreads": 2,
         "maxmem": 16000, "maxswp": 2000, "maxtmp": 50000}


def section(**kw: Any) -> dict[str, Any]:
    return validate({"worker": kw}, [SECTION]).section("worker")


# ---------------------------------------------------------------- join attributes and config
def test_join_attributes_defaults_from_facts() -> None:
    attrs = join_attributes(section(hname="n7"), FACTS)
    assert attrs["hname"] == "n7"
    assert attrs["max_slots"] == 8  # MXJ defaults to ncpus
    assert {k: attrs[k] for k in FACTS} == FACTS
    assert attrs["cpuf"] == 1.0 and attrs["resources"] == []


def test_join_attributes_config_wins() -> None:
    sec = section(hname="fake1", type="SPARC", model="M9", cpuf=2.5, ncpus=64, slots=3,
                  maxmem=1, resources=["ssd", "gpu", "gpu"], strings={"arch": "v9"},
                  numbers={"bw": 10})
    attrs = join_attributes(sec, FACTS)
    assert attrs["type"] == "SPARC" and attrs["model"] == "M9" and attrs["cpuf"] == 2.5
    assert attrs["ncpus"] == 64 and attrs["max_slots"] == 3 and attrs["maxmem"] == 1
    assert attrs["nthreads"] == 16  # derived from the configured ncpus and the real cores
    assert attrs["resources"] == ["gpu", "ssd"]
    assert attrs["arch"] == "v9" and attrs["bw"] == 10.0


def test_join_attributes_real_host() -> None:
    attrs = join_attributes(section())
    assert attrs["hname"] and attrs["ncpus"] >= 1 and attrs["maxmem"] > 0
    assert attrs["max_slots"] == attrs["ncpus"]


@pytest.mark.parametrize(("kw", "error"), [
    ({"slots": 0}, "slots must be >= 1"),
    ({"hname": "a@b"}, "hname 'a@b'"),
    ({"monitor_interval": 0}, "monitor_interval must be > 0"),
    ({"resources": ["ok", "not ok"]}, "'not ok' is not a resource name"),
    ({"strings": {"arch": 3}}, "strings.arch: expected string"),
    ({"numbers": {"bw": "fast"}}, "numbers.bw: expected number"),
    ({"numbers": {"ncpus": 3}}, "'ncpus' is a built-in host attribute"),
    ({"resources": ["x"], "strings": {"x": "y"}}, "strings.x: already defined in resources"),
    ({"slots": "4"}, "worker.slots: expected int, got str"),
    ({"colour": "red"}, "unknown key worker.colour"),
])
def test_bad_config_is_named(kw: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        section(**kw)


def test_two_workers_get_distinct_state_dirs() -> None:
    a = WorkerSettings.from_section(section(hname="a"))
    b = WorkerSettings.from_section(section(hname="b"))
    assert a.state_dir != b.state_dir and a.hname != b.hname


# ---------------------------------------------------------------- the role object
def test_role_through_plugin_manager(xce_plugin_manager: Any, xce_role: Any, mocker: MockerFixture) -> None:
    pm = xce_plugin_manager(plugin)
    mocker.patch("xce_worker.attrs.host_facts", return_value=FACTS)
    cfg = validate({"worker": {"hname": "w1", "slots": 2}}, [SECTION])
    assert pm.join_attributes("worker", cfg)["max_slots"] == 2  # type: ignore[index]
    role = xce_role(pm, "worker", {"worker": {"hname": "w1"}})
    assert role.rejoin_points == {"hello"}
    assert role.join_attributes()["hname"] == "w1"
    assert "worker" in pm.roles()


def test_monitors_give_every_loop(xce_plugin_manager: Any, xce_role: Any, tmp_path: Path) -> None:
    role = xce_role(xce_plugin_manager(plugin), "worker",
                    {"worker": {"hname": "m1", "state_dir": str(tmp_path)}})
    monitors = role.monitors()
    assert [m.name for m in monitors] == ["hardware", "system", "jobs", "pushes", "notifier"]
    assert all(isinstance(m, Monitor) and callable(m.run) for m in monitors)


def test_push_only_queues(xce_plugin_manager: Any, xce_role: Any, mocker: MockerFixture) -> None:
    client = mocker.Mock()
    role = xce_role(xce_plugin_manager(plugin), "worker", client=client)
    assert role.push("job", 1, {"jobid": 1}) is None
    assert role.inbox.get(0.1) == ("job", 1, {"jobid": 1})
    assert role.inbox.get(0.01) is None
    assert not client.method_calls  # never touches the client


def test_configured_facts_win_in_the_hardware_reports_too(tmp_path: Path, mocker: MockerFixture) -> None:
    """worker.ncpus = 16 on a 2-CPU host: the hardware monitor reports 16 as the join does,
    so ``select[ncpus>=16]`` (which reads the reported values over the join's) matches."""
    from xce_worker.attrs import host_view
    from xce_worker.monitors import hardware_monitor

    small = {**FACTS, "ncpus": 2, "ncores": 2, "nthreads": 1}
    mocker.patch("xce_worker.attrs.host_facts", return_value=small)
    sec = section(hname="big", ncpus=16, maxmem=64000)
    posted: list[dict[str, Any]] = []
    board = ResvalBoard(lambda key, op, args: posted.append(args["values"]), tmp_path)
    stop = threading.Event()
    stop.set()  # one sample, then return
    hardware_monitor(board, "big", 60.0, stop, facts=lambda: host_view(sec))
    assert posted[0]["ncpus"] == 16 and posted[0]["maxmem"] == 64000
    assert posted[0]["ncores"] == 2 and posted[0]["nthreads"] == 8
    assert {k: join_attributes(sec)[k] for k in ("ncpus", "maxmem", "nthreads")} == {
        k: posted[0][k] for k in ("ncpus", "maxmem", "nthreads")}


# ---------------------------------------------------------------- monitor scheduling
def test_monitor_loop_ticks_and_stops_promptly() -> None:
    ticks: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=_loop, args=("t", "h", 0.02, stop, lambda: ticks.append(1)))
    t.start()
    time.sleep(0.2)
    stop.set()
    t.join(2)
    assert not t.is_alive() and len(ticks) >= 3


def test_monitor_survives_failing_samples() -> None:
    calls = []

    def tick() -> None:
        calls.append(1)
        raise RuntimeError("sensor broke")

    stop = threading.Event()
    t = threading.Thread(target=_loop, args=("t", "h", 0.01, stop, tick))
    t.start()
    time.sleep(0.1)
    stop.set()
    t.join(2)
    assert len(calls) >= 2


def test_board_merges_parts_and_posts_latest(tmp_path: Path) -> None:
    posts: list[tuple[str, str, dict[str, Any]]] = []
    board = ResvalBoard(lambda k, op, a: posts.append((k, op, a)), tmp_path)
    board.update("hardware", {"ncpus": 2})
    board.update("load", {"r1m": 0.5})
    key, op, args = posts[-1]
    assert (key, op) == ("resvals", "update_resvals")
    assert args["values"]["ncpus"] == 2 and args["values"]["r1m"] == 0.5
    assert (tmp_path / "resvals.json").exists()


def test_system_monitor_posts_real_load(tmp_path: Path) -> None:
    posts: list[dict[str, Any]] = []
    board = ResvalBoard(lambda k, op, a: posts.append(a["values"]), None)
    stop = threading.Event()
    t = threading.Thread(target=system_monitor, args=(board, "h", 0.05, stop))
    t.start()
    time.sleep(0.3)
    stop.set()
    t.join(2)
    assert len(posts) >= 2
    for name in ("r15s", "r1m", "r15m", "ut", "pg", "io", "ls", "it", "mem", "swp", "tmp"):
        assert name in posts[-1], name


# ---------------------------------------------------------------- push handling
def job(jobid: int, state: str = "RUN", host: str = "h1", **kw: Any) -> dict[str, Any]:
    return {"jobid": jobid, "state": state, "alloc": [{"host": host, "ntasks": 1}],
            "attempt": 0, "command": "true", "signal": None, **kw}


def test_push_handler_routes(mocker: MockerFixture) -> None:
    pm = mocker.Mock()
    pm.running = {}
    h = PushHandler("h1", pm)
    h.handle("job", job(1))
    pm.start.assert_called_once()
    h.handle("job", job(2, host="other"))
    h.handle("job", job(3, state="DONE"))
    assert pm.start.call_count == 1
    h.handle("signal", {"jobid": 1, "signal": "stop", "hosts": ["h1"], "attempt": 0})
    pm.signal.assert_called_with(1, 0, "stop")
    h.handle("signal", {"jobid": "x"})  # malformed: logged, ignored
    h.handle("job", "not an object")
    h.handle("job", job(4, signal="kill"))
    pm.signal.assert_called_with(4, 0, "kill")


def _sync(h: PushHandler, mode: str, jobs: list[dict[str, Any]], end: bool = True,
          removed: list[int] | None = None) -> None:
    h.handle("sync_begin", {"mode": mode, "store": "s", "rev": 5, "since": None})
    h.handle("sync_records", {"kind": "jobs", "items": jobs})
    if removed:
        h.handle("sync_removed", {"kind": "jobs", "keys": removed})
    if end:
        h.handle("sync_end", {"rev": 5})


def test_the_worker_subscribes_to_its_host_and_its_jobs() -> None:
    assert SUBSCRIPTION.to_wire() == {"hosts": "own", "jobs": "host"}


def test_end_of_a_sync_kills_jobs_no_longer_listed(mocker: MockerFixture) -> None:
    pm = mocker.Mock()
    pm.running = {5: mocker.Mock(jobid=5, attempt=0), 6: mocker.Mock(jobid=6, attempt=0),
                  7: mocker.Mock(jobid=7, attempt=0)}
    pm.start.return_value = False
    h = PushHandler("h1", pm)
    _sync(h, "snapshot", [job(6), job(7), job(8, host="other")], end=False)
    assert pm.start.call_count == 2 and not pm.signal.called, "nothing killed before the end"
    h.handle("sync_end", {"rev": 5})
    pm.signal.assert_called_once_with(5, 0, "kill")
    # A delta later: 7 left the host's scope while the worker was away (requeued).
    pm.signal.reset_mock()
    del pm.running[5]  # killed: its process is gone
    _sync(h, "delta", [], removed=[7])
    pm.signal.assert_called_once_with(7, 0, "kill")
    assert sorted(h.replica.records("jobs")) == [6]


def test_push_thread_runs_in_order(mocker: MockerFixture) -> None:
    seen: list[int] = []
    pm = mocker.Mock()
    pm.running = {}
    pm.start.side_effect = lambda j: seen.append(j["jobid"])
    box, stop = PushInbox(), threading.Event()
    for i in range(1, 6):
        box.put(("job", i, job(i)))
    t = threading.Thread(target=PushHandler("h1", pm).run, args=(box, stop))
    t.start()
    deadline = time.monotonic() + 5
    while len(seen) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    t.join(2)
    assert seen == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------- journal
def test_journal_claims_once_and_survives_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    assert j.claim(1, 0) and not j.claim(1, 0) and j.claim(1, 1)
    j.record_run(1, 0, 1234, 99.0, "/s")
    n1 = j.notify({"jobid": 1, "event": "start", "pid": 1234, "attempt": 0})
    n2 = j.notify({"jobid": 1, "event": "finish", "exit_status": 0, "attempt": 0})
    j.ack(n1)
    j.close()
    k = Journal(tmp_path / "j.jsonl")
    assert not k.claim(1, 0)
    assert [n.n for n in k.pending()] == [n2]
    assert {(e.jobid, e.attempt) for e in k.active()} == {(1, 1)}
    entry = k.known(1, 0)
    assert entry is not None and entry.ended and entry.pid == 1234


def test_journal_drops_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.notify({"jobid": 1, "event": "finish", "exit_status": 0})
    j.close()
    with open(path, "ab") as fh:
        fh.write(b'{"k":"note","n":2,"args":{"jobid"')
    k = Journal(path)
    assert [n.n for n in k.pending()] == [1]
    k.notify({"jobid": 2, "event": "finish", "exit_status": 0})
    k.close()
    assert [n.n for n in Journal(path).pending()] == [1, 2]


def test_journal_compacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Journal, "COMPACT_AFTER", 10)
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    for i in range(20):
        j.claim(i, 0)
        j.ack(j.notify({"jobid": i, "event": "finish", "exit_status": 0, "attempt": 0}))
    j.claim(99, 0)
    last = j.notify({"jobid": 99, "event": "start", "pid": 5, "attempt": 0})
    j.close()
    assert len(path.read_text().splitlines()) < 15
    k = Journal(path)
    assert [n.n for n in k.pending()] == [last]
    assert not k.claim(99, 0)


# ---------------------------------------------------------------- notifier
def test_notifier_delivers_in_order_retries_and_drops_refusals(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    for i in range(1, 5):
        j.notify({"jobid": i, "event": "finish", "exit_status": 0})
    sent: list[int] = []
    failures = iter([BackendUnavailable("no primary"), RemoteError("INTERNAL", "commit")])

    def call(op: str, args: dict[str, Any]) -> Any:
        assert op == "notify_job"
        if args["jobid"] == 2:
            exc = next(failures, None)
            if exc is not None:
                raise exc
        if args["jobid"] == 3:
            raise RemoteError("CONFLICT", "attempt 1, job is at 2")
        sent.append(args["jobid"])
        return {}

    n = Notifier("h", j, call, retry_delay=0.01)
    stop = threading.Event()
    t = threading.Thread(target=n.run, args=(stop,))
    t.start()
    assert j.wait_drained(5)
    stop.set()
    t.join(2)
    assert sent == [1, 2, 4] and n.refused == 1 and n.delivered == 3
