"""The etcd backend on the fault test bed, and a seeded random nemesis over it.

:class:`EtcdBed` builds three hosts ``h1``-``h3`` (each an etcd member and a controller
candidate, ``[controller] backend = "etcd"``) and a client host ``cli``, on a
:class:`~xcecore.testing.faultbed.FaultBed`. :func:`run` drives recorded writers while a seeded
nemesis applies faults of :data:`FAULTS` one after another (each kind once before any
repeats; held 1-2.5 s, undone, what died restarted, then it waits for a write acknowledged
after the heal), and the bed's checker rules on the whole history: no acknowledged write
lost, none applied twice, never two primaries acknowledging.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from xce_etcd.client import EtcdClient
from xce_etcd.testing import EtcdCluster, MultiHostCluster, etcd_config
from xcecore.testing import netns
from xcecore.testing.checker import OK, History, Verdict, check, promotions_in_logs
from xcecore.testing.faultbed import FaultBed, Host
from xcecore.testing.nemesis import FaultRecord
from xcecore.testing.workload import Writers, all_jobs, resolve_unknown

Undo = Callable[[], None]


class EtcdBed:
    """Three etcd members and three candidates, one of each per host, and a client host."""

    def __init__(self, bed: FaultBed, root: Path, controller_extra: str = 'admins = ["chaos"]\n') -> None:
        self.bed = bed
        self.hosts = [bed.add_host(f"h{i}") for i in range(1, 4)]
        self.cli = bed.add_host("cli")
        self.etcd = EtcdCluster(root / "etcd", [h.addr for h in self.hosts], [h.netns for h in self.hosts])
        self.cluster = MultiHostCluster(root / "cluster", [(h.addr, h.netns, h.state_dir) for h in self.hosts],
                                        etcd_config(self.etcd.endpoints), controller_extra)
        bed.clusters.append(self.cluster)  # its processes are ended (by pid) with the bed

    def start(self) -> None:
        """Start the members, wait for a leader, start the candidates (h1's is primary)."""
        for m in self.etcd.members:
            self.etcd.start_member(m)
        self.wait_etcd()
        self.cluster.start()

    def wait_etcd(self, timeout: float = 30.0) -> None:
        """Wait until etcd has a leader, asked from a running host."""
        live = next(h for h in self.hosts if h.powered and not h.frozen)
        with netns.entered(live.netns):
            self.etcd.wait_healthy(timeout)

    def stop(self) -> None:
        """End every etcd member (by pid); the bed ends the candidates."""
        self.etcd.stop()

    def client(self, name: str) -> Any:
        """A context manager: a connected client on the client host."""
        return self.bed.client(self.cluster, self.cli, "cli", name=name)

    def primary(self) -> int:
        """The primary candidate's index (waits for one)."""
        return self.cluster.wait_primary(30)

    def etcd_leader(self) -> int:
        """The index of the etcd member leading raft."""
        for h in self.hosts:
            if not h.powered or h.frozen:
                continue
            with netns.entered(h.netns):
                found = self.etcd.leader()
            if found is not None:
                return found
        raise RuntimeError("no etcd member says it leads")

    def move_etcd_leader(self, to: int) -> None:
        """Hand raft leadership to member ``to`` (asked of the current leader, from its host)."""
        lead = self.etcd_leader()
        if lead == to:
            return
        src, dst = self.etcd.members[lead], self.etcd.members[to]
        with netns.entered(self.hosts[to].netns):
            c = EtcdClient([dst.url], timeout=2.0)
            try:
                target = c.status()["header"]["member_id"]
            finally:
                c.close()
        with netns.entered(self.hosts[lead].netns):
            c = EtcdClient([src.url], timeout=2.0)
            try:
                c.post("/v3/maintenance/transfer-leadership", {"targetID": str(target)}, 5.0)
            finally:
                c.close()

    def ensure_running(self) -> None:
        """Restart what died on every host that is up and not frozen (members keep their data)."""
        for i, h in enumerate(self.hosts):
            if not h.powered or h.frozen:
                continue
            m = self.etcd.members[i]
            if m.popen is not None and not m.alive():
                self.etcd.start_member(m)
            proc = self.cluster.candidates.get(i)
            if proc is not None and not proc.alive():
                self.cluster.start_candidate(i)

    def logs(self) -> list[Path]:
        """The candidates' log files."""
        return [self.cluster.root / f"{self.cluster.server_role}{i}.log" for i in range(3)]


def _others(eb: EtcdBed, host: Host) -> list[Host]:
    return [h for h in eb.hosts if h is not host]


def kill_primary(eb: EtcdBed) -> tuple[str, Undo]:
    i = eb.primary()
    eb.cluster.candidates[i].kill()
    return f"candidate {eb.cluster.address(i)}", lambda: None


def freeze_primary_host(eb: EtcdBed) -> tuple[str, Undo]:
    h = eb.hosts[eb.primary()]
    eb.bed.freeze(h)  # its etcd member too
    return f"host {h.name}", lambda: eb.bed.thaw(h)


def power_off_primary_host(eb: EtcdBed) -> tuple[str, Undo]:
    h = eb.hosts[eb.primary()]
    eb.bed.power_off(h)
    return f"host {h.name}", lambda: eb.bed.power_on(h)


def cut_primary_from_etcd(eb: EtcdBed) -> tuple[str, Undo]:
    h = eb.hosts[eb.primary()]
    eb.bed.partition(h, _others(eb, h))  # clients on cli still reach it
    return f"host {h.name} from the etcd majority", lambda: eb.bed.heal()


def kill_etcd_leader(eb: EtcdBed) -> tuple[str, Undo]:
    i = eb.etcd_leader()
    eb.etcd.kill(eb.etcd.members[i])
    return f"etcd member {eb.etcd.members[i].name}", lambda: None


def freeze_etcd_leader(eb: EtcdBed) -> tuple[str, Undo]:
    i = eb.etcd_leader()
    pid = eb.etcd.members[i].pid
    os.kill(pid, signal.SIGSTOP)
    return f"etcd member {eb.etcd.members[i].name}", lambda: os.kill(pid, signal.SIGCONT)


def power_off_standby_host(eb: EtcdBed) -> tuple[str, Undo]:
    p = eb.primary()
    h = eb.hosts[(p + 1) % 3]
    eb.bed.power_off(h)
    return f"host {h.name}", lambda: eb.bed.power_on(h)


FAULTS: dict[str, Callable[[EtcdBed], tuple[str, Undo]]] = {
    "kill-primary": kill_primary,
    "freeze-primary-host": freeze_primary_host,
    "power-off-primary-host": power_off_primary_host,
    "cut-primary-from-etcd": cut_primary_from_etcd,
    "kill-etcd-leader": kill_etcd_leader,
    "freeze-etcd-leader": freeze_etcd_leader,
    "power-off-standby-host": power_off_standby_host,
}


RAFT_LEADER_HERE = "the etcd raft leader was on the primary's host"


def _raft_leader_with_primary(eb: EtcdBed) -> bool:
    try:
        return eb.etcd_leader() == eb.primary()
    except RuntimeError:  # no member says it leads (an election): not on the primary's host
        return False


def _wait_write_after(eb: EtcdBed, history: History, t: float, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(op.outcome == OK and op.kind != "read" and op.invoked >= t
               for op in reversed(history.snapshot())):
            return True
        eb.ensure_running()  # a candidate that gave up its role meanwhile comes back a standby
        time.sleep(0.05)
    return False


def _wait_settled(eb: EtcdBed, timeout: float) -> None:
    """Wait until every candidate answers (one primary, the others standbys): a candidate that
    gave its role up after a fault restarts in seconds on a loaded machine, and a fault of
    the primary while no standby is up measures that restart, not a failover."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        eb.ensure_running()
        states = [eb.cluster.state_of(i) for i in range(len(eb.hosts))]
        if states.count("primary") == 1 and states.count("standby") == len(states) - 1:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the candidates did not settle (one primary, standbys) in {timeout:g} s")


def run(bed: FaultBed, root: Path, *, seed: int, faults: int, kinds: list[str] | None = None,
        writers: int = 2, recover_timeout: float = 30.0, settle: bool = False
        ) -> tuple[Verdict, list[FaultRecord]]:
    """A whole seeded run (module docstring): the checker's verdict and every fault's record.
    ``settle``: before each fault, wait until every candidate is up again (a failover
    benchmark's pacing; the nemesis's default does not wait)."""
    unknown = sorted(set(kinds or ()) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    rng = random.Random(seed)
    eb = EtcdBed(bed, root)
    records: list[FaultRecord] = []
    try:
        eb.start()
        history = History()
        load = Writers(history, eb.client, writers, seed=seed, gap=0.01)
        load.start()
        deadline = time.monotonic() + 30
        while history.counts().get("ok", 0) < 5:
            if time.monotonic() > deadline:
                raise TimeoutError("the writers' first writes")
            time.sleep(0.05)
        bag: list[str] = []
        try:
            for _ in range(faults):
                if not bag:
                    bag = list(kinds or FAULTS)
                    rng.shuffle(bag)
                kind = bag.pop()
                hold = rng.uniform(1.0, 2.5)
                if settle:
                    _wait_settled(eb, 90.0)
                lead_here = kind.endswith("primary-host") and _raft_leader_with_primary(eb)
                target, undo = FAULTS[kind](eb)
                rec = FaultRecord(kind, target, time.time())
                if lead_here:  # the primary's placement check had not moved it yet
                    rec.detail = RAFT_LEADER_HERE
                records.append(rec)
                logger.info("etcd nemesis: {} on {}, for {:.1f} s", kind, target, hold)
                time.sleep(max(0.0, rec.start + hold - time.time()))  # the fault's duration
                undo()
                rec.healed = time.time()
                rec.held = rec.healed - rec.start
                eb.ensure_running()
                rec.recovered = _wait_write_after(eb, history, rec.healed, recover_timeout)
                eb.wait_etcd()
                time.sleep(rng.uniform(0.3, 1.0))  # a quiet spell between faults
        finally:
            bed.heal_all()
            eb.ensure_running()
        load.stop()
        with eb.client("final") as c:
            resolve_unknown(history, c)
            jobs = all_jobs(c)
        acked = sorted((op.invoked, op.completed) for op in history.snapshot()
                       if op.outcome == OK and op.kind != "read" and op.completed is not None)
        for rec in records:
            after = [done for inv, done in acked if inv >= rec.start]
            rec.outage = (min(after) - rec.start) if after else None
        verdict = check(history.snapshot(), jobs, promotions=promotions_in_logs(eb.logs()))
        if load.errors:
            verdict.add("writer died", "; ".join(f"{type(e).__name__}: {e}" for e in load.errors))
        for rec in records:
            if not rec.recovered:
                verdict.add("not recovered", f"{rec.kind} on {rec.target}: no write acknowledged "
                            f"{recover_timeout:g} s after the heal")
        return verdict, records
    finally:
        eb.stop()
