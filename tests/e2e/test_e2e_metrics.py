"""Prometheus metrics on every role: real processes, scraped over HTTP, figures that follow
what the cluster did (a job run, requests made), and a port in use refused by name."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from xce_apiserver.auth import hash_password

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, free_port, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.e2e]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` on ``port``: (name, sorted labels) -> value."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_every_role_exports_metrics_that_follow_the_cluster(xce_cluster: Any, tmp_path: Path) -> None:
    ports = {r: free_port() for r in ("controller", "worker", "scheduler", "apiserver")}
    table = ", ".join(f"{r} = {p}" for r, p in ports.items())
    cl: LocalCluster = xce_cluster(1, extra_config=f"[metrics]\nports = {{ {table} }}\n")
    cl.start_role("worker", 'worker.hname="m1"', f'worker.state_dir="{tmp_path / "m1"}"',
                  "worker.monitor_interval=0.1", name="m1")
    cl.start_role("scheduler")
    pw = hash_password("pw", iterations=1000)
    _, base = cl.start_apiserver(
        tmp_path / "api.port", f'apiserver.users=[{{name = "alice", password_hash = "{pw}", role = "user"}}]')

    _, cfg = load(cl.config_path)
    with SyncClient.open(client_config(cfg, "cli@test"), role="cli") as c:
        jobid = c.call("jobsubmit", {"command": "sleep 30"}, deadline=30)["jobid"]
        wait_for(lambda: c.call("jobinfo", {"jobids": [jobid]}, deadline=10)["jobs"][0]["state"] == "RUN",
                 60, what="the job runs")

        ctl = scrape(ports["controller"])
        assert value(ctl, "xce_controller_primary", candidate=cl.address(0)) == 1.0
        assert value(ctl, "xce_controller_jobs", queue="normal", state="RUN") == 1.0
        assert value(ctl, "xce_controller_connections", role="worker") == 1.0
        assert value(ctl, "xce_controller_connections", role="scheduler") == 1.0
        assert (value(ctl, "xce_controller_requests_total", op="jobsubmit") or 0) >= 1
        assert (value(ctl, "xce_controller_requests_total", op="heartbeat") or 0) >= 1
        assert (value(ctl, "xce_controller_commit_latency_seconds_count") or 0) >= 1
        assert value(ctl, "xce_controller_commit_batch_writes_bucket", le="+Inf") == \
            value(ctl, "xce_controller_commit_batch_writes_count")
        assert (value(ctl, "process_resident_memory_bytes") or 0) > 0

        wk = scrape(ports["worker"])
        assert value(wk, "xce_worker_jobs_running", host="m1") == 1.0
        age = value(wk, "xce_worker_controller_answer_age_seconds", host="m1")
        assert age is not None and 0 <= age < 60

        sch = wait_for(lambda: (s := scrape(ports["scheduler"])) and
                       (value(s, "xce_scheduler_dispatched_total") or 0) >= 1 and s, 30,
                       what="the scheduler's dispatch counted")
        assert (value(sch, "xce_scheduler_pass_seconds_count") or 0) >= 1
        assert value(sch, "xce_scheduler_view_complete") == 1.0

        c.call("jobctrl", {"jobid": jobid, "action": "kill"}, deadline=30)
        wait_for(lambda: value(scrape(ports["controller"]), "xce_controller_jobs", queue="normal",
                               state="EXIT") == 1.0, 60, what="the killed job counted EXIT")
        wait_for(lambda: value(scrape(ports["worker"]), "xce_worker_jobs_running", host="m1") == 0.0,
                 60, what="the worker runs nothing")

    for _ in range(3):
        assert httpx.get(f"{base}/xce/v1/jobs/{jobid}").status_code == 401  # no token
    httpx.get(f"{base}/xce/v1/no/such/route")
    api_m = scrape(ports["apiserver"])
    assert value(api_m, "xce_apiserver_requests_total", method="GET", route="/xce/v1/jobs/{jobids:jobids}",
                 status="401") == 3.0  # by route template, not by path
    assert value(api_m, "xce_apiserver_requests_total", method="-", route="(no route)", status="404") == 1.0
    assert (value(api_m, "xce_apiserver_request_seconds_count", method="GET",
                  route="/xce/v1/readyz") or 0) >= 1
    assert value(api_m, "xce_apiserver_backend_breaker", state="closed") == 1.0
    assert value(api_m, "xce_apiserver_replica_jobs") == 1.0

    # every role measures its own scrapes (issue 25): the reply reports the scrapes before it
    for role, port in ports.items():
        before = value(scrape(port), "xce_metrics_scrape_cpu_seconds_count") or 0
        got = scrape(port)
        assert value(got, "xce_metrics_scrape_cpu_seconds_count") == before + 1, role
        assert value(got, "xce_metrics_scrape_seconds_bucket", le="+Inf") == before + 1, role
        build, cpu, served = (value(got, "xce_metrics_last_scrape_seconds", part=p)
                              for p in ("build", "build_cpu", "served"))
        assert build is not None and cpu is not None and served is not None, role
        assert cpu > 0 and 0 < build <= served < 10, (role, build, cpu, served)


def test_a_metrics_port_in_use_is_refused_by_name(xce_cluster: Any, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cl: LocalCluster = xce_cluster(1, extra_config=f"[metrics]\nports = {{ scheduler = {port} }}\n")
        proc = cl.start_role("scheduler")
        wait_for(lambda: not proc.alive(), 30, what="the scheduler refuses to start")
        assert f"metrics.ports.scheduler = {port}: cannot listen on 127.0.0.1:{port}" in proc.text()
    assert proc.popen.returncode != 0
