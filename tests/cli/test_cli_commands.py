"""The command-line client against a real cluster: every command, its errors and --json."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture
def cluster(xce_cluster: Callable[..., LocalCluster], tmp_path: Any) -> LocalCluster:
    c = xce_cluster(3, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n',
                    cluster_extra='resources = [{ name = "gpu", type = "bool" }]\n')
    c.start_role("worker", 'worker.hname="cn1"', f'worker.state_dir="{tmp_path / "cn1"}"', "worker.slots=2",
                 'worker.resources=["gpu"]', name="cn1")
    c.start_role("scheduler")
    return c


def xce(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XCE_CONFIG": str(cluster.config_path), "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True, env=env,
                         timeout=60)
    if ok:
        assert res.returncode == 0, f"xce {' '.join(args)}: {res.stdout}{res.stderr}"
    return res


def jobs_json(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    return list(orjson.loads(xce(cluster, "jobs", "--json", *args).stdout))


def test_submit_run_and_list(cluster: LocalCluster, tmp_path: Any) -> None:
    out = tmp_path / "out.txt"
    res = xce(cluster, "submit", "-J", "hello", "-R", "select[gpu] order[r1m]", "--", "sh", "-c", f"echo hi > {out}")
    assert res.stdout.startswith("Job <1> is submitted to queue <normal>.")
    wait_for(lambda: jobs_json(cluster, "-a", "1")[0]["state"] == "DONE", 60, what="job 1 to finish")
    assert out.read_text() == "hi\n"
    table = xce(cluster, "jobs", "-a").stdout
    assert "hello" in table and "DONE" in table and "cn1" in table
    sub = orjson.loads(xce(cluster, "submit", "--json", "-q", "priority", "--", "sleep", "30").stdout)
    assert sub["queue"] == "priority" and sub["jobid"] == 2
    wait_for(lambda: jobs_json(cluster)[0]["state"] == "RUN", 60, what="job 2 to run")
    assert [j["jobid"] for j in jobs_json(cluster)] == [2]  # unfinished only, by default
    assert xce(cluster, "jobs", "-s", "DONE", "--json").stdout.count('"jobid"') == 1


def test_job_control_and_errors(cluster: LocalCluster) -> None:
    xce(cluster, "submit", "--", "sleep", "60")
    wait_for(lambda: jobs_json(cluster, "1")[0]["state"] == "RUN", 60, what="job 1 to run")
    assert "stop accepted" in xce(cluster, "job", "stop", "1").stdout
    assert jobs_json(cluster, "1")[0]["state"] == "USUSP"
    xce(cluster, "job", "resume", "1")
    res = xce(cluster, "job", "kill", "1", "99", ok=False)
    assert res.returncode == 1
    assert "Job <1>: kill accepted" in res.stdout and "no such job: 99" in res.stderr
    wait_for(lambda: jobs_json(cluster, "1")[0]["state"] == "EXIT", 60, what="the killed job to end")
    long = xce(cluster, "jobs", "-l", "1").stdout
    assert long.startswith(f"Job <1>, User <{getpass.getuser()}>, Project <default>, Status <EXIT>")
    assert f"Reason: killed by owner {getpass.getuser()}" in long and "Dispatched to <cn1>, pid " in long
    assert "Exited with exit status" in long and "Usage: CPU time " in long and "peak memory" in long
    bad = xce(cluster, "submit", "-R", "select[gpus]", "--", "true", ok=False)
    assert bad.returncode == 1 and "unknown resource 'gpus'" in bad.stderr and "Traceback" not in bad.stderr
    nq = xce(cluster, "submit", "-q", "nosuch", "--", "true", ok=False)
    assert nq.returncode == 1 and "no such queue" in nq.stderr and len(nq.stderr.strip().splitlines()) == 1


def test_hosts_queues_and_admin(cluster: LocalCluster) -> None:
    wait_for(lambda: "cn1" in xce(cluster, "hosts").stdout, 30, what="the worker's host")
    hosts = orjson.loads(xce(cluster, "hosts", "--json").stdout)
    assert hosts[0]["name"] == "cn1" and hosts[0]["max_slots"] == 2
    assert orjson.loads(xce(cluster, "hosts", "--json", "-R", "select[gpu && slots >= 1]").stdout)[0]["name"] == "cn1"
    assert orjson.loads(xce(cluster, "hosts", "--json", "-R", "select[!gpu]").stdout) == []
    assert "closed" in xce(cluster, "host", "close", "cn1", "-C", "disk swap").stdout
    assert orjson.loads(xce(cluster, "hosts", "--json").stdout)[0]["comment"] == "disk swap"
    xce(cluster, "host", "open", "cn1")
    assert "Closed" in xce(cluster, "queue", "close", "normal").stdout
    closed = xce(cluster, "submit", "--", "true", ok=False)
    assert "closed" in closed.stderr
    xce(cluster, "queue", "open", "normal")
    queues = orjson.loads(xce(cluster, "queues", "--json").stdout)
    assert [q["name"] for q in queues] == ["priority", "normal"]
    # Force-run a job that the scheduler cannot place (it asks for a resource no host has).
    xce(cluster, "queue", "inactivate", "normal")
    xce(cluster, "submit", "--", "true")
    job = jobs_json(cluster)[0]
    assert job["state"] == "PEND"
    xce(cluster, "queue", "activate", "normal")
    st = orjson.loads(xce(cluster, "status", "--json").stdout)
    assert [c["state"] for c in st["candidates"]] == ["primary", "standby", "standby"]
    assert "shutting down" in xce(cluster, "admin", "shutdown").stdout
    wait_for(lambda: cluster.primary() not in (None, 0), 30, what="a standby to take over after shutdown")


def test_force_run(cluster: LocalCluster) -> None:
    wait_for(lambda: "cn1" in xce(cluster, "hosts").stdout, 30, what="the worker's host")
    xce(cluster, "host", "close", "cn1")
    xce(cluster, "submit", "--", "true")
    res = xce(cluster, "run-job", "1", "-m", "cn1")
    assert "forced to run on cn1" in res.stdout
    wait_for(lambda: jobs_json(cluster, "1")[0]["state"] == "DONE", 60, what="the forced job to finish")
    assert jobs_json(cluster, "1")[0]["forced"] is True
    assert xce(cluster, "run-job", "1", "-m", "nohost", ok=False).returncode == 1


def test_unreachable_controller_is_one_line(tmp_path: Any) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text('[cluster]\npeers = "127.0.0.1:1"\n[client]\nconnect_timeout = 0.2\n')
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "--timeout", "1", "jobs"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "unreachable" in res.stderr and "Traceback" not in res.stderr


def test_bad_peers_is_one_line(tmp_path: Any) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text('[cluster]\npeers = "ctl1:7600,,ctl2:7600"\n')
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "jobs"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "stray double ','" in res.stderr and "Traceback" not in res.stderr
