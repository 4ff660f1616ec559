"""A whole cluster on the fault test bed, ready for a nemesis: the hosts, roles and evidence.

Hosts: ``ctl`` (three controller candidates sharing its state directory: the file backend is
one host), ``n1``.. (a worker each), ``svc`` (the scheduler and the API server) and ``cli``
(the recorded clients and the observer). Every state directory is a small tmpfs, so any host's
disk can be filled. :meth:`ChaosCluster.ensure_running` plays the supervisor (systemd's
``Restart=always``): it restarts every process that died, on hosts that are powered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from xcecore.testing.cluster import LocalCluster, Proc
from xcecore.testing.faultbed import FaultBed, Host
from xcecore.testing.workload import RUNS_ENV

PARKED = "parked"  # an inactive queue: durable writes that never run
CHAOS_CONFIG = (
    '[controller]\nadmins = ["chaos"]\nhost_timeout = 10.0\nhung_timeout = {hung}\n'
    'queues = [{{ name = "normal", priority = 30 }}, '
    f'{{{{ name = "{PARKED}", priority = 10, active = false }}}}]\n'
    "[apiserver]\nlisten = \"{svc}:8080\"\nhname = \"svc\"\n"
    "[scheduler]\nhname = \"svc\"\n"
)


@dataclass
class RoleProc:
    """A role process the supervisor keeps running."""

    name: str
    host: Host
    role: str
    overrides: tuple[str, ...]
    env: dict[str, str]
    proc: Proc | None = None
    identity: str = ""


class ChaosCluster:
    """The standard cluster of the chaos runs (see the module docstring)."""

    def __init__(self, bed: FaultBed, *, workers: int = 2, hung_timeout: float = 2.0,
                 disk: str = "24m", extra_config: str = "") -> None:
        self.bed = bed
        self.ctl = bed.add_host("ctl", disk=disk)
        self.workers = [bed.add_host(f"n{i}", disk=disk) for i in range(1, workers + 1)]
        self.svc = bed.add_host("svc")
        self.cli = bed.add_host("cli")
        self.hung_timeout = hung_timeout
        self.cluster: LocalCluster = bed.cluster(
            self.ctl, 3,
            extra_config=CHAOS_CONFIG.format(hung=hung_timeout, svc=self.svc.addr) + extra_config)
        self.roles: list[RoleProc] = []
        for h in self.workers:
            self.roles.append(RoleProc(
                f"worker-{h.name}", h, "worker",
                (f'worker.hname="{h.name}"', f'worker.state_dir="{h.state_dir}"', "worker.slots=4",
                 "worker.ncpus=4", "worker.kill_grace=1.0", "worker.hello_interval=1.0"),
                {RUNS_ENV: str(h.spool_dir / "runs.log")}, identity=f"worker@{h.name}"))
        self.roles.append(RoleProc("scheduler-svc", self.svc, "scheduler", (), {},
                                   identity="scheduler@svc"))
        self.roles.append(RoleProc("apiserver-svc", self.svc, "apiserver", (), {},
                                   identity="apiserver@svc"))

    def start(self, timeout: float = 60.0) -> None:
        """Start the candidates, then every role; wait until the roles have joined."""
        self.cluster.start(timeout)
        for r in self.roles:
            self._start(r)
        self.wait_members(self.expected_members(observer=False), timeout)

    def _start(self, r: RoleProc) -> None:
        r.proc = self.bed.start_role(self.cluster, r.host, r.role, *r.overrides, name=r.name,
                                     env=r.env)

    def ensure_running(self) -> list[str]:
        """Restart what died, where the host is powered; what was restarted."""
        restarted = []
        if self.ctl.powered and not self.ctl.frozen:
            for i in range(self.cluster.ncandidates):
                proc = self.cluster.candidates.get(i)
                if proc is None or not proc.alive():
                    self.cluster.start_candidate(i)
                    restarted.append(f"candidate {i}")
        for r in self.roles:
            if r.host.powered and not r.host.frozen and (r.proc is None or not r.proc.alive()):
                self._start(r)
                restarted.append(r.name)
        if restarted:
            logger.info("chaos: restarted {}", ", ".join(restarted))
        return restarted

    def expected_members(self, observer: bool = True) -> list[str]:
        """Identities that must be joined to the primary when all is well."""
        return [r.identity for r in self.roles] + (["checker@cli"] if observer else [])

    def members(self) -> list[str]:
        """Identities joined to the current primary (empty when none answers)."""
        try:
            with self.bed.client(self.cluster, self.cli, "cli", name="status", connect=False) as c:
                status = c.call("status", deadline=5)
        except Exception:
            return []
        return sorted(m["identity"] for m in status.get("member_list", []))

    def wait_members(self, expected: list[str], timeout: float) -> list[str]:
        """Wait until ``expected`` are all joined (polled with a deadline); who is."""
        deadline = time.monotonic() + timeout
        joined: list[str] = []
        while time.monotonic() < deadline:
            joined = self.members()
            if set(expected) <= set(joined):
                return joined
            time.sleep(0.2)
        return joined

    @contextmanager
    def client(self, name: str, hooks: Any = None) -> Iterator[Any]:
        """A connected blocking client on ``cli``: a writer ``cli@NAME``, or with ``hooks``
        the observer ``checker@cli``."""
        if hooks is not None:
            with self.bed.client(self.cluster, self.cli, "checker", hooks=hooks) as c:
                yield c
        else:
            with self.bed.client(self.cluster, self.cli, "cli", name=name) as c:
                yield c

    def candidate_logs(self) -> list[Path]:
        """Every candidate's log file (all its incarnations append to it)."""
        role = self.cluster.server_role
        return [self.cluster.root / f"{role}{i}.log" for i in range(self.cluster.ncandidates)]

    def markers(self) -> dict[str, Path]:
        """Each worker host's run-marker file."""
        return {h.name: h.spool_dir / "runs.log" for h in self.workers}

    def logs(self) -> str:
        """Every process's log tail, for a failure message."""
        return self.cluster.logs()

