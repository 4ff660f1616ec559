"""The cost of a Prometheus scrape of the controller with many hosts joined.

A lone controller candidate (real process, loopback) with its exporter on (``[metrics]
ports``), ``--hosts`` simulated workers joined (``simworkers.py`` processes: one real client
and TCP connection each, heartbeating every second), ``--jobs`` jobs in its state. Measured:
``GET /metrics`` wall time from a client on this host (``--scrapes`` times, paced), the
exporter's CPU per scrape (the controller's CPU during a burst of scrapes minus its CPU over
as long without), and the heartbeat round trip of random workers while scrapes run.
Aim (issue #25): a scrape < 5 ms at 10,000 hosts.

    python benchmarks/bench_metrics.py --hosts 10000 --scrapes 200
    python benchmarks/bench_metrics.py --quick                   # 1,000 hosts
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storm import JOIN_TIMEOUT, SimProc
from benchkit import BenchCluster, log, meta, quiet_logs, raise_fd_limit, stats, write_result

from xcecore.testing import free_port

PART = "metrics"
PER_PROCESS = 2500


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()
    quiet_logs()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bc = BenchCluster(root, candidates=1, host_timeout=60.0,
                          extra=f"[metrics]\nports = {{ controller = {port} }}\n")
        sims: list[SimProc] = []
        try:
            bc.start()
            ctl_pid = bc.cluster.candidates[0].pid
            from xcecore.client import SyncClient

            with SyncClient.open(bc.client_config("cli@bench"), role="cli") as c:
                c.call("queuectrl", {"queue": "normal", "action": "inactivate"}, deadline=30)
                for first in range(0, args.jobs, 1000):
                    for _ in range(min(1000, args.jobs - first)):
                        c.call("jobsubmit", {"command": "true"}, deadline=60)
            t0 = time.monotonic()
            for first in range(0, args.hosts, PER_PROCESS):
                sims.append(SimProc(root, bc.cluster.config_path, first, min(PER_PROCESS, args.hosts - first),
                                    spread=2.0))
            for s in sims:
                line = s.readline(JOIN_TIMEOUT + 30)
                if not line.startswith("ready"):
                    raise RuntimeError(f"a simulator did not get ready: {line!r}\n"
                                       f"{s.log.read_text()[-3000:]}")
            log(PART, f"{args.hosts:,} simulated hosts joined in {time.monotonic() - t0:.1f} s")
            time.sleep(3)  # let the join storm settle
            url = f"http://127.0.0.1:{port}/metrics"
            with httpx.Client(timeout=30) as http:
                first_text = http.get(url).text
                assert "xce_controller_connections" in first_text, first_text[:500]
                idle_cpu0, t_idle0 = cpu_seconds(ctl_pid), time.monotonic()
                time.sleep(args.scrapes * args.pace)
                idle_cpu = (cpu_seconds(ctl_pid) - idle_cpu0) / (time.monotonic() - t_idle0)
                walls: list[float] = []
                cpu0, t0 = cpu_seconds(ctl_pid), time.monotonic()
                for _ in range(args.scrapes):
                    s0 = time.perf_counter()
                    r = http.get(url)
                    walls.append((time.perf_counter() - s0) * 1000)
                    assert r.status_code == 200
                    time.sleep(args.pace)
                busy = cpu_seconds(ctl_pid) - cpu0
                span = time.monotonic() - t0
            for s in sims:
                s.send("probe 3")
            rtts: list[float] = []
            for s in sims:
                line = s.readline(30)
                if line.startswith("rtt"):
                    import json

                    rtts += json.loads(line[3:])
            per_scrape_cpu = max(0.0, busy - idle_cpu * span) / args.scrapes * 1000
            res = {"hosts": args.hosts, "jobs": args.jobs, "scrapes": args.scrapes,
                   "bytes": len(first_text.encode()), "scrape_wall_ms": stats(walls),
                   "scrape_cpu_ms": round(per_scrape_cpu, 3),
                   "heartbeat_rtt_ms_after": stats(rtts) if rtts else None}
            log(PART, f"{args.hosts:,} hosts: scrape p50 {res['scrape_wall_ms']['p50']:.2f} ms, "
                      f"p99 {res['scrape_wall_ms']['p99']:.2f} ms, controller CPU "
                      f"{per_scrape_cpu:.2f} ms per scrape, {res['bytes']:,} bytes")
            return res
        finally:
            for s in sims:
                s.kill()
            bc.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--pace", type=float, default=0.05, help="seconds between scrapes")
    p.add_argument("--quick", action="store_true", help="1,000 hosts, 1,000 jobs, 50 scrapes")
    args = p.parse_args()
    if args.quick:
        args.hosts, args.jobs, args.scrapes = 1000, 1000, 50
    res = run(args)
    write_result(PART, {"meta": meta(), **res})


if __name__ == "__main__":
    main()
