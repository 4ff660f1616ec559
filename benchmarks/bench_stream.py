"""What the dashboard's event stream costs the API server: N SSE clients while jobs are
submitted through REST at a steady rate.

A real cluster (one candidate, the API server as a real ``xce run apiserver`` process, no
workers: every submission is one job change pushed to the API server). For each client
count (default 0 and 50) a reader process opens that many ``GET /xce/v1/stream`` connections
(one asyncio loop, each with its own ticket) and counts what arrives; the benchmark then
submits ``--rate`` jobs/s for ``--seconds`` s, one ``POST /xce/v1/jobs`` at a time, and
measures each POST's latency, the API server's CPU (utime+stime from /proc over the run) and,
with clients, how long after its POST answered a job first reached the stream (client 0).

Usage: ``python benchmarks/bench_stream.py [--clients 0,50] [--rate 20] [--seconds 10]``.
Writes ``benchmarks/results/stream.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BENCH_PASSWORD, BENCH_USER, BenchCluster, log, meta, stats, write_result


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _read_streams(url: str, n: int, out: Path) -> None:
    """Open ``n`` streams; on SIGTERM write what arrived to ``out``."""
    import httpx

    first: dict[int, float] = {}
    counts = [0] * n
    opened = 0
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, read=None),
                                 limits=httpx.Limits(max_connections=n + 4)) as http:
        r = await http.post("/auth/logon", json={"username": BENCH_USER, "password": BENCH_PASSWORD})
        hdr = {"Authorization": f"Bearer {r.json()['data']['token']}"}

        async def one(i: int) -> None:
            nonlocal opened
            t = (await http.post("/stream/ticket", headers=hdr)).json()["data"]["ticket"]
            async with http.stream("GET", f"/stream?ticket={t}") as resp:
                opened += 1
                event = ""
                async for line in resp.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        counts[i] += 1
                        if i == 0 and event == "jobs":
                            now = time.time()
                            for job in json.loads(line[6:]).get("items", ()):
                                first.setdefault(job["jobid"], now)

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while opened < n:
            await asyncio.sleep(0.05)
        Path(str(out) + ".ready").write_text("ok")
        await stop.wait()
        for t in tasks:
            t.cancel()
    out.write_text(json.dumps({"first": first, "events": sum(counts), "clients": n}))


def run_part(url: str, clients: int, rate: float, seconds: float, api_pid: int, tmp: Path) -> dict[str, Any]:
    import httpx

    reader = None
    out = tmp / f"reader-{clients}.json"
    if clients:
        reader = subprocess.Popen([sys.executable, __file__, "--reader", url, str(clients), str(out)])
        deadline = time.monotonic() + 60
        while not Path(str(out) + ".ready").exists():
            if time.monotonic() > deadline or reader.poll() is not None:
                raise RuntimeError(f"the reader did not open {clients} streams")
            time.sleep(0.05)
    try:
        with httpx.Client(base_url=url, timeout=30.0) as http:
            token = http.post("/auth/logon", json={"username": BENCH_USER,
                                                   "password": BENCH_PASSWORD}).json()["data"]["token"]
            hdr = {"Authorization": f"Bearer {token}"}
            lat: list[float] = []
            answered: dict[int, float] = {}
            cpu0, t0 = cpu_seconds(api_pid), time.monotonic()
            n = int(rate * seconds)
            for i in range(n):
                due = t0 + i / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                s = time.perf_counter()
                r = http.post("/jobs", json={"command": "true", "name": f"b{i}", "queue": "parked"},
                              headers=hdr)
                lat.append((time.perf_counter() - s) * 1000)
                answered[r.json()["data"]["jobid"]] = time.time()
            wall = time.monotonic() - t0
            cpu = cpu_seconds(api_pid) - cpu0
        time.sleep(1.0)  # the last coalesced messages
    finally:
        if reader is not None:
            reader.send_signal(signal.SIGTERM)
            reader.wait(30)
    part: dict[str, Any] = {"clients": clients, "jobs": n, "rate": rate, "seconds": round(wall, 2),
                            "achieved_rate": round(n / wall, 1), "post_ms": stats(lat),
                            "apiserver_cpu_percent": round(100 * cpu / wall, 1),
                            "apiserver_cpu_ms_per_job": round(1000 * cpu / n, 2)}
    if clients:
        got = json.loads(out.read_text())
        first = {int(k): v for k, v in got["first"].items()}
        delays = [(first[j] - t) * 1000 for j, t in answered.items() if j in first]
        part.update({"events_received": got["events"], "jobs_seen_by_client0": len(delays),
                     "delivery_ms": stats(delays)})
    log("stream", f"{clients} clients: POST p50 {part['post_ms']['p50']} ms, API server CPU "
                  f"{part['apiserver_cpu_ms_per_job']} ms/job")
    return part


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="0,50", help="client counts, comma-separated")
    ap.add_argument("--rate", type=float, default=20.0, help="job submissions per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds of submissions per part")
    ap.add_argument("--reader", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        url, n, out = args.reader
        asyncio.run(_read_streams(url, int(n), Path(out)))
        return 0
    with tempfile.TemporaryDirectory(prefix="xce-bench-stream-") as d:
        tmp = Path(d)
        bc = BenchCluster(tmp / "cluster", candidates=1, api=True)
        try:
            bc.start()
            bc.start_role("apiserver")
            url = bc.api_url()
            import httpx
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/readyz").status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("API server not ready")
                time.sleep(0.1)
            pid = bc.roles["apiserver"].pid
            parts = [run_part(url, int(c), args.rate, args.seconds, pid, tmp)
                     for c in args.clients.split(",")]
        finally:
            bc.close()
    write_result("stream", {**meta(), "parts": parts,
                            "note": "one candidate, no workers; the machine may be shared"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
