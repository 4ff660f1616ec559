"""pytest plugin for role authors (``pytest11`` entry point): real clusters in tests.

Installing xce makes these fixtures available to any test session:

- ``xce_cluster``: a factory for a :class:`LocalCluster` — one to three controller candidates
  as real processes on free loopback ports sharing a temporary state directory, plus any
  role (``cluster.start_role("worker", hname="n1")``) as a real ``xce run`` process. Every
  process it started is killed (by pid) at teardown, also when the test fails.
- ``xce_plugin_manager``: a factory for a plugin manager holding only the plugins a test
  names (objects or modules), for unit tests that mock hooks.

Which candidate is primary is read from the handshake each candidate answers with, so these
helpers do not depend on the client library they are used to test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from xcecore import auth, wire

DEFAULT_KEY = "xce-test-key"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe(host: str, port: int, key: bytes | None, timeout: float = 1.0) -> dict[str, Any] | None:
    """Handshake with a controller candidate; its answer (``state`` primary/standby) or None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
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
            s.sendall(wire.encode(auth.client_answer(key, "probe@test", hello)))
            return read()
    except (OSError, ConnectionError, wire.WireError, auth.AuthError):
        return None


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
    ports: list[int] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    candidates: dict[int, Proc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.ncandidates <= 3:
            raise ValueError("a cluster has 1 to 3 controller candidates")
        self.ports = self.ports or [free_port() for _ in range(self.ncandidates)]
        self.state_dir = self.root / "state"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.root / "xce.toml"
        self.config_path.write_text(self.config_text())

    @property
    def peers(self) -> str:
        """The candidate list as a peers string."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def config_text(self) -> str:
        """The config file every process of this cluster reads."""
        key = f'key = "{self.key}"\n' if self.key else ""
        return (
            f'[cluster]\npeers = "{self.peers}"\nstate_dir = "{self.state_dir}"\n{key}'
            "[client]\nliveness_timeout = 1.5\nheartbeat_interval = 0.2\n"
            "connect_timeout = 0.5\nbackoff_base = 0.02\nbackoff_cap = 0.5\n"
            f"{self.extra_config}"
        )

    def spawn(self, name: str, role: str, *overrides: str, env: dict[str, str] | None = None) -> Proc:
        """Start ``xce run ROLE`` as a child process with this cluster's config."""
        log = self.root / f"{name}.log"
        cmd = [sys.executable, "-m", "xcecore", "--config", str(self.config_path), "run", role]
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
        proc = self.spawn(f"controller{index}", "controller",
                          f'controller.listen="127.0.0.1:{self.ports[index]}"')
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
        key = self.key.encode() if self.key else None
        answer = probe("127.0.0.1", self.ports[index], key)
        return answer.get("state") if answer and answer.get("ok") else None

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
                   env: dict[str, str] | None = None) -> Proc:
        """Start a client role process (``worker``, ``scheduler``, a third party's...)."""
        return self.spawn(name or role, role, *overrides, env=env)

    def close(self) -> None:
        """Kill every process this cluster started, by pid."""
        for proc in reversed(self.procs):
            try:
                proc.kill()
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

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


@pytest.fixture
def xce_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: ``xce_cluster(ncandidates=3, start=True, extra_config="")`` -> LocalCluster."""
    made: list[LocalCluster] = []

    def make(ncandidates: int = 3, *, start: bool = True, extra_config: str = "",
             key: str | None = DEFAULT_KEY) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(made)}", ncandidates, key, extra_config)
        made.append(cluster)
        if start:
            cluster.start()
        return cluster

    yield make
    failed = getattr(request.node, "rep_call", None)
    for cluster in made:
        if failed is not None and failed.failed:
            sys.stderr.write(cluster.logs())
        cluster.close()


@pytest.fixture
def xce_plugin_manager() -> Callable[..., Any]:
    """Factory: a plugin manager with only the given plugins (objects or modules) registered."""
    from xcecore.plugins import PluginManager

    def make(*plugins: object, builtins: bool = True) -> PluginManager:
        import importlib

        from xcecore.plugins import BUILTINS

        pm = PluginManager()
        if builtins:
            for name, module in BUILTINS.items():
                pm.register(importlib.import_module(module), name)
        for i, plugin in enumerate(plugins):
            pm.register(plugin, getattr(plugin, "__name__", f"plugin{i}"))
        return pm

    return make


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can print logs of failed tests."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
