"""The embedded cluster of ``xce up``: its processes, and how to look at them.

Real processes on loopback, started and ended through :class:`xcecore.testing.cluster.
LocalCluster` (by pid), with one config file in the cluster's directory. Its workers kill
their jobs when they stop (``keep_jobs_on_shutdown = false``): an embedded cluster leaves
nothing running behind it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import time
from pathlib import Path
from typing import Any

import click

from xcecore.cli.session import user_name

CLIENT_ROLES = ("scheduler", "apiserver", "accounting")
KILL_GRACE = 2.0  # the workers' SIGTERM-to-SIGKILL grace for jobs, when stopping
STOP_WAIT = KILL_GRACE + 8.0  # how long a role has to stop on SIGTERM before SIGKILL


def _config_extra(root: Path, user: str, api_port: int, password: str) -> str:
    try:
        from xce_apiserver.auth import hash_password
    except ImportError:
        raise click.ClickException("xce up runs every built-in role, the API server among them: "
                                   "pip install 'xce-cli[up]'") from None

    return (
        f'[controller]\nadmins = ["{user}", "admin"]\nhost_timeout = 10.0\n'
        f'[apiserver]\nlisten = "127.0.0.1:{api_port}"\nport_file = "{root / "api.port"}"\n'
        f'users = [{{ name = "admin", password_hash = "{hash_password(password)}", role = "admin" }},'
        f' {{ name = "{user}", password_hash = "{hash_password(password)}", role = "user" }}]\n'
        f'[scheduler]\nstatus_file = "{root / "scheduler.status"}"\n'
    )


class Embedded:
    """The processes of an embedded cluster and how to look at them."""

    def __init__(self, root: Path, candidates: int, workers: int, api_port: int, base_port: int = 0) -> None:
        from xcecore.testing.cluster import LocalCluster

        self.root = root
        self.password = secrets.token_urlsafe(9)
        self.password_file = root / "admin.password"
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fd, 0o600)  # also when the file existed (a kept --state-dir)
            fh.write(self.password + "\n")
        self.user = user_name()
        self.nworkers = workers
        extra = _config_extra(root, self.user, api_port, self.password)
        ports = [base_port + i for i in range(candidates)] if base_port else []
        self.cluster = LocalCluster(root, candidates, key=secrets.token_hex(16), extra_config=extra, ports=ports)
        self.roles: dict[str, Any] = {}
        self._client: Any = None
        self._api_url: str | None = None

    def start(self, progress: Any = None) -> None:
        """Start candidates, then workers, scheduler and API server."""
        steps = self.cluster.ncandidates + self.nworkers + len(CLIENT_ROLES)
        task = progress.add_task("starting the cluster", total=steps) if progress else None

        def advance(what: str) -> None:
            if progress is not None:
                progress.update(task, advance=1, description=what)

        self.cluster.start_candidate(0)
        self.cluster.wait_primary(30)
        advance("candidate 0 is primary")
        for i in range(1, self.cluster.ncandidates):
            self.cluster.start_candidate(i)
            self.cluster.wait_state(i, "standby", 30)
            advance(f"candidate {i} is a standby")
        for n in range(1, self.nworkers + 1):
            name = f"node{n}"
            self.roles[name] = self.cluster.start_role(
                "worker", f'worker.hname="{name}"', f'worker.state_dir="{self.root / name}"',
                "worker.keep_jobs_on_shutdown=false", f"worker.kill_grace={KILL_GRACE}", name=name)
            advance(f"worker {name} started")
        for role in CLIENT_ROLES:
            extra = [f'accounting.state_dir="{self.root / "accounting"}"'] if role == "accounting" else []
            self.roles[role] = self.cluster.start_role(role, *extra)
            advance(f"{role} started")
        self.wait_members(self.expected_members(), 60)
        self._api_url = self._wait_api_url(30)

    def expected_members(self) -> set[str]:
        """The identities every role joins with."""
        host = socket.gethostname()
        return {f"worker@node{n}" for n in range(1, self.nworkers + 1)} | {f"{r}@{host}" for r in CLIENT_ROLES}

    def client(self) -> Any:
        """A sync client to the cluster (kept open)."""
        if self._client is None:
            from xcecore.client import SyncClient
            from xcecore.runtime import client_config, load

            _, config = load(self.cluster.config_path)
            self._cm = SyncClient.open(client_config(config, f"cli@{socket.gethostname()}"), role="cli")
            self._client = self._cm.__enter__()
        return self._client

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 20.0) -> Any:
        """Call the controller (as the cluster's owner: the embedded cluster uses auth = "key")."""
        return self.client().call(op, args or {}, deadline=timeout)

    def members(self) -> dict[str, float]:
        """Identity -> joined_at of every member joined to the primary."""
        return {m["identity"]: m["joined_at"] for m in self.call("status").get("member_list", [])}

    def wait_members(self, expected: set[str], timeout: float, since: float = 0.0) -> dict[str, float]:
        """Wait until every expected member has joined the primary after ``since``."""
        deadline = time.monotonic() + timeout
        while True:
            joined = {k: v for k, v in self.members().items() if k in expected and v >= since}
            if set(joined) == expected:
                return joined
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(expected - set(joined)))
                raise click.ClickException(f"roles not joined after {timeout:g} s: {missing}\n{self.cluster.logs()}")
            time.sleep(0.02)

    def _wait_api_url(self, timeout: float) -> str:
        port_file = self.root / "api.port"
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                port = port_file.read_text().strip()
                if port.isdigit():
                    return f"http://127.0.0.1:{port}/xce/v1"
            proc = self.roles.get("apiserver")
            if proc is not None and not proc.alive():
                raise click.ClickException(f"the API server exited:\n{proc.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise click.ClickException(f"the API server wrote no port to {port_file} "
                                           f"in {timeout:g} s")
            time.sleep(0.02)

    def api_url(self) -> str:
        """The API server's base URL (known once :meth:`start` returned)."""
        if self._api_url is None:
            raise RuntimeError("the API server's port is not known before start() returns")
        return self._api_url

    def status_table(self) -> Any:
        """A rich renderable of candidates, roles, hosts and jobs."""
        from rich.console import Group
        from rich.table import Table

        cands = Table("candidate", "state", "pid", title="controller candidates", box=None)
        for i, port in enumerate(self.cluster.ports):
            proc = self.cluster.candidates.get(i)
            state = self.cluster.state_of(i) or "down"
            cands.add_row(f"127.0.0.1:{port}", state, str(proc.pid) if proc and proc.alive() else "-")
        roles = Table("role", "pid", "joined to", title="roles", box=None)
        try:
            st = self.call("status", timeout=2.0)
            members = {m["identity"] for m in st.get("member_list", [])}
            primary = st["primary"]
            counts = self.call("queueinfo", timeout=2.0)["counts"]  # per queue and state
            hosts = self.call("hostinfo", timeout=2.0)["hosts"]
        except Exception as exc:  # the table shows the outage rather than dying with it
            members, primary, counts, hosts = set(), f"unreachable ({exc})", {}, []
        for ident in sorted(self.expected_members()):
            name = ident.split("@")[0] if not ident.startswith("worker@") else ident.split("@")[1]
            proc = self.roles.get(name)
            roles.add_row(ident, str(proc.pid) if proc and proc.alive() else "exited",
                          primary if ident in members else "(joining)")
        host_t = Table("host", "state", "slots used", title="hosts", box=None)
        for h in hosts:
            host_t.add_row(h["name"], h["state"], f"{h['used_slots']}/{h['max_slots']}")
        by_state: dict[str, int] = {}
        for per_state in counts.values():
            for state, n in per_state.items():
                by_state[state] = by_state.get(state, 0) + n
        jobs_line = ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) or "none yet"
        return Group(cands, roles, host_t, f"jobs: {jobs_line}", f"API: {self._api_url or '-'}")

    def close(self) -> str:
        """Kill every job and stop every process this cluster started; what was done.

        Workers first (each kills its jobs, SIGTERM then SIGKILL after ``KILL_GRACE``), then
        the scheduler and API server, then the candidates, each by pid with SIGTERM and
        SIGKILL after ``STOP_WAIT``; a job a worker did not end (the worker died) is killed
        from the worker's journal, and its job cgroups are removed.
        """
        if self._client is not None:
            with contextlib.suppress(Exception):  # a call interrupted by the stop signal
                self._cm.__exit__(None, None, None)
            self._client = None
        workers = [p for n, p in self.roles.items() if n not in CLIENT_ROLES]
        stopped = stop_all(workers)
        stopped += stop_all([self.roles[r] for r in CLIENT_ROLES if r in self.roles])
        leftover = 0
        for n in range(1, self.nworkers + 1):
            leftover += kill_journal_jobs(self.root / f"node{n}")
            remove_job_groups(self.root / f"node{n}")
        stopped += stop_all(list(self.cluster.candidates.values()))
        self.cluster.close()  # SIGKILL to anything still up, by pid
        left = [p for p in self.cluster.procs if p.alive()]
        if left:
            return "[red]still running[/]: " + ", ".join(f"{p.name} (pid {p.pid})" for p in left)
        extra = f"; killed {leftover} job(s) their worker had not ended" if leftover else ""
        return f"all processes stopped ({stopped} role process(es), jobs killed by their workers{extra})"


def stop_all(procs: list[Any], timeout: float = STOP_WAIT) -> int:
    """SIGTERM every live process of ``procs`` at once (once: a role's second SIGTERM would
    kill it mid-stop), SIGKILL what is left after ``timeout``; how many were running."""
    import subprocess

    live = [p for p in procs if p.alive()]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in live:
        try:
            p.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    return len(live)


def remove_job_groups(state_dir: Path) -> None:
    """Remove the cgroup directories a worker made for its jobs (it lists them in
    ``<state_dir>/cgroups``), killing anything still in them. A worker that stopped cleanly
    removed them already; one that died did not."""
    from xce_worker.containment import remove_listed

    remove_listed(state_dir, depth=0)


def kill_journal_jobs(state_dir: Path) -> int:
    """SIGKILL the process group of every job a worker's journal lists as running; how many.

    Only a job whose process still has the creation time the journal recorded: a reused pid
    is never signalled.
    """
    import psutil
    from xce_worker.spool import Journal

    path = state_dir / "journal.jsonl"
    if not path.exists():
        return 0
    journal = Journal(path)
    try:
        entries = journal.active()
    finally:
        journal.close()
    killed = 0
    for e in entries:
        if e.pid is None:
            continue
        try:
            born = psutil.Process(e.pid).create_time()
        except psutil.Error:
            continue
        if e.create_time is not None and abs(born - e.create_time) > 0.01:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(e.pid, signal.SIGKILL)
            killed += 1
    return killed
