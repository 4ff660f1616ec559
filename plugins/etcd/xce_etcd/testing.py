"""Real etcd members for tests and benchmarks, and controller candidates on several bed hosts.

:class:`EtcdCluster` starts ``etcd`` processes (Debian's ``etcd-server``; the command must be
on PATH, else :class:`EtcdMissing` names the package), each with its data in a directory of
its own under the given root, optionally inside a fault-bed host's network namespace, and
stops them by pid. The flags are the ones the operator's guide gives for a 1 s lease TTL
(:data:`TUNING`). :class:`MultiHostCluster` is a :class:`~xcecore.testing.cluster.LocalCluster`
whose candidates run one per bed host, with ``[controller] backend = "etcd"``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xce_etcd.client import EtcdClient, EtcdUnavailable, OutcomeUnknown
from xcecore.testing.cluster import LocalCluster, Proc, probe

TUNING = ("--heartbeat-interval=100", "--election-timeout=600")
"""etcd's raft timing for a 1 s lease: its minimum lease TTL is 1.5 election timeouts."""
LIMITS = ("--max-txn-ops=16384", f"--max-request-bytes={9 * 1024 * 1024}")
"""At least the backend's defaults ([etcd] max_txn_ops, max_request_bytes)."""


class EtcdMissing(RuntimeError):
    """The etcd binary is not installed."""


def etcd_binary() -> str:
    """The path of ``etcd``; EtcdMissing naming the package when there is none."""
    found = shutil.which("etcd")
    if found is None:
        raise EtcdMissing("the etcd tests need the 'etcd' command (Debian package etcd-server; "
                          "scripts/install-system-deps.sh installs it)")
    return found


@dataclass
class Member:
    """One etcd member: where it listens and its process."""

    name: str
    addr: str
    client_port: int
    peer_port: int
    data_dir: Path
    netns: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    scheme: str = "http"

    @property
    def url(self) -> str:
        """Its client URL."""
        return f"{self.scheme}://{self.addr}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """Its peer URL."""
        return f"http://{self.addr}:{self.peer_port}"

    @property
    def pid(self) -> int:
        """Its process id (started members only)."""
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it runs."""
        return self.popen is not None and self.popen.poll() is None


@dataclass
class EtcdCluster:
    """``len(addrs)`` etcd members, one per address (and network namespace, if given)."""

    root: Path
    addrs: list[str]
    netns: list[str | None] = field(default_factory=list)
    client_port: int = 2379
    peer_port: int = 2380
    extra: tuple[str, ...] = ()
    members: list[Member] = field(default_factory=list)
    tls: tuple[str, str, str] | None = None
    """(CA, certificate, key) files: clients connect with TLS (https://) and must present a
    certificate the CA signed; the members use the certificate for their client URLs."""

    def __post_init__(self) -> None:
        self.binary = etcd_binary()
        self.netns = self.netns or [None] * len(self.addrs)
        self.root.mkdir(parents=True, exist_ok=True)
        step = 0 if len(set(self.addrs)) == len(self.addrs) else 2  # one address: ports apart
        for i, addr in enumerate(self.addrs):
            self.members.append(Member(f"m{i}", addr, self.client_port + i * step,
                                       self.peer_port + i * step, self.root / f"m{i}",
                                       self.netns[i], scheme="https" if self.tls else "http"))

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL."""
        return [m.url for m in self.members]

    def start(self, timeout: float = 30.0) -> None:
        """Start every member and wait until the cluster answers."""
        for m in self.members:
            self.start_member(m, new=not m.data_dir.exists())
        self.wait_healthy(timeout)

    def start_member(self, m: Member, new: bool = False) -> None:
        """Start (or restart, with its data) member ``m``."""
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        cmd = [self.binary, "--name", m.name, "--data-dir", str(m.data_dir),
               "--listen-client-urls", m.url, "--advertise-client-urls", m.url,
               "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
               "--initial-cluster", initial, "--initial-cluster-token", f"xce-{self.root.name}",
               "--initial-cluster-state", "new", "--logger=zap", "--log-level=warn",
               *TUNING, *LIMITS, *self.extra]
        if self.tls is not None:
            ca, cert, key = self.tls
            cmd += ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca,
                    "--client-cert-auth"]
        if m.netns is not None:
            from xcecore.testing.netns import path_of

            cmd = ["nsenter", f"--net={path_of(m.netns)}", "--", *cmd]
        m.log = self.root / f"{m.name}.log"
        with m.log.open("ab") as fh:
            m.popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)

    def client(self, timeout: float = 1.0, transport: str = "gateway") -> EtcdClient:
        """A client of every member (from this namespace: loopback members only)."""
        ca, cert, key = self.tls if self.tls is not None else (None, None, None)
        return EtcdClient(self.endpoints, timeout=timeout, ca_file=ca, cert_file=cert,
                          key_file=key, transport=transport)

    def wait_healthy(self, timeout: float = 30.0, via: EtcdClient | None = None) -> None:
        """Wait until a member answers a status with a leader known."""
        client = via or self.client()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for m in self.members:
                    if m.popen is not None and m.popen.poll() is not None:
                        raise RuntimeError(f"etcd member {m.name} exited:\n{self.logs()}")
                with contextlib.suppress(EtcdUnavailable, OutcomeUnknown):
                    st = client.status(timeout=0.5)
                    if int(st.get("leader", 0)):
                        return
                time.sleep(0.05)
        finally:
            if via is None:
                client.close()
        raise TimeoutError(f"etcd not healthy after {timeout} s:\n{self.logs()}")

    def leader(self) -> int | None:
        """The index of the member that says it leads raft (asked of each member directly,
        from this network namespace), or None when none answers so."""
        for i, m in enumerate(self.members):
            if not m.alive():
                continue
            c = EtcdClient([m.url], timeout=0.5)
            try:
                st = c.status()
            except (OutcomeUnknown, EtcdUnavailable):
                continue
            finally:
                c.close()
            if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                return i
        return None

    def kill(self, m: Member, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to member ``m`` (by pid) and reap it after a SIGKILL."""
        if m.alive():
            os.kill(m.pid, sig)
            if sig == signal.SIGKILL:
                assert m.popen is not None
                m.popen.wait(10)

    def stop(self) -> None:
        """SIGKILL every member this cluster started, by pid."""
        for m in self.members:
            if m.popen is not None:
                with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                    if m.alive():
                        os.kill(m.pid, signal.SIGCONT)
                    self.kill(m)

    def logs(self) -> str:
        """Every member's log (the end of it)."""
        return "\n".join(f"===== etcd {m.name} =====\n{m.log.read_text(errors='replace')[-3000:]}"
                         for m in self.members if m.log is not None and m.log.exists())


def etcd_config(endpoints: list[str], prefix: str = "/xce", **keys: Any) -> str:
    """The ``[controller]`` backend line and the ``[etcd]`` table of a test cluster's config."""
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in keys.items())
    urls = ", ".join(f'"{e}"' for e in endpoints)
    return f'[etcd]\nendpoints = [{urls}]\nprefix = "{prefix}"\n{extra}'


CLIENT_LIVENESS = 1.0
"""The clients' ``[client] liveness_timeout`` with a 1 s lease (docs/operator.md): a primary
silent for a lease TTL has lost its lease, so a client waiting for it longer only waits."""


class MultiHostCluster(LocalCluster):
    """Candidates one per host (``hosts``: (address, network namespace, state dir)), backend etcd.

    ``controller_extra`` is more ``[controller]`` keys (text); ``etcd_text`` the ``[etcd]`` table.
    """

    def __init__(self, root: Path, hosts: list[tuple[str, str | None, Path]], etcd_text: str,
                 controller_extra: str = "", **kw: Any) -> None:
        self.hosts = hosts
        extra = f'[controller]\nbackend = "etcd"\n{controller_extra}{etcd_text}{kw.pop("extra_config", "")}'
        super().__init__(root, len(hosts), ports=[7600] * len(hosts), host=hosts[0][0],
                         netns=hosts[0][1], state=hosts[0][2], extra_config=extra, **kw)

    def config_text(self) -> str:
        """The test cluster's config, with the clients' liveness of a 1 s lease."""
        text = super().config_text()
        line = "liveness_timeout = 1.5\n"
        if line not in text:
            raise RuntimeError("xcecore.testing.cluster's [client] table changed: set "
                               "CLIENT_LIVENESS another way")
        return text.replace(line, f"liveness_timeout = {CLIENT_LIVENESS}\n", 1)

    @property
    def peers(self) -> str:
        """Every candidate's address."""
        return ",".join(f"{h[0]}:7600" for h in self.hosts)

    def address(self, index: int) -> str:
        """Candidate ``index``'s address."""
        return f"{self.hosts[index][0]}:7600"

    def start_candidate(self, index: int) -> Proc:
        """Start candidate ``index`` on its host."""
        _addr, ns, state = self.hosts[index]
        state.mkdir(parents=True, exist_ok=True)
        role = self.server_role
        proc = self.spawn(f"{role}{index}", role, f'{role}.listen="{self.address(index)}"',
                          f'{role}.state_dir="{state}"', netns=ns)
        self.candidates[index] = proc
        return proc

    def state_of(self, index: int) -> str | None:
        """``primary``, ``standby`` or None, asked from the candidate's own host."""
        addr, ns, _ = self.hosts[index]
        if ns is None:
            answer = probe(addr, 7600, self.method())
        else:
            from xcecore.testing.netns import entered

            with entered(ns):
                answer = probe(addr, 7600, self.method())
        return answer.get("state") if answer and answer.get("ok") else None
