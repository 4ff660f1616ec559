"""``xce events`` as a process against a real cluster: the newest N, --kind, --since, --json,
--follow (a new event printed while it waits), and its errors."""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(180)]


def xce(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XCE_CONFIG": str(cluster.config_path), "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True,
                         env=env, timeout=60)
    if ok:
        assert res.returncode == 0, f"xce {' '.join(args)}: {res.stdout}{res.stderr}"
    return res


def test_xce_events(xce_cluster: Callable[..., LocalCluster], tmp_path: Any) -> None:
    cl = xce_cluster(1, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n')
    cl.start_role("worker", 'worker.hname="cn1"', f'worker.state_dir="{tmp_path / "cn1"}"', name="cn1")
    wait_for(lambda: "cn1" in xce(cl, "events", "--kind", "host_state").stdout, 30, what="cn1 joined")
    out = xce(cl, "events").stdout
    assert "promotion" in out and "promoted to primary" in out and "host cn1 added" in out
    every = orjson.loads(xce(cl, "events", "--json", "-n", "1000").stdout)
    seqs = [e["seq"] for e in every]
    assert seqs == sorted(seqs) and {e["kind"] for e in every} >= {"promotion", "member_join", "host_state"}
    two = orjson.loads(xce(cl, "events", "--json", "-n", "2").stdout)
    assert [e["seq"] for e in two] == seqs[-2:]
    only = orjson.loads(xce(cl, "events", "--json", "--kind", "member_join").stdout)
    assert only and all(e["kind"] == "member_join" for e in only)
    since = orjson.loads(xce(cl, "events", "--json", "--since", str(every[-1]["time"])).stdout)
    assert since and all(e["time"] >= every[-1]["time"] for e in since)
    assert orjson.loads(xce(cl, "events", "--json", "--since", "1h").stdout)[0]["seq"] == seqs[0]
    # Errors: one line, exit 1.
    bad = xce(cl, "events", "--kind", "bogus", ok=False)
    assert bad.returncode == 1 and "unknown kind 'bogus'" in bad.stderr
    bad = xce(cl, "events", "-n", "0", ok=False)
    assert bad.returncode == 1 and "-n 0" in bad.stderr
    bad = xce(cl, "events", "--since", "last tuesday", ok=False)
    assert bad.returncode == 1 and "time 'last tuesday'" in bad.stderr
    # --follow prints what comes after it started.
    env = {**os.environ, "XCE_CONFIG": str(cl.config_path), "PYTHONUNBUFFERED": "1"}
    follow = subprocess.Popen([sys.executable, "-m", "xcecore", "events", "--follow", "--json", "-n", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert follow.stdout is not None
        first = orjson.loads(follow.stdout.readline())
        xce(cl, "host", "close", "cn1", "-C", "maintenance")
        while True:  # bounded by the test's timeout
            ev = orjson.loads(follow.stdout.readline())
            assert ev["seq"] > first["seq"]
            if ev["kind"] == "host_state" and ev["state"] == "closed":
                break
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            follow.wait(10)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()
