"""A seeded random nemesis: faults drawn from the fault test bed's list, one after another.

Each fault is applied to a :class:`~xcecore.testing.chaos.ChaosCluster`, held for a drawn
time, undone; then the supervisor restarts what died and the nemesis waits (bounded) until a
write is acknowledged again before the next fault. The same seed draws the same faults, in
the same order, with the same targets and times.

Per fault, the client-visible outage is the time from its injection to the acknowledgement
of the first write *invoked after* it (BENCHMARKS.md's failover method, for every kind).

:func:`run` is a whole chaos run: the cluster, recorded writers, an observer, the nemesis, the
checker's verdict (the CI test and ``benchmarks/bench_chaos.py`` both call it).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from loguru import logger

from xcecore.testing.chaos import PARKED, ChaosCluster
from xcecore.testing.checker import FAILED, OK, History, Verdict, check, promotions_in_logs, runs_in
from xcecore.testing.faultbed import FaultBed
from xcecore.testing.workload import Writers, all_jobs, observing, resolve_unknown

Undo = Callable[[], None]
Injected = tuple[str, float, Undo]  # target, time.time() once in effect, how to undo it


@dataclass
class FaultRecord:
    """One fault: what, on whom, when, and what the clients saw."""

    kind: str
    target: str
    start: float
    healed: float | None = None
    held: float = 0.0
    outage: float | None = None  # injection -> first acknowledged write invoked after it
    refused: int = 0  # writes invoked while it was held that the cluster refused (not applied)
    recovered: bool = False
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """For result files."""
        return asdict(self)


def _primary(cc: ChaosCluster) -> int:
    found = cc.cluster.primary()
    if found is None:
        raise RuntimeError("no primary to fault")
    return found


def kill_primary(cc: ChaosCluster, rng: random.Random) -> Injected:
    """SIGKILL the primary candidate (a standby promotes at once)."""
    i = _primary(cc)
    proc = cc.cluster.candidates[i]
    os.kill(proc.pid, signal.SIGKILL)
    t = time.time()  # the fault is in effect
    proc.popen.wait(10)
    return f"candidate {i}", t, lambda: None


def stop_primary(cc: ChaosCluster, rng: random.Random) -> Injected:
    """SIGSTOP the primary (hung): a standby fences it after hung_timeout; SIGCONT at the end."""
    i = _primary(cc)
    proc = cc.cluster.candidates[i]
    os.kill(proc.pid, signal.SIGSTOP)
    t = time.time()  # the fault is in effect

    def undo() -> None:
        if proc.alive():
            os.kill(proc.pid, signal.SIGCONT)
    return f"candidate {i} (pid {proc.pid})", t, undo


def kill_worker(cc: ChaosCluster, rng: random.Random) -> Injected:
    """SIGKILL one worker process (its jobs keep running; it re-adopts them on restart)."""
    r = rng.choice([r for r in cc.roles if r.role == "worker"])
    if r.proc is not None:
        r.proc.kill()
    t = time.time()  # the fault is in effect
    return r.name, t, lambda: None


def freeze_host(cc: ChaosCluster, rng: random.Random) -> Injected:
    """SIGSTOP every process of a worker host or of the scheduler/API host; thaw after."""
    h = rng.choice([*cc.workers, cc.svc])
    cc.bed.freeze(h)
    t = time.time()  # the fault is in effect
    return h.name, t, lambda: cc.bed.thaw(h)


def freeze_controllers(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Freeze the controller host: every candidate at once (no failover can help)."""
    cc.bed.freeze(cc.ctl)
    t = time.time()  # the fault is in effect
    return cc.ctl.name, t, lambda: cc.bed.thaw(cc.ctl)


def power_off_host(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Power a worker or the scheduler/API host off; on again after (its roles restarted)."""
    h = rng.choice([*cc.workers, cc.svc])
    cc.bed.power_off(h)
    t = time.time()  # the fault is in effect
    return h.name, t, lambda: cc.bed.power_on(h)


def power_off_controllers(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Power the controller host off (a whole-cluster restart of the state's side)."""
    cc.bed.power_off(cc.ctl)
    t = time.time()  # the fault is in effect
    return cc.ctl.name, t, lambda: cc.bed.power_on(cc.ctl)


def partition_worker(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Cut a worker host off from the controller host, both ways."""
    h = rng.choice(cc.workers)
    cc.bed.partition(h, cc.ctl)
    t = time.time()  # the fault is in effect
    return f"{h.name} <-> ctl", t, lambda: cc.bed.heal(h, cc.ctl)


def partition_one_way(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Drop what the controller host sends to a worker host (the worker's packets arrive)."""
    h = rng.choice(cc.workers)
    cc.bed.partition(cc.ctl, h, one_way=True)
    t = time.time()  # the fault is in effect
    return f"ctl -> {h.name}", t, lambda: cc.bed.heal(cc.ctl, h)


def partition_clients(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Cut the clients' host off from the controller host."""
    cc.bed.partition(cc.cli, cc.ctl)
    t = time.time()  # the fault is in effect
    return "cli <-> ctl", t, lambda: cc.bed.heal(cc.cli, cc.ctl)


def blackhole_primary(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Black-hole the clients' traffic to the primary's port only (the standbys still answer;
    the primary is healthy and keeps its lock, so nothing fails over)."""
    i = _primary(cc)
    port = cc.cluster.ports[i]
    cc.bed.partition(cc.cli, cc.ctl, one_way=True, port=port)
    t = time.time()  # the fault is in effect
    return f"cli -> candidate {i} (port {port})", t, lambda: cc.bed.heal(cc.cli, cc.ctl)


def slow_clients(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Slow the clients' link to the controller host (delay and jitter, both ways)."""
    delay = round(rng.uniform(0.02, 0.1), 3)
    cc.bed.slow(cc.cli, cc.ctl, delay, delay / 4, seed=rng.randrange(1 << 20))
    t = time.time()  # the fault is in effect
    return f"cli <-> ctl {delay * 1e3:.0f} ms", t, lambda: cc.bed.unslow(cc.cli, cc.ctl)


def lossy_clients(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Lose a share of the packets between the clients' host and the controller host."""
    percent = rng.choice((10, 20, 30))
    cc.bed.loss(cc.cli, cc.ctl, percent)
    t = time.time()  # the fault is in effect
    return f"cli <-> ctl {percent} %", t, lambda: cc.bed.heal(cc.cli, cc.ctl)


def full_disk_controllers(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Fill the controller host's state directory; free it after."""
    cc.bed.fill_disk(cc.ctl)
    t = time.time()  # the fault is in effect
    return cc.ctl.name, t, lambda: cc.bed.free_disk(cc.ctl)


def full_disk_worker(cc: ChaosCluster, rng: random.Random) -> Injected:
    """Fill a worker host's state directory (its journal and job output); free it after."""
    h = rng.choice(cc.workers)
    cc.bed.fill_disk(h)
    t = time.time()  # the fault is in effect
    return h.name, t, lambda: cc.bed.free_disk(h)


FAULTS: dict[str, Callable[[ChaosCluster, random.Random], Injected]] = {
    "kill-primary": kill_primary,
    "stop-primary": stop_primary,
    "kill-worker": kill_worker,
    "freeze-host": freeze_host,
    "freeze-controllers": freeze_controllers,
    "power-off-host": power_off_host,
    "power-off-controllers": power_off_controllers,
    "partition-worker": partition_worker,
    "partition-one-way": partition_one_way,
    "partition-clients": partition_clients,
    "blackhole-primary": blackhole_primary,
    "slow-clients": slow_clients,
    "lossy-clients": lossy_clients,
    "full-disk-controllers": full_disk_controllers,
    "full-disk-worker": full_disk_worker,
}


class Nemesis:
    """Draws and applies faults; see the module docstring."""

    def __init__(self, cc: ChaosCluster, history: History, *, seed: int,
                 kinds: list[str] | None = None, hold: tuple[float, float] = (1.0, 2.5),
                 gap: tuple[float, float] = (0.3, 1.0), recover_timeout: float = 30.0) -> None:
        unknown = sorted(set(kinds or ()) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
        self.cc, self.history = cc, history
        self.rng = random.Random(seed)
        self.kinds = list(kinds or FAULTS)
        self.hold, self.gap, self.recover_timeout = hold, gap, recover_timeout
        self.records: list[FaultRecord] = []
        self._bag: list[str] = []

    def draw(self) -> str:
        """The next fault kind: every kind once, in a seeded order, then again."""
        if not self._bag:
            self._bag = list(self.kinds)
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    def run(self, faults: int) -> list[FaultRecord]:
        """Apply ``faults`` faults, one after another."""
        for _ in range(faults):
            self.one(self.draw())
        return self.records

    def one(self, kind: str) -> FaultRecord:
        """Apply one fault of ``kind``, hold it, undo it, wait for the writes to resume."""
        hold = self.rng.uniform(*self.hold)
        if kind == "stop-primary":  # long enough for the fence to happen during the fault
            hold = max(hold, self.cc.hung_timeout + 1.5)
        target, t0, undo = FAULTS[kind](self.cc, self.rng)
        rec = FaultRecord(kind, target, t0)
        self.records.append(rec)
        logger.info("nemesis: {} on {}, for {:.1f} s", kind, target, hold)
        time.sleep(max(0.0, t0 + hold - time.time()))  # the fault's duration, to ride through
        undo()
        rec.healed = time.time()
        rec.held = rec.healed - t0
        self.cc.ensure_running()
        rec.recovered = self._wait_write_after(rec.healed)
        if not rec.recovered:
            logger.error("nemesis: no write acknowledged {:g} s after healing {} on {}",
                         self.recover_timeout, kind, target)
        time.sleep(self.rng.uniform(*self.gap))  # a quiet spell between faults
        return rec

    def _wait_write_after(self, t: float) -> bool:
        deadline = time.monotonic() + self.recover_timeout
        while time.monotonic() < deadline:
            if any(op.outcome == OK and op.kind != "read" and op.invoked >= t
                   for op in reversed(self.history.snapshot())):
                return True
            self.cc.ensure_running()  # a candidate that exited meanwhile (e.g. fenced)
            time.sleep(0.05)
        return False

    def outages(self) -> None:
        """Fill each record's outage from the history (call after the run)."""
        acked = sorted((op.invoked, op.completed) for op in self.history.snapshot()
                       if op.outcome == OK and op.kind != "read" and op.completed is not None)
        failed = [op.invoked for op in self.history.snapshot() if op.outcome == FAILED and op.kind != "read"]
        for rec in self.records:
            after = [done for inv, done in acked if inv >= rec.start]
            rec.outage = (min(after) - rec.start) if after else None
            end = rec.healed if rec.healed is not None else rec.start
            rec.refused = sum(1 for t in failed if rec.start <= t <= end)


@dataclass
class ChaosReport:
    """What a chaos run did and what the checker found."""

    seed: int
    verdict: Verdict
    faults: list[FaultRecord]
    unfinished: list[dict[str, Any]]
    members: list[str]
    duration: float

    def summary(self) -> str:
        """Lines for a test failure or a benchmark log."""
        lines = [f"chaos run, seed {self.seed}: {len(self.faults)} faults in {self.duration:.0f} s"]
        for f in self.faults:
            outage = "no write acknowledged" if f.outage is None else f"outage {f.outage:.2f} s"
            lines.append(f"  {f.kind:<22} {f.target:<28} held {f.held:4.1f} s  {outage}"
                         + (f", {f.refused} refused" if f.refused else "")
                         + ("" if f.recovered else "  NOT RECOVERED"))
        lines.append(self.verdict.summary())
        if self.unfinished:
            lines.append(f"  {len(self.unfinished)} job(s) unfinished at the end: "
                         + "; ".join(f"{j['jobid']} {j['state']} attempt {j.get('attempt')} on "
                                     f"{[a['host'] for a in j.get('alloc', [])]}"
                                     for j in self.unfinished[:10]))
        return "\n".join(lines)


def run(bed: FaultBed, *, seed: int, faults: int, kinds: list[str] | None = None,
        writers: int = 3, hung_timeout: float = 2.0, settle: float = 60.0) -> ChaosReport:
    """A whole chaos run on ``bed``: cluster, recorded writers, observer, nemesis, checker."""
    t0 = time.monotonic()
    cc = ChaosCluster(bed, hung_timeout=hung_timeout)
    cc.start()
    history = History()
    with observing(cc.client) as (observer, _):
        load = Writers(history, cc.client, writers, seed=seed, parked_queue=PARKED)
        load.start()
        _wait(lambda: history.counts().get("ok", 0) >= writers * 3, 30, "the writers' first writes")
        nemesis = Nemesis(cc, history, seed=seed, kinds=kinds)
        try:
            nemesis.run(faults)
        finally:
            bed.heal_all()
        cc.ensure_running()
        members = cc.wait_members(cc.expected_members(), settle)
        load.stop()
        unfinished = _finish_jobs(cc, settle)
        seen = observer.snapshot()  # before the final state: nothing it saw may be newer
        with cc.client("final") as c:
            resolve_unknown(history, c)  # "not applied" is final, so the state below holds
            jobs = all_jobs(c)
    nemesis.outages()
    verdict = check(history.snapshot(), jobs, runs=runs_in(cc.markers()), seen=seen,
                    promotions=promotions_in_logs(cc.candidate_logs()),
                    expected_members=cc.expected_members(), members=members)
    if load.errors:
        verdict.add("writer died", "; ".join(f"{type(e).__name__}: {e}" for e in load.errors))
    return ChaosReport(seed, verdict, nemesis.records, unfinished, members, time.monotonic() - t0)


def _finish_jobs(cc: ChaosCluster, timeout: float) -> list[dict[str, Any]]:
    """Kill what still runs (long jobs whose kill was not acknowledged) and wait for every job
    that can run to end; the jobs still unfinished after ``timeout``."""
    deadline = time.monotonic() + timeout
    left: list[dict[str, Any]] = []
    with cc.client("finisher") as c:
        while time.monotonic() < deadline:
            jobs = all_jobs(c, {"states": ["PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "UNKWN"]})
            left = [j for j in jobs if j["queue"] != PARKED]
            if not left:
                return []
            for j in left:
                if "sleep 30" in j["command"] and j["state"] in ("PEND", "RUN"):
                    try:
                        c.call("jobctrl", {"jobid": j["jobid"], "action": "kill"},
                               deadline=10)
                    except Exception:  # it ended meanwhile: CONFLICT
                        continue
            time.sleep(0.5)
    return left


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"chaos: timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
