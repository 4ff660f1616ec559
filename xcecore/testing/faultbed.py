"""The fault test bed: simulated hosts on one machine, and the faults real hosts suffer.

Each simulated host is a Linux network namespace with its own address in 127.100.0.0/16,
its own state and spool directories and its own processes. The hosts' links (veth pairs) meet
on a bridge in a namespace of the bed's own, so nothing the bed does touches this machine's
own network: all traffic stays inside the bed's namespaces (``route_localnet`` lets the
127.100/16 addresses cross the veth links; each host's loopback keeps only 127.0.0.1).

Faults (all real): SIGKILL a process; freeze a host (SIGSTOP every process in its namespace)
and thaw it; power a host off (SIGKILL every process, link down) and on (link up: like a
reboot, nothing runs until started again); partition hosts, also one way and per port, and
random loss (nftables in the receiving host); slow links (a delaying relay, see
:mod:`delayproxy`: this kernel has no netem); a full disk on a host's state directory (a small
tmpfs filled up, then freed).

Every namespace, mount, link, rule and process the bed makes is removed by :meth:`close`,
also on failure; a namespace or mount left by an earlier run that crashed is named after its
dead process (``xfb<pid>-...``), reported and removed when the next bed starts.

Needs root and ``ip``, ``nft``, ``nsenter``, ``ss``, ``mount``, ``sysctl``; without them :class:`BedError`
names what is missing. ``scripts/install-system-deps.sh`` installs the tools.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xcecore.testing import netns
from xcecore.testing.delayproxy import DelayProxy
from xcecore.testing.faultbed_system import (
    PREFIX,
    BedError,
    clean_stale,
    kill_all,
    mounts,
    pids_in,
    proc_state,
    requirements,
    run,
)

if TYPE_CHECKING:
    from xcecore.client import SyncClient
    from xcecore.testing.cluster import LocalCluster, Proc

__all__ = ["NET", "PREFIX", "BedError", "FaultBed", "Host", "clean_stale", "nft_rules", "pids_in",
           "requirements"]

NET = "127.100"
PROXY_PORT_BASE = 64000
_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_counter = iter(range(1, 1 << 30))


def nft_rules(host: str, addr: Mapping[str, str], drops: Mapping[tuple[str, str, int | None], int],
              slow: Mapping[tuple[str, str], int]) -> str:
    """The nftables ruleset of ``host`` (pure: for ``nft -f``, replacing the bed's tables).

    ``drops``: (source host, destination host, port) -> loss percent, where port None is every
    packet, a positive port TCP to that port, a negative one TCP from it (the answers); only
    the pairs whose destination is ``host`` apply here (a host drops what it receives).
    ``slow``: (source, destination) -> the relay's port: new TCP connections from the source
    to ``host`` are redirected to it.
    """
    rules = []
    for (src, dst, port), percent in sorted(drops.items(), key=str):
        if dst != host:
            continue
        match = f"ip saddr {addr[src]}"
        if port is not None:
            match += f" tcp dport {port}" if port > 0 else f" tcp sport {-port}"
        drop = "drop" if percent >= 100 else f"numgen random mod 100 < {percent} drop"
        rules.append(f"    {match} {drop}")
    nat = [f"    ip saddr {addr[src]} ip daddr {addr[host]} tcp dport != {port} redirect to :{port}"
           for (src, dst), port in sorted(slow.items()) if dst == host]
    return (
        "table inet xfb {}\ndelete table inet xfb\n"
        "table inet xfb {\n  chain input {\n    type filter hook input priority 0; policy accept;\n"
        + "\n".join(rules) + "\n  }\n}\n"
        "table ip xfbnat {}\ndelete table ip xfbnat\n"
        "table ip xfbnat {\n  chain pre {\n    type nat hook prerouting priority -100; policy accept;\n"
        + "\n".join(nat) + "\n  }\n}\n"
    )


@dataclass
class Host:
    """One simulated host."""

    name: str
    index: int
    addr: str
    netns: str
    root: Path
    state_dir: Path
    spool_dir: Path
    veth: str
    disk: str | None = None  # tmpfs size of the state directory ("16m"), if it is a mount
    powered: bool = True
    frozen: set[int] = field(default_factory=set)

    @property
    def ns_inode(self) -> int:
        """The inode of the host's network namespace."""
        return netns.inode_of(self.netns)


class FaultBed:
    """Simulated hosts and faults; see the module docstring. Use as a context manager."""

    def __init__(self, root: Path) -> None:
        missing = requirements()
        if missing:
            raise BedError(missing)
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.stale_removed = clean_stale()
        self.tag = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.bed_ns = f"{self.tag}-bed"
        self.hosts: dict[str, Host] = {}
        self.clusters: list[LocalCluster] = []
        self._drops: dict[tuple[str, str, int | None], int] = {}  # (src, dst, port) -> loss %
        self._slow: dict[tuple[str, str], DelayProxy] = {}
        self._mounted: list[Path] = []
        self._at_close: list[Callable[[], object]] = []
        self._closed = False
        run(["ip", "netns", "add", self.bed_ns])
        try:
            run(["ip", "-n", self.bed_ns, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", self.bed_ns, "link", "set", "br0", "up"])
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> FaultBed:
        return self

    def at_close(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` when the bed closes, after every process on it is dead and before the
        hosts' disks are unmounted (e.g. to remove what killed processes left outside the
        bed, as a SIGKILLed worker's job cgroups listed in its state directory)."""
        self._at_close.append(fn)

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hosts ---------------------------------------------------------------------------------

    def add_host(self, name: str, *, disk: str | None = None,
                 shared: dict[str, Path] | None = None) -> Host:
        """A new host ``name`` (lower-case letters and digits, at most 10).

        ``disk`` makes its state directory a tmpfs of that size (``"16m"``): needed for
        :meth:`fill_disk`. ``shared`` maps a sub-directory of the host's directory to a
        directory that other hosts see too (``{"state": bed.shared("ctl")}``), as NFS would
        be; nothing is shared unless a test says so.
        """
        if not _NAME.match(name):
            raise BedError(f"host name {name!r}: use 1-10 lower-case letters and digits")
        if name in self.hosts:
            raise BedError(f"host {name!r} exists already")
        index = len(self.hosts) + 1
        if index > 250:
            raise BedError("the bed holds at most 250 hosts")
        root = self.root / name
        host = Host(name, index, f"{NET}.0.{index}", f"{self.tag}-{name}", root,
                    root / "state", root / "spool", f"v{index}", disk)
        for sub, target in (shared or {}).items():
            target.mkdir(parents=True, exist_ok=True)
            if (root / sub).exists() or (root / sub).is_symlink():
                raise BedError(f"host {name}: {sub} exists already")
            root.mkdir(parents=True, exist_ok=True)
            (root / sub).symlink_to(target, target_is_directory=True)
        for d in (host.state_dir, host.spool_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.hosts[name] = host
        run(["ip", "netns", "add", host.netns])
        if disk is not None:
            run(["mount", "-t", "tmpfs", "-o", f"size={disk},mode=0755",
                  f"{self.tag}-{name}", str(host.state_dir)])
            self._mounted.append(host.state_dir)
        ns, bed = host.netns, self.bed_ns
        run(["ip", "-n", bed, "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
              "netns", ns])
        run(["ip", "-n", bed, "link", "set", host.veth, "master", "br0", "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # Only 127.0.0.1 stays local: the rest of 127/8 must route out to the other hosts.
        run(["ip", "-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo"], check=False)
        run(["ip", "-n", ns, "addr", "add", "127.0.0.1/32", "dev", "lo"], check=False)
        run(["nsenter", f"--net={netns.path_of(ns)}", "--", "sysctl", "-q", "-w",
              "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1"])
        run(["ip", "-n", ns, "addr", "add", f"{host.addr}/16", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        self._render(host)
        return host

    def shared(self, name: str) -> Path:
        """A directory for hosts to share (pass it in ``add_host(shared=...)``)."""
        path = self.root / "shared" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        try:
            return self.hosts[name]
        except KeyError:
            raise BedError(f"no host {name!r}; hosts: {', '.join(self.hosts) or 'none'}") from None

    def pids(self, host: Host | str) -> list[int]:
        """Every process running on ``host``."""
        return pids_in(self._h(host).ns_inode)

    def command(self, host: Host | str, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as run on ``host`` (for ``subprocess``)."""
        return ["nsenter", f"--net={netns.path_of(self._h(host).netns)}", "--", *cmd]

    def run(self, host: Host | str, cmd: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on ``host`` to completion."""
        return subprocess.run(self.command(host, cmd), capture_output=True, text=True, timeout=timeout)

    def _h(self, host: Host | str) -> Host:
        return host if isinstance(host, Host) else self.host(host)

    # -- clusters on the bed -------------------------------------------------------------------

    def cluster(self, host: Host | str, ncandidates: int = 3, **kw: Any) -> LocalCluster:
        """Controller candidates on ``host`` (one host: the file backend), ports 7600, 7601, ...

        Keyword arguments go to :class:`LocalCluster`. Start it with ``.start()``; start roles
        on any host with :meth:`start_role`. Closed with the bed.
        """
        from xcecore.testing.cluster import LocalCluster

        h = self._h(host)
        cluster = LocalCluster(self.root / f"cluster{len(self.clusters)}", ncandidates,
                               ports=[7600 + i for i in range(ncandidates)], host=h.addr,
                               netns=h.netns, state=h.state_dir, **kw)
        self.clusters.append(cluster)
        return cluster

    def start_role(self, cluster: LocalCluster, host: Host | str, role: str, *overrides: str,
                   name: str | None = None, env: dict[str, str] | None = None) -> Proc:
        """Start ``xce run ROLE`` on ``host`` with ``cluster``'s config."""
        h = self._h(host)
        return cluster.start_role(role, *overrides, name=name or f"{role}-{h.name}", env=env,
                                  netns=h.netns)

    @contextlib.contextmanager
    def client(self, cluster: LocalCluster, host: Host | str, role: str = "cli", *,
               name: str | None = None, hooks: Any = None, join: bool = False,
               connect: bool = True, **attrs: Any) -> Iterator[SyncClient]:
        """``with bed.client(cluster, host) as c:`` a connected blocking client whose sockets
        live on ``host``, as ``role@NAME`` (default: the host's name); ``hooks`` are its client
        hooks, ``attrs`` its join attributes; ``join=True`` joins first. ``connect=False``
        leaves connecting to the first call (which may then carry a deadline)."""
        from xcecore.client import SyncClient
        from xcecore.runtime import client_config, load

        h = self._h(host)
        _, config = load(cluster.config_path)
        cfg = client_config(config, f"{role}@{name or h.name}")
        opened = SyncClient.open(cfg, role=role, hooks=hooks, join_attrs=attrs or None,
                                 connect=connect)
        with netns.entered(h.netns):  # the client's loop thread starts here, and stays there
            client = opened.__enter__()
        try:
            if join:
                client.join(deadline=30)
            yield client
        finally:
            opened.__exit__(None, None, None)

    # -- process faults ------------------------------------------------------------------------

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one process (of any host)."""
        os.kill(pid, sig)

    def freeze(self, host: Host | str, timeout: float = 10.0) -> list[int]:
        """SIGSTOP every process of ``host`` (repeated until no new one appears); the pids."""
        h = self._h(host)
        deadline = time.monotonic() + timeout
        while True:
            new = [p for p in self.pids(h) if p not in h.frozen]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                h.frozen.add(pid)
            if time.monotonic() > deadline:
                raise BedError(f"host {h.name}: processes keep appearing while freezing it")
        for pid in h.frozen:  # stopped for real before this returns
            # "D" counts: a process in uninterruptible sleep handles the pending SIGSTOP before
            # it runs another instruction of its own (and a vfork parent whose child was
            # stopped before its exec stays in "D" until the thaw).
            while proc_state(pid) not in (None, "T", "t", "D", "Z", "X"):
                if time.monotonic() > deadline:
                    raise BedError(f"host {h.name}: pid {pid} did not stop")
                time.sleep(0.001)
        return sorted(h.frozen)

    def thaw(self, host: Host | str) -> None:
        """SIGCONT every process of ``host``."""
        h = self._h(host)
        for pid in set(self.pids(h)) | h.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        h.frozen.clear()

    def power_off(self, host: Host | str) -> None:
        """SIGKILL every process of ``host`` and take its link down."""
        h = self._h(host)
        run(["ip", "-n", self.bed_ns, "link", "set", h.veth, "down"])
        kill_all(h.ns_inode)
        h.frozen.clear()
        h.powered = False

    def power_on(self, host: Host | str, timeout: float = 10.0) -> None:
        """Bring ``host``'s link back up (returns once it has carrier); nothing runs on it
        until started again, and it has forgotten its neighbours, as after a reboot."""
        h = self._h(host)
        run(["ip", "-n", self.bed_ns, "link", "set", h.veth, "up"])
        run(["ip", "-n", h.netns, "neigh", "flush", "all"], check=False)
        deadline = time.monotonic() + timeout
        while "LOWER_UP" not in run(["ip", "-n", h.netns, "link", "show", "eth0"]):
            if time.monotonic() > deadline:
                raise BedError(f"host {h.name}: link has no carrier {timeout} s after power-on")
            time.sleep(0.01)
        h.powered = True

    # -- network faults ------------------------------------------------------------------------

    def partition(self, a: Host | str | Iterable[Host | str], b: Host | str | Iterable[Host | str],
                  *, one_way: bool = False, port: int | None = None) -> None:
        """Drop every packet from ``a`` to ``b`` (and back, unless ``one_way``).

        With ``port``: only TCP to that port of ``b`` (and its answers, unless ``one_way``),
        e.g. to black-hole one candidate's clients but not the host.
        """
        self.loss(a, b, 100, one_way=one_way, port=port)

    def loss(self, a: Host | str | Iterable[Host | str], b: Host | str | Iterable[Host | str],
             percent: int, *, one_way: bool = False, port: int | None = None) -> None:
        """Drop ``percent`` % of the packets from ``a`` to ``b`` at random (0 heals)."""
        if not 0 <= percent <= 100:
            raise BedError(f"loss must be 0-100 %, got {percent}")
        touched: set[str] = set()
        for src in self._many(a):
            for dst in self._many(b):
                pairs = [(src, dst)] if one_way else [(src, dst), (dst, src)]
                for i, (s, d) in enumerate(pairs):
                    key = (s.name, d.name, port if i == 0 else -port if port else None)
                    if percent:
                        self._drops[key] = percent
                    else:
                        self._drops.pop(key, None)
                    touched.add(d.name)
        for name in touched:
            self._render(self.hosts[name])

    def heal(self, a: Host | str | None = None, b: Host | str | None = None) -> None:
        """Undo partitions and loss (all of them, or those between ``a`` and ``b``)."""
        if a is None or b is None:
            touched = {d for _, d, _ in self._drops}
            self._drops.clear()
        else:
            names = {self._h(a).name, self._h(b).name}
            touched = set()
            for key in [k for k in self._drops if {k[0], k[1]} == names]:
                del self._drops[key]
                touched.add(key[1])
        for name in touched:
            self._render(self.hosts[name])

    def slow(self, a: Host | str, b: Host | str, delay: float, jitter: float = 0.0, *,
             one_way: bool = False, seed: int = 0) -> None:
        """Delay TCP between ``a`` and ``b`` by ``delay`` ± ``jitter`` seconds each way.

        Connections from ``a`` to ``b`` go through a delaying relay (and from ``b`` to ``a``
        unless ``one_way``). The TCP connections already open between them are reset, so
        their peers reconnect through the slow link (a real link would slow them in place).
        """
        pairs = [(self._h(a), self._h(b))] + ([] if one_way else [(self._h(b), self._h(a))])
        for src, dst in pairs:
            self._unslow(src, dst)
            port = PROXY_PORT_BASE + src.index
            self._slow[(src.name, dst.name)] = DelayProxy(dst.netns, dst.addr, port, delay,
                                                          jitter, seed=seed + src.index)
            self._render(dst)
        for src, dst in pairs:
            self._reset(src, dst)

    def unslow(self, a: Host | str | None = None, b: Host | str | None = None) -> None:
        """Remove slow links (all, or between ``a`` and ``b``); relayed connections reset."""
        for s, d in list(self._slow):
            if a is None or b is None or {s, d} == {self._h(a).name, self._h(b).name}:
                self._unslow(self.hosts[s], self.hosts[d])

    def _unslow(self, src: Host, dst: Host) -> None:
        proxy = self._slow.pop((src.name, dst.name), None)
        if proxy is not None:
            self._render(dst)
            proxy.close()

    def _reset(self, src: Host, dst: Host, timeout: float = 10.0) -> None:
        """Abort the TCP connections from ``src`` that reach ``dst`` directly, not through the
        relay, until none is left (a reconnect that reuses a port may miss the redirect once:
        netfilter remembers the old connection)."""
        proxy = self._slow.get((src.name, dst.name))
        keep = f" and not sport = :{proxy.port}" if proxy is not None else ""
        filt = f"dst {src.addr}{keep}"
        deadline = time.monotonic() + timeout
        while True:
            self.run(dst, ["ss", "-K", "-t", filt])
            left = self.run(dst, ["ss", "-H", "-t", "state", "established", filt]).stdout.strip()
            if not left:
                return
            if time.monotonic() > deadline:
                raise BedError(f"slow link {src.name} -> {dst.name}: connections stay direct:\n{left}")
            time.sleep(0.01)  # the peers reconnect; then look again

    def _many(self, x: Host | str | Iterable[Host | str]) -> list[Host]:
        if isinstance(x, Host | str):
            return [self._h(x)]
        return [self._h(h) for h in x]

    def _render(self, host: Host) -> None:
        """Replace ``host``'s nftables rules with what the faults on it say, atomically."""
        addr = {name: h.addr for name, h in self.hosts.items()}
        slow = {pair: proxy.port for pair, proxy in self._slow.items()}
        text = nft_rules(host.name, addr, self._drops, slow)
        proc = subprocess.run(self.command(host, ["nft", "-f", "-"]), input=text,
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise BedError(f"host {host.name}: nft refused the rules: {proc.stderr.strip()}\n{text}")

    def rules(self, host: Host | str) -> str:
        """``host``'s nftables ruleset, as ``nft list ruleset`` prints it."""
        return self.run(host, ["nft", "list", "ruleset"]).stdout

    # -- disk faults ---------------------------------------------------------------------------

    def fill_disk(self, host: Host | str) -> int:
        """Fill ``host``'s state directory (a tmpfs: ``add_host(disk=...)``); bytes taken."""
        h = self._h(host)
        if h.disk is None:
            raise BedError(f"host {h.name}: its state directory is no bed mount; "
                           "create the host with add_host(..., disk='16m')")
        fd = os.open(h.state_dir / ".xfb-fill", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            st = os.statvfs(h.state_dir)
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
            chunk = b"\0" * 4096
            while True:  # what fallocate left: the last partial pages
                try:
                    os.write(fd, chunk)
                except OSError:
                    break
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free_disk(self, host: Host | str) -> None:
        """Give the space :meth:`fill_disk` took back."""
        with contextlib.suppress(FileNotFoundError):
            (self._h(host).state_dir / ".xfb-fill").unlink()

    # -- the end -------------------------------------------------------------------------------

    def heal_all(self) -> None:
        """Undo every fault: thaw, power on, heal partitions, remove slow links, free disks."""
        for h in self.hosts.values():
            if h.frozen:
                self.thaw(h)
            if not h.powered:
                self.power_on(h)
            if h.disk is not None:
                self.free_disk(h)
        self.unslow()
        self.heal()

    def leftovers(self) -> list[str]:
        """What of this bed still exists (namespaces, mounts, processes); [] after close()."""
        out = []
        names = os.listdir(netns.NETNS_DIR) if os.path.isdir(netns.NETNS_DIR) else []
        out += [f"network namespace {n}" for n in names if n.startswith(self.tag + "-")]
        out += [f"mount {s} on {t}" for s, t in mounts() if s.startswith(self.tag)]
        return out

    def close(self) -> None:
        """Remove everything the bed made; raise BedError naming anything that stays."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for cluster in self.clusters:
            try:
                for proc in cluster.procs:  # a frozen process dies of SIGKILL all the same
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGCONT)
                cluster.close()
            except Exception as exc:
                errors.append(f"closing a cluster: {exc}")
        for s, d in list(self._slow):
            self._slow.pop((s, d)).close()
        for h in self.hosts.values():
            try:
                kill_all(h.ns_inode)
            except (OSError, BedError) as exc:
                errors.append(f"host {h.name}: {exc}")
        for fn in self._at_close:
            try:
                fn()
            except Exception as exc:
                errors.append(f"a clean-up at close ({fn!r}): {exc}")
        for path in reversed(self._mounted):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
        for name in [h.netns for h in self.hosts.values()] + [self.bed_ns]:
            run(["ip", "netns", "del", name], check=False)
        errors += self.leftovers()
        if errors:
            raise BedError("the fault bed could not remove: " + "; ".join(errors))
