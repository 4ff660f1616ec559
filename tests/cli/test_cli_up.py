"""`xce up` brings a whole cluster up, shows it, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(180)]


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


def test_up_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    from xcecore.testing.cluster import free_port

    state = tmp_path / "up"
    base = free_port()
    while not _port_free(base + 1):  # the second candidate takes the next port
        base = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "xcecore", "up", "--workers", "1", "--state-dir", str(state),
                             "--candidates", "2", "--port", str(base)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "160"})
    assert proc.stdout is not None
    seen = ""
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops the cluster" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert "Ctrl-C stops the cluster" in seen, seen
        assert "auth/logon" in seen and "xce submit" in seen
        pids = [int(m) for log in state.glob("*.log") for m in re.findall(r"\(pid (\d+)", log.read_text())[:1]]
        assert len(pids) == 2 + 1 + 3, pids  # two candidates, one worker, scheduler, API server, accounting
        assert f'peers = "127.0.0.1:{base},127.0.0.1:{base + 1}"' in (state / "xce.toml").read_text()
        assert all(_alive(p) for p in pids)
        time.sleep(1.5)  # let the live table draw at least once
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        seen += out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "all processes stopped" in seen, seen[-3000:]
    assert not [p for p in pids if _alive(p)], "xce up left processes behind"
    assert "primary" in seen and "node1" in seen
