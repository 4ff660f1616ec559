"""Run a whole xce cluster on this machine as real processes on loopback.

Used by ``xce up`` (the embedded cluster), by the pytest fixtures in :mod:`xcecore.testing.plugin`,
and by the benchmarks. The server role (the one registered with ``client=False``) runs as up
to three candidates sharing a state directory; client roles run as ``xce run ROLE``
processes with the same config file. Every process is started here and ended here, by pid.

Which candidate is primary is read from the handshake each candidate answers with, so this
module does not depend on the client library it is used to test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xcecore import wire
from xcecore.auth import AuthError, AuthFailed, AuthMethod, AuthSettings, client_answer, load_method
from xcecore.tls import TLS, TLSFailed, client_tls, wrap_socket

DEFAULT_KEY = "xce-test-key"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe(host: str, port: int, method: AuthMethod, timeout: float = 1.0,
          tls: TLS | None = None) -> dict[str, Any] | None:
    """Handshake with a controller candidate (authenticating with ``method``, over ``tls``
    when given); its answer (``state`` primary/standby) or None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.settimeout(timeout)
            s = raw if tls is None else wrap_socket(raw, tls, peer=f"controller {host}:{port}",
                                                    hostname=host)
            dec = wire.FrameDecoder()

            def read() -> dict[str, Any]:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed")
                    msgs = dec.feed(chunk)
                    if msgs:
                        return msgs[0]

            hello = read()
            if hello.get("state") == "standby":  # a standby says what it is before any credential
                return {"ok": True, **hello}
            s.sendall(wire.encode(client_answer(method, "probe@test", hello)))
            return read()
    except (OSError, ConnectionError, wire.WireError, AuthError, AuthFailed, TLSFailed):
        return None


def find_server_role() -> str:
    """The one installed role that serves instead of connecting (``RoleSpec.client=False``)."""
    from xcecore.plugins import PluginManager

    servers = [r.name for r in PluginManager.load().roles().values() if not r.client]
    if len(servers) != 1:
        raise RuntimeError(f"expected exactly one server role among the plugins, found {servers}")
    return servers[0]


@dataclass
class Proc:
    """A process the cluster started: its pid, log file and how it was started."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process (SIGKILL by default) and reap it if it was killed."""
        if self.alive():
            os.kill(self.pid, sig)
            if sig == signal.SIGKILL:
                self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class LocalCluster:
    """Controller candidates and roles as real processes on loopback, for tests."""

    root: Path
    ncandidates: int = 3
    key: str | None = DEFAULT_KEY
    extra_config: str = ""
    cluster_extra: str = ""  # more keys of the [cluster] table, e.g. site resources
    ports: list[int] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    candidates: dict[int, Proc] = field(default_factory=dict)
    server_role: str = ""
    # Where the candidates run: their address, the network namespace their processes start in
    # (None: this one) and their state directory (default ``root/state``). The fault test bed
    # (xcecore.testing.faultbed) sets these to run a cluster on its simulated hosts.
    host: str = "127.0.0.1"
    netns: str | None = None
    state: Path | None = None
    auth: str = "key"  # [cluster] auth; "munge" needs munge_socket (xcecore.testing.munge)
    munge_socket: str | None = None
    # TLS on: a CA and a certificate for the candidates' host are made in ``root/tls``, and
    # every process of the cluster uses them (``tls_dir`` then says where they are).
    tls: bool = False
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        self.server_role = self.server_role or find_server_role()
        if not 1 <= self.ncandidates <= 3:
            raise ValueError("a cluster has 1 to 3 controller candidates")
        self.ports = self.ports or [free_port(self.host) for _ in range(self.ncandidates)]
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.state or self.root / "state"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.tls_dir = self.root / "tls"
        if self.tls and not (self.tls_dir / "ca.pem").exists():
            from xcecore.tlscerts import make_ca, make_host

            make_ca(self.tls_dir)
            make_host(self.tls_dir, "host", [self.host, "localhost"])
        self.config_path = self.root / "xce.toml"
        self.config_path.write_text(self.config_text())

    @property
    def peers(self) -> str:
        """The candidate list as a peers string."""
        return ",".join(f"{self.host}:{p}" for p in self.ports)

    def address(self, index: int) -> str:
        """Candidate ``index``'s address (``host:port``)."""
        return f"{self.host}:{self.ports[index]}"

    def config_text(self) -> str:
        """The config file every process of this cluster reads."""
        if self.auth == "key":
            key = f'key = "{self.key}"\n' if self.key else ""
        else:
            key = f'auth = "{self.auth}"\n' + (
                f'munge_socket = "{self.munge_socket}"\n' if self.munge_socket else "")
        return (
            f'[cluster]\npeers = "{self.peers}"\n{key}{self.cluster_extra}'
            "[client]\nliveness_timeout = 1.5\nheartbeat_interval = 0.2\n"
            "connect_timeout = 0.5\nbackoff_base = 0.02\nbackoff_cap = 0.5\n"
            f"{self.tls_config()}{self.extra_config}"
        )

    def tls_config(self) -> str:
        """The ``[tls]`` table of a TLS cluster ("" otherwise)."""
        if not self.tls:
            return ""
        d = self.tls_dir
        return (f'[tls]\nca = "{d / "ca.pem"}"\ncert = "{d / "host.pem"}"\n'
                f'key = "{d / "host-key.pem"}"\n'
                f"require_client_cert = {'true' if self.require_client_cert else 'false'}\n")

    def client_tls(self) -> TLS | None:
        """The client side's TLS of this cluster's processes (None: plain TCP)."""
        if not self.tls:
            return None
        d = self.tls_dir
        return client_tls({"ca": str(d / "ca.pem"), "cert": str(d / "host.pem"),
                           "key": str(d / "host-key.pem")})

    def spawn(self, name: str, role: str, *overrides: str, env: dict[str, str] | None = None,
              netns: str | None = None) -> Proc:
        """Start ``xce run ROLE`` as a child process with this cluster's config.

        ``netns``: the network namespace (``/run/netns/NAME``) it runs in; ``nsenter`` execs
        the role there, so the pid is the role's own.
        """
        log = self.root / f"{name}.log"
        cmd = [sys.executable, "-m", "xcecore", "--config", str(self.config_path), "run", role]
        if netns is not None:
            from xcecore.testing.netns import path_of

            cmd = ["nsenter", f"--net={path_of(netns)}", "--", *cmd]
        for o in overrides:
            cmd += ["--set", o]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("ab") as fh:
            popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_candidate(self, index: int) -> Proc:
        """Start controller candidate ``index`` (0-based) on its port."""
        role = self.server_role
        # The state directory goes on the command line: extra_config may hold a [controller]
        # table of its own, and TOML allows a table once.
        proc = self.spawn(f"{role}{index}", role, f'{role}.listen="{self.address(index)}"',
                          f'{role}.state_dir="{self.state_dir}"', netns=self.netns)
        self.candidates[index] = proc
        return proc

    def start(self, timeout: float = 30.0) -> int:
        """Start every candidate in order; return the index of the primary once there is one."""
        first = self.start_candidate(0)
        self.wait_primary(timeout)  # candidate 0 is primary: tests may rely on that
        del first
        for i in range(1, self.ncandidates):
            self.start_candidate(i)
        for i in range(1, self.ncandidates):
            self.wait_state(i, "standby", timeout)
        return 0

    def state_of(self, index: int) -> str | None:
        """``primary``, ``standby`` or None (down) for candidate ``index``."""
        if self.netns is None:
            answer = probe(self.host, self.ports[index], self.method(), tls=self._probe_tls)
        else:
            from xcecore.testing.netns import entered

            with entered(self.netns):  # the probe's socket is made on the candidates' host
                answer = probe(self.host, self.ports[index], self.method(), tls=self._probe_tls)
        return answer.get("state") if answer and answer.get("ok") else None

    @property
    def _probe_tls(self) -> TLS | None:
        found = self.__dict__.get("_tls_cache")
        if found is None and self.tls:
            found = self.__dict__["_tls_cache"] = self.client_tls()
        return found

    def method(self) -> AuthMethod:
        """The authentication method this cluster's processes use."""
        if self.auth == "key":
            return load_method(AuthSettings(
                "key", key=self.key.encode() if self.key else None))
        return load_method(AuthSettings(self.auth, munge_socket=self.munge_socket))

    def wait_state(self, index: int, state: str, timeout: float = 30.0) -> None:
        """Wait until candidate ``index`` answers with ``state``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state_of(index) == state:
                return
            proc = self.candidates.get(index)
            if proc is not None and not proc.alive():
                raise RuntimeError(f"candidate {index} exited:\n{proc.text()[-3000:]}")
            time.sleep(0.02)
        raise TimeoutError(f"candidate {index} not {state} after {timeout} s")

    def primary(self) -> int | None:
        """The index of the candidate that answers as primary, if any."""
        for i in range(len(self.ports)):
            if i in self.candidates and self.candidates[i].alive() and self.state_of(i) == "primary":
                return i
        return None

    def wait_primary(self, timeout: float = 30.0, exclude: int | None = None) -> int:
        """Wait for a primary (other than ``exclude``); its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.primary()
            if found is not None and found != exclude:
                return found
            time.sleep(0.01)
        raise TimeoutError(f"no primary after {timeout} s")

    def kill_primary(self, timeout: float = 30.0) -> tuple[int, int]:
        """SIGKILL the primary and wait for a standby to promote: (old index, new index)."""
        old = self.wait_primary(timeout)
        self.candidates[old].kill()
        return old, self.wait_primary(timeout, exclude=old)

    def start_role(self, role: str, *overrides: str, name: str | None = None,
                   env: dict[str, str] | None = None, netns: str | None = None) -> Proc:
        """Start a client role process (``worker``, ``scheduler``, a third party's...)."""
        return self.spawn(name or role, role, *overrides, env=env, netns=netns)

    def start_apiserver(self, port_file: Path, *overrides: str, name: str = "apiserver",
                        timeout: float = 30.0) -> tuple[Proc, str]:
        """Start an API server on a free loopback port (written to ``port_file``) and wait
        until ``/xce/v1/readyz`` answers 200: ``(process, "http://127.0.0.1:PORT")``. Raises
        :class:`RuntimeError` with its log if it exits first."""
        import urllib.error
        import urllib.request

        port_file.unlink(missing_ok=True)
        proc = self.start_role("apiserver", 'apiserver.listen="127.0.0.1:0"',
                               f'apiserver.port_file="{port_file}"', *overrides, name=name)

        def port() -> str:
            if not proc.alive():
                raise RuntimeError(f"the API server {name} exited:\n{proc.text()[-4000:]}")
            return port_file.read_text().strip() if port_file.exists() else ""

        base = f"http://127.0.0.1:{int(wait_for(port, timeout, what=f'{name} port file'))}"

        def ready() -> bool:
            port()  # still alive
            try:
                with urllib.request.urlopen(f"{base}/xce/v1/readyz", timeout=5) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for(ready, timeout, what=f"{name} ready (/xce/v1/readyz 200)")
        return proc, base

    def close(self) -> None:
        """Kill every process this cluster started, by pid."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                proc.kill()

    def logs(self) -> str:
        """Every process's log, for failure messages."""
        return "\n".join(f"===== {p.name} (pid {p.pid}) =====\n{p.text()[-4000:]}" for p in self.procs)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll ``cond`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what or cond}")
