"""The cost of a Prometheus scrape of the controller with many hosts joined (issue #25).

A lone controller candidate (real process, loopback) with its exporter on (``[metrics]
ports``), ``--jobs`` jobs in its state, and ``--hosts`` simulated workers joined
(``simworkers.py`` processes: one real client and TCP connection each). For each heartbeat
interval of ``--heartbeats`` the simulators are started afresh heartbeating at that interval,
then ``GET /metrics`` is timed ``--scrapes`` times (paced) from a client on this host.

Measured per scrape, beside the client's wall time, inside the controller
(:class:`xcecore.metrics.ScrapeTimes`, read back from the next scrape's
``xce_metrics_last_scrape_seconds``): ``build`` (collecting every family and writing the text,
wall), ``build_cpu`` (the CPU of the controller's event-loop thread for it,
``time.thread_time``: its own cost, whatever else runs on the machine) and ``served`` (from
the connection accepted to the reply handed to the kernel). The heartbeat rate is the
controller's own ``xce_controller_requests_total{op="heartbeat"}`` over the window; the
controller's and the simulators' CPU (cores) over it say how busy the 2 cores were. The
heartbeat round trip of random simulated workers is probed after each window.

The aim (issue #25) is the controller's cost: ``build_cpu`` < 5 ms at 10,000 hosts. The wall
time adds what the scrape waited for: the loop finishing the heartbeats it was handling, and
the machine running the controller and the scraper at all while the simulators use the cores.

    python benchmarks/bench_metrics.py                      # 10,000 hosts, 1 s and 10 s beats
    python benchmarks/bench_metrics.py --quick              # 1,000 hosts, 50 scrapes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storm import JOIN_TIMEOUT, SimProc
from benchkit import BenchCluster, log, meta, quiet_logs, raise_fd_limit, stats, write_result

from xcecore.testing import free_port, wait_for

PART = "metrics"
PER_PROCESS = 2500
LAST = re.compile(r'^xce_metrics_last_scrape_seconds\{part="(\w+)"\} (\S+)$', re.M)
BEATS = re.compile(r'^xce_controller_requests_total\{op="heartbeat"\} (\S+)$', re.M)
WORKERS = re.compile(r'^xce_controller_connections\{role="worker"\} (\S+)$', re.M)


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def last_scrape(text: str) -> dict[str, float]:
    """The previous scrape's parts (seconds) as this reply reports them."""
    return {part: float(v) for part, v in LAST.findall(text)}


def one(pattern: re.Pattern[str], text: str) -> float:
    m = pattern.search(text)
    return float(m.group(1)) if m else 0.0


def window(args: argparse.Namespace, bc: BenchCluster, root: Path, url: str,
           heartbeat: float) -> dict[str, Any]:
    """Simulators heartbeating every ``heartbeat`` s joined, then the scrapes timed."""
    ctl_pid = bc.cluster.candidates[0].pid
    sims: list[SimProc] = []
    try:
        t0 = time.monotonic()
        for first in range(0, args.hosts, PER_PROCESS):
            # spread the joins over one interval at least: heartbeat phases spread like a
            # real cluster's, not every beat of a process at the same instant
            sims.append(SimProc(root, bc.cluster.config_path, first,
                                min(PER_PROCESS, args.hosts - first),
                                spread=max(2.0, heartbeat), heartbeat=heartbeat,
                                join_timeout=args.join_timeout))
        joined = 0
        for s in sims:
            line = s.readline(args.join_timeout + 30)
            if not line.startswith("ready"):
                raise RuntimeError(f"a simulator did not get ready: {line!r}\n"
                                   f"{s.log.read_text()[-3000:]}")
            joined += int(line.split()[1])  # "ready <joined> ...": the others timed out
        join_s = time.monotonic() - t0
        log(PART, f"{joined:,} of {args.hosts:,} simulated hosts joined (heartbeat every "
                  f"{heartbeat:g} s) in {join_s:.1f} s")
        if joined < args.hosts:
            log(PART, f"WARNING: {args.hosts - joined:,} simulated hosts did not join within "
                      f"{args.join_timeout:g} s (an overloaded machine): the window has fewer hosts")
        time.sleep(max(3.0, heartbeat))  # the join storm settled, every host beat once
        walls: list[float] = []
        parts: dict[str, list[float]] = {"build": [], "build_cpu": [], "served": []}
        with httpx.Client(timeout=30) as http:
            text = http.get(url).text
            assert "xce_metrics_scrape_seconds" in text, text[:500]
            connected = int(one(WORKERS, text))
            size = len(text.encode())
            beats0, tb0 = one(BEATS, text), time.monotonic()
            cpu0 = cpu_seconds(ctl_pid)
            sim_cpu0 = sum(cpu_seconds(s.popen.pid) for s in sims)
            for i in range(args.scrapes + 1):
                s0 = time.perf_counter()
                r = http.get(url)
                wall = (time.perf_counter() - s0) * 1000
                assert r.status_code == 200
                if i < args.scrapes:
                    walls.append(wall)
                if i > 0:  # this reply reports the scrape before it
                    for part, v in last_scrape(r.text).items():
                        parts[part].append(v * 1000)
                time.sleep(args.pace)
            span = time.monotonic() - tb0
            beats = one(BEATS, r.text) - beats0
            ctl_cores = (cpu_seconds(ctl_pid) - cpu0) / span
            sim_cores = (sum(cpu_seconds(s.popen.pid) for s in sims) - sim_cpu0) / span
        for s in sims:
            s.send("probe 3")
        rtts: list[float] = []
        for s in sims:
            line = s.readline(30)
            if line.startswith("rtt"):
                rtts += json.loads(line[3:])
        res = {"heartbeat_interval_s": heartbeat, "hosts_joined": joined,
               "worker_connections": connected,
               "join_s": round(join_s, 1), "heartbeats_per_s": round(beats / span, 1),
               "bytes": size, "scrape_wall_ms": stats(walls),
               "build_cpu_ms": stats(parts["build_cpu"]), "build_ms": stats(parts["build"]),
               "served_ms": stats(parts["served"]),
               "controller_cores": round(ctl_cores, 3), "simulators_cores": round(sim_cores, 3),
               "loadavg_1min": round(os.getloadavg()[0], 2),
               "heartbeat_rtt_ms_after": stats(rtts) if rtts else None}
        log(PART, f"{connected:,} hosts connected, {res['heartbeats_per_s']:,.0f} heartbeats/s: controller "
                  f"CPU per scrape p50 {res['build_cpu_ms'].get('p50')} ms, p99 "
                  f"{res['build_cpu_ms'].get('p99')} ms; wall p50 {res['scrape_wall_ms']['p50']} ms, "
                  f"p99 {res['scrape_wall_ms']['p99']} ms (served inside p99 "
                  f"{res['served_ms'].get('p99')} ms); controller {ctl_cores:.2f} cores, "
                  f"simulators {sim_cores:.2f} cores; {size:,} bytes")
        return res
    finally:
        for s in sims:
            s.kill()
        if sims:
            def gone() -> bool:
                return one(WORKERS, httpx.get(url, timeout=30).text) == 0

            wait_for(gone, 120, what="the simulated workers' connections closed")


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()
    quiet_logs()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bc = BenchCluster(root, candidates=1, host_timeout=60.0,
                          extra=f"[metrics]\nports = {{ controller = {port} }}\n")
        try:
            bc.start()
            from xcecore.client import SyncClient

            with SyncClient.open(bc.client_config("cli@bench"), role="cli") as c:
                c.call("queuectrl", {"queue": "normal", "action": "inactivate"}, deadline=30)
                for _ in range(args.jobs):
                    c.call("jobsubmit", {"command": "true"}, deadline=60)
            url = f"http://127.0.0.1:{port}/metrics"
            windows = [window(args, bc, root, url, hb) for hb in args.heartbeats]
            return {"hosts": args.hosts, "jobs": args.jobs, "scrapes": args.scrapes,
                    "pace_s": args.pace, "windows": windows}
        finally:
            bc.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--pace", type=float, default=0.05, help="seconds between scrapes")
    p.add_argument("--heartbeats", type=lambda s: [float(x) for x in s.split(",")],
                   default=[1.0, 10.0], help="heartbeat intervals (s), one window each "
                   "(default 1,10)")
    p.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT,
                   help="seconds a simulated host may take to join (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="1,000 hosts, 1,000 jobs, 50 scrapes")
    args = p.parse_args()
    if args.quick:
        args.hosts, args.jobs, args.scrapes = 1000, 1000, 50
    res = run(args)
    write_result(PART, {"meta": meta(), **res})


if __name__ == "__main__":
    main()
