"""A hung primary on the file backend: three candidates on one simulated host of the bed.

SIGSTOP of the primary is fenced and failed over; a pause shorter than ``hung_timeout`` and a
frozen host are not; a full disk never stops the beats; a primary that wakes up fenced does not
acknowledge; a standby on another host refuses to fence. Real processes, real signals.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from xce_controller import fencing
from xce_controller.fencing import BeatFile, FenceMark

from xcecore.protocol import ErrorCode
from xcecore.testing import netns
from xcecore.testing.checker import OK, History, check, promotions_in_logs
from xcecore.testing.cluster import LocalCluster, probe, wait_for
from xcecore.testing.faultbed import FaultBed, Host
from xcecore.testing.workload import Writers, all_jobs, resolve_unknown
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(180)


def cluster_on(bed: FaultBed, hung: float = 2.0, disk: str | None = None) -> tuple[Host, Host, LocalCluster]:
    ctl, cli = bed.add_host("ctl", disk=disk), bed.add_host("cli")
    cluster = bed.cluster(ctl, 3, extra_config=f'[controller]\nadmins = ["chaos"]\nhung_timeout = {hung}\n')
    cluster.start()
    return ctl, cli, cluster


def writers(bed: FaultBed, cluster: LocalCluster, cli: Host, history: History, n: int = 2) -> Writers:
    def open_client(name: str) -> Any:
        return bed.client(cluster, cli, "cli", name=name)

    w = Writers(history, open_client, n, seed=1, gap=0.01)
    w.start()
    wait_for(lambda: history.counts().get("ok", 0) >= 5, 30, what="the first writes")
    return w


def acked_after(history: History, t: float) -> list[Any]:
    return [op for op in history.snapshot() if op.outcome == OK and op.kind == "submit" and op.invoked >= t]


def logs(cluster: LocalCluster) -> str:
    return "\n".join(p.text() for p in cluster.procs)


def test_a_stopped_primary_is_fenced_and_never_acknowledges_again(xce_faultbed: FaultBed) -> None:
    bed = xce_faultbed
    ctl, cli, cluster = cluster_on(bed)
    history = History()
    load = writers(bed, cluster, cli, history)
    old = cluster.candidates[0]
    primaries_seen: list[int] = []
    stop_sampling = threading.Event()

    def sample() -> None:  # how many candidates answer "primary" at each moment
        method = cluster.method()
        with netns.entered(ctl.netns):
            while not stop_sampling.is_set():
                states = [probe(ctl.addr, p, method, timeout=0.2) for p in cluster.ports]
                primaries_seen.append(sum(1 for s in states if s and s.get("state") == "primary"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t_stop = time.time()
    os.kill(old.pid, signal.SIGSTOP)
    first = wait_for(lambda: acked_after(history, t_stop), 30, what="a write acknowledged after the stop")[0]
    new = cluster.wait_primary(30, exclude=0)
    assert old.popen.wait(10) == -signal.SIGKILL  # fenced: SIGKILLed while stopped, so a
    # SIGCONT has nothing left to wake: it never runs (or acknowledges) again
    text = logs(cluster)
    assert f"fenced the primary {cluster.address(0)} (pid {old.pid}, term 1)" in text
    assert "verified it holds the state-dir lock" in text
    first_ms = (first.completed - t_stop) * 1e3
    print(f"SIGSTOP -> first acknowledged write issued after it: {first_ms:.0f} ms (hung_timeout 2 s)")
    wait_for(lambda: len(acked_after(history, time.time() - 0.5)) > 5, 30, what="writes on the new primary")
    stop_sampling.set()
    sampler.join(10)
    load.stop()
    assert not load.errors
    assert primaries_seen and max(primaries_seen) <= 1, "two candidates answered primary at once"
    with bed.client(cluster, cli, "cli", name="final") as c:
        resolve_unknown(history, c)
        jobs = all_jobs(c)
    verdict = check(history.snapshot(), jobs, promotions=promotions_in_logs(
        [cluster.root / f"controller{i}.log" for i in range(3)]))
    assert verdict.ok, verdict.summary()
    assert all(op.server != cluster.address(0) for op in history.snapshot()
               if op.outcome == OK and op.invoked > t_stop), "the fenced primary acknowledged"
    assert new in (1, 2) and cluster.state_of(new) == "primary"


def test_a_pause_shorter_than_hung_timeout_and_a_frozen_host_are_not_hangs(xce_faultbed: FaultBed) -> None:
    bed = xce_faultbed
    ctl, cli, cluster = cluster_on(bed, hung=2.0)
    primary = cluster.candidates[0]
    os.kill(primary.pid, signal.SIGSTOP)
    time.sleep(1.2)  # the pause under test: 0.8 s shorter than hung_timeout
    os.kill(primary.pid, signal.SIGCONT)
    # The whole host frozen for longer than hung_timeout: every candidate was paused alike.
    bed.freeze(ctl)
    time.sleep(3.0)  # the freeze under test
    bed.thaw(ctl)
    with bed.client(cluster, cli, "cli", name="w") as c:
        c.call("jobsubmit", {"command": "true", "name": "after"}, deadline=30)
        # Watch for a whole hung_timeout more: still nobody fences anybody.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert primary.alive() and "fenced" not in logs(cluster)
            c.call("jobinfo", {"limit": 1}, deadline=10)
            time.sleep(0.1)
    assert cluster.primary() == 0


def test_a_full_disk_never_stops_the_beats(xce_faultbed: FaultBed) -> None:
    """A full state directory is a storage fault (writes refused with STORAGE, the primary
    stays up), not a hang: the beats need no new block, so no standby fences the primary."""
    bed = xce_faultbed
    ctl, cli, cluster = cluster_on(bed, hung=1.0, disk="16m")
    beats = BeatFile(ctl.state_dir)
    try:
        with bed.client(cluster, cli, "cli", name="w") as c:
            c.call("jobsubmit", {"command": "true", "name": "before"}, deadline=30)
            bed.fill_disk(ctl)
            with pytest.raises(OSError, match="No space left"):
                (ctl.state_dir / "probe").write_bytes(b"x" * 65536)
            rec = beats.read_beat()
            assert rec is not None
            refused: list[str] = []
            deadline = time.monotonic() + 3.5  # three and a half hung_timeouts on a full disk
            while time.monotonic() < deadline:
                try:
                    c.call("jobsubmit", {"command": "true", "name": f"full-{len(refused)}"},
                           deadline=10)
                except RemoteError as exc:
                    refused.append(exc.code)
                now = beats.read_beat()
                assert now is not None and now.who == rec.who
                assert "fenced" not in logs(cluster) and cluster.candidates[0].alive()
                time.sleep(0.1)
            assert refused and set(refused) == {ErrorCode.STORAGE}  # really full, for the store too
            assert now.seq > rec.seq + 20  # it kept beating: in place, no new block needed
            assert os.stat(ctl.state_dir / fencing.BEAT_NAME).st_size == fencing.RECORD_SIZE
            bed.free_disk(ctl)
            wait_for(lambda: _submitted(c), 30, what="writes taken again after the disk is freed")
        assert cluster.primary() == 0
    finally:
        beats.close()
        bed.free_disk(ctl)


def _submitted(c: Any) -> bool:
    try:
        c.call("jobsubmit", {"command": "true", "name": "after"}, deadline=10)
    except RemoteError:
        return False
    return True


def test_a_primary_woken_after_a_fence_does_not_acknowledge(xce_faultbed: FaultBed) -> None:
    """The fence mark without the kill (as if SIGKILL could not be delivered): on waking,
    the old primary commits what it had received but acknowledges nothing, gives up the
    role; the client's retry is answered once, from the store, by the next primary."""
    bed = xce_faultbed
    ctl, cli, cluster = cluster_on(bed, hung=0)  # nobody watches: the mark is the only fence
    old = cluster.candidates[0]
    beats = BeatFile(ctl.state_dir)
    rec = beats.read_beat()
    assert rec is not None and rec.who.pid == old.pid
    with bed.client(cluster, cli, "cli", name="w") as c:
        c.call("jobinfo", {"limit": 1})  # connected to the primary
        os.kill(old.pid, signal.SIGSTOP)
        beats.write_fence(FenceMark(rec.term, os.getpid(), time.time(), "test: fenced without a kill"))
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(
            ack=c.call("jobsubmit", {"command": "true", "name": "woken"}, deadline=60),
            server=str(c.client.candidate)), daemon=True)
        t.start()

        def queued() -> bool:  # the request is waiting in the stopped primary's socket
            out = bed.run(ctl, ["ss", "-tnH", "state", "established", f"sport = :{cluster.ports[0]}"]).stdout
            return any(line.split()[0] != "0" for line in out.splitlines())

        wait_for(queued, 10, what="the write queued at the stopped primary")
        os.kill(old.pid, signal.SIGCONT)
        t.join(60)
        assert result, "the write was never acknowledged"
        assert result["server"] != cluster.address(0)
        jobs = [j for j in all_jobs(c) if j["name"] == "woken"]
    assert len(jobs) == 1 and jobs[0]["jobid"] == result["ack"]["jobid"]
    text = old.text()
    assert "no longer primary: it was fenced by pid" in text and "not acknowledging" in text
    assert old.popen.wait(30) is not None  # it gave the role up and ended
    beats.close()


def test_a_standby_on_another_host_refuses_to_fence(xce_faultbed: FaultBed) -> None:
    """The file backend is for one host: sharing its directory with another host (as NFS
    would) gives no failover of a hung primary, and the standby says why instead of killing
    whatever has that pid on its own host."""
    bed = xce_faultbed
    shared = bed.shared("state")
    a = bed.add_host("a", shared={"state": shared})
    b = bed.add_host("b", shared={"state": shared})
    cluster = bed.cluster(a, 1, extra_config="[controller]\nhung_timeout = 1.0\n")
    cluster.start()
    standby = cluster.spawn("controller-b", "controller", f'controller.listen="{b.addr}:7601"',
                            f'controller.state_dir="{b.state_dir}"', netns=b.netns)
    wait_for(lambda: "candidate started" in standby.text(), 30, what="the standby on host b")
    primary = cluster.candidates[0]
    os.kill(primary.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "cannot fence it" in standby.text(), 20, what="the refusal")
        assert "another network namespace" in standby.text()
        assert "multi-host sites use the etcd backend" in standby.text()
        assert primary.alive() and standby.alive()
    finally:
        os.kill(primary.pid, signal.SIGCONT)
    wait_for(lambda: cluster.state_of(0) == "primary", 20, what="the primary after SIGCONT")
    assert "promoted" not in standby.text()
