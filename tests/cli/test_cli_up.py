"""`xce up` brings a whole cluster up and shows it; Ctrl-C (also when started with SIGINT
ignored) and SIGTERM kill its jobs, stop every role process and remove its directory unless
--keep. Real processes throughout; what is left is checked by pid, on disk and in cgroups."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from xcecore.testing import wait_for

pytestmark = [pytest.mark.timeout(180)]
READY = "Ctrl-C stops the cluster"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; check its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def job_groups(pid: int) -> list[Path]:
    """The cgroup directories, in every hierarchy, that process ``pid`` is in and this test
    process is not (those made for the job and its worker by the worker's containment)."""
    from xce_worker.containment.cgroupfs import group_path, parse_mountinfo, parse_proc_cgroup

    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    job = parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    found: set[Path] = set()
    for m in mounts:
        for key in [""] if m.version == 2 else sorted(m.controllers):
            if key in job and job[key] != own.get(key):
                path = group_path(m, job[key])
                found.update([path, path.parent])  # the job's group and the worker's
    return sorted(found)


@dataclass
class Up:
    """A running ``xce up`` and what it printed."""

    proc: subprocess.Popen[str]
    seen: str = ""
    pids: list[int] = field(default_factory=list)

    def read_until(self, text: str, timeout: float = 120) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while text not in self.seen and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.seen += line
        assert text in self.seen, self.seen[-4000:]

    @property
    def root(self) -> Path:
        m = re.search(r"state, config and logs in (\S+)", self.seen)
        assert m, self.seen
        return Path(m.group(1))

    def role_pids(self) -> list[int]:
        return [int(m) for log in self.root.glob("*.log")
                for m in re.findall(r"starting role \w+ \(pid (\d+)", log.read_text())[:1]]

    def finish(self, sig: int) -> None:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=90)
        self.seen += out

    def cleanup(self) -> None:
        """On a failed test: nothing it started stays running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def start_up(tmp_path: Path, *args: str, ignore_sigint: bool = False) -> Up:
    env = {**os.environ, "COLUMNS": "160", "TMPDIR": str(tmp_path)}
    pre: Callable[[], object] | None = None
    if ignore_sigint:  # as a shell starts a background job, or a service manager may
        def pre() -> object:
            return signal.signal(signal.SIGINT, signal.SIG_IGN)
    proc = subprocess.Popen([sys.executable, "-m", "xcecore", "up", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=pre)
    return Up(proc)


def submit_running_job(up: Up) -> int:
    """Submit ``sleep 600`` with ``xce submit``; its pid once a worker runs it."""
    env = {**os.environ, "XCE_CONFIG": str(up.root / "xce.toml")}
    res = subprocess.run([sys.executable, "-m", "xcecore", "submit", "--", "sleep", "600"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    jobid = re.search(r"(\d+)", res.stdout)
    assert jobid, res.stdout

    def started() -> int | None:
        for log in up.root.glob("node*.log"):
            m = re.search(rf"started job {jobid.group(1)} \(attempt \d+\) as pid (\d+)", log.read_text())
            if m:
                return int(m.group(1))
        return None

    pid: int = wait_for(started, 60, what=f"job {jobid.group(1)} started on a worker")
    return pid


def check_banner(up: Up) -> None:
    """The URL carries the real port, the password is in a 0600 file and not on the terminal."""
    m = re.search(r"API:\s+http://127\.0\.0\.1:(\d+)/xce/v1", up.seen)
    assert m, up.seen
    assert ":?" not in up.seen
    pw_file = up.root / "admin.password"
    assert f"admin password in {pw_file}" in up.seen
    assert pw_file.stat().st_mode & 0o777 == 0o600
    password = pw_file.read_text().strip()
    assert len(password) >= 12 and password not in up.seen


def check_all_gone(up: Up, job_pid: int, groups: list[Path]) -> None:
    assert "all processes stopped" in up.seen, up.seen[-3000:]
    left = [p for p in [*up.pids, job_pid] if _alive(p)]
    assert not left, f"xce up left processes behind: {left}\n{up.seen[-3000:]}"
    assert not [g for g in groups if g.exists()], f"xce up left cgroups behind: {groups}"


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["sigint", "sigint-ignored-at-start"])
def test_ctrl_c_kills_jobs_stops_everything_and_removes_its_directory(
        tmp_path: Path, ignore_sigint: bool) -> None:
    from xcecore.testing.cluster import free_port

    base = free_port()
    while not _port_free(base + 1):  # the second candidate takes the next port
        base = free_port()
    up = start_up(tmp_path, "--workers", "1", "--candidates", "2", "--port", str(base),
                  ignore_sigint=ignore_sigint)
    try:
        up.read_until(READY)
        assert up.root.parent == tmp_path and up.root.name.startswith("xce-up-")
        up.pids = up.role_pids()
        assert len(up.pids) == 2 + 1 + 3, up.pids  # two candidates, a worker, scheduler, API, accounting
        assert f'peers = "127.0.0.1:{base},127.0.0.1:{base + 1}"' in (up.root / "xce.toml").read_text()
        assert all(_alive(p) for p in up.pids)
        check_banner(up)
        job = submit_running_job(up)
        groups = job_groups(job)
        if "job containment cgroup" in (up.root / "node1.log").read_text():
            assert groups, "the job is in no cgroup of its own although its worker contains jobs"
        time.sleep(1.5)  # not synchronisation: lets the live table draw once, checked below
        up.finish(signal.SIGINT)
    finally:
        up.cleanup()
    assert "SIGINT: stopping" in up.seen
    check_all_gone(up, job, groups)
    assert not up.root.exists(), "xce up left its directory behind"
    assert "primary" in up.seen and "node1" in up.seen and up.proc.returncode == 0


def test_sigterm_with_keep_stops_everything_and_keeps_the_directory(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--workers", "1", "--candidates", "1", "--keep")
    try:
        up.read_until(READY)
        up.pids = up.role_pids()
        assert len(up.pids) == 1 + 1 + 3, up.pids
        check_banner(up)
        job = submit_running_job(up)
        groups = job_groups(job)
        if "job containment cgroup" in (up.root / "node1.log").read_text():
            assert groups, "the job is in no cgroup of its own although its worker contains jobs"
        up.finish(signal.SIGTERM)
    finally:
        up.cleanup()
    assert "SIGTERM: stopping" in up.seen
    check_all_gone(up, job, groups)
    assert up.root.is_dir() and (up.root / "xce.toml").exists() and f"kept {up.root}" in up.seen
    worker_log = (up.root / "node1.log").read_text()
    assert "killing 1 running job(s) before stopping" in worker_log


def test_a_job_whose_worker_died_is_killed_too(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--workers", "1", "--candidates", "1")
    try:
        up.read_until(READY)
        up.pids = up.role_pids()
        job = submit_running_job(up)
        groups = job_groups(job)
        worker = next(int(m) for m in re.findall(r"starting role worker \(pid (\d+)",
                                                  (up.root / "node1.log").read_text()))
        os.kill(worker, signal.SIGKILL)  # the job outlives it, as a job does
        wait_for(lambda: not _alive(worker), 10, what="the worker gone")
        assert _alive(job)
        up.finish(signal.SIGTERM)
    finally:
        up.cleanup()
    check_all_gone(up, job, groups)
    assert "killed 1 job(s) their worker had not ended" in up.seen, up.seen[-2000:]
