"""Benchmark of the API server: requests/s and latency of its main routes.

In-process (httpx over the ASGI transport, no sockets; the app, store and evaluator are the
real ones, the controller is an instant fake):

- ``GET /jobs`` with 10,000 jobs in the store;
- ``POST /jobs`` (the backend wrapper and a fake controller that answers at once);
- ``POST /hosts/select`` over 10,000 hosts;
- a ``POST /jobs`` answered 503 while the backend is degraded (p50/p99 latency).

Over real HTTP on loopback (unless ``--no-real``): a real controller (one candidate) and a
real ``xce run apiserver`` process; ``POST /jobs`` sequential and with 8 in flight, and
``GET /jobs``. Every process started is killed by pid at the end.

Usage: ``python benchmarks/bench_apiserver.py [--repeat N] [--no-real]``. Writes
``benchmarks/results/apiserver.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
from xce_apiserver.app import create_app
from xce_apiserver.auth import Authenticator, hash_password, parse_users
from xce_apiserver.backend import Backend
from xce_apiserver.health import BackendHealth
from xce_apiserver.store import Store

from xcecore.resreq.evaluator import Evaluator

RESULTS = Path(__file__).parent / "results"
V = "/xce/v1"


def _job(i: int) -> dict[str, Any]:
    return {"jobid": i, "name": f"j{i}", "user": f"u{i % 50}", "project": "default",
            "queue": "normal" if i % 3 else "priority", "command": "sleep 10", "cwd": "/tmp",
            "env": {}, "resreq": "", "ntasks": 1, "state": ("PEND", "RUN", "DONE")[i % 3],
            "submit_time": 1.7e9 + i, "start_time": None, "end_time": None, "alloc": [],
            "pid": None, "exit_status": None, "pend_reason": None, "reason": None, "signal": None,
            "attempt": 0, "forced": False, "usage": {}}


def _host(i: int) -> dict[str, Any]:
    ncpus = (4, 8, 16, 32)[i % 4]
    return {"name": f"n{i:05d}", "state": "ok" if i % 50 else "closed", "available": True,
            "closed": i % 50 == 0, "comment": "", "max_slots": ncpus, "used_slots": i % ncpus,
            "attrs": {"hname": f"n{i:05d}", "ncpus": ncpus, "maxmem": ncpus * 4096,
                      "type": "X86_64", "model": "Xeon", "cpuf": 1.0,
                      "resources": ["gpu"] if i % 7 == 0 else []},
            "resvals": {"r1m": (i % 17) / 4, "mem": float(ncpus * 2048 - i % 1000), "ut": 0.1},
            "joined_at": 1.7e9}


class InstantController:
    """Answers jobsubmit at once, as a controller would."""

    def __init__(self) -> None:
        self.next = 100_000
        self.connected = True

    async def call(self, op: str, args: dict[str, Any] | None = None, **_: Any) -> Any:
        self.next += 1
        return {"jobid": self.next, "queue": "normal", "state": "PEND"}


def _figures(lat: list[float], wall: float) -> dict[str, float]:
    lat = sorted(lat)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    return {"n": len(lat), "rps": round(len(lat) / wall, 1), "p50_ms": round(pct(0.5), 3),
            "p90_ms": round(pct(0.9), 3), "p99_ms": round(pct(0.99), 3),
            "mean_ms": round(statistics.fmean(lat) * 1000, 3)}


async def _measure(n: int, one: Callable[[], Awaitable[httpx.Response]], status: int) -> dict[str, float]:
    lat: list[float] = []
    for _ in range(min(3, n)):  # warm-up (caches, first compile)
        await one()
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        r = await one()
        lat.append(time.perf_counter() - t0)
        if r.status_code != status:
            raise SystemExit(f"unexpected {r.status_code}: {r.text[:300]}")
    return _figures(lat, time.perf_counter() - start)


def _median_runs(runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = runs[0].keys()
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    out["runs"] = runs
    return out


def feed(store: Store, kinds: dict[str, list[dict[str, Any]]]) -> None:
    """Give ``store`` these records as one snapshot sync (docs/protocol.md), 1,000 a frame."""
    store.apply("sync_begin", {"mode": "snapshot", "store": "bench", "rev": 1, "since": None})
    for kind, items in kinds.items():
        for start in range(0, len(items), 1000):
            store.apply("sync_records", {"kind": kind, "items": items[start:start + 1000]})
    store.apply("sync_end", {"rev": 1})


async def in_process(repeat: int) -> dict[str, Any]:
    store = Store()
    feed(store, {"cluster": [{"name": "bench", "resources": [{"name": "gpu", "type": "bool"}]}],
                 "queues": [{"name": "normal", "priority": 30, "open": True, "active": True,
                             "status": "Open:Active", "description": ""}],
                 "hosts": [_host(i) for i in range(10_000)],
                 "jobs": [_job(i) for i in range(1, 10_001)]})
    health = BackendHealth()
    backend = Backend(InstantController(), health)  # type: ignore[arg-type]
    users = parse_users([{"name": "u", "password_hash": hash_password("pw", iterations=1000)}])
    auth = Authenticator(users)
    app = create_app(store, backend, health, auth, Evaluator)
    hdr = {"Authorization": f"Bearer {auth.issue(users['u']).token}"}
    req = "select[ncpus>=8 && mem>4096 && status==ok] order[r1m:-mem]"
    out: dict[str, list[dict[str, float]]] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as c:
        cases: list[tuple[str, int, Callable[[], Awaitable[httpx.Response]], int]] = [
            ("get_jobs_10k", 30, lambda: c.get(f"{V}/jobs", headers=hdr), 200),
            ("get_jobs_10k_filtered_user", 100, lambda: c.get(f"{V}/jobs", params={"user": "u7"}, headers=hdr), 200),
            ("post_jobs", 1000, lambda: c.post(f"{V}/jobs", json={"command": "true"}, headers=hdr), 200),
            ("post_hosts_select_10k", 50, lambda: c.post(f"{V}/hosts/select", json={"resreq": req}, headers=hdr), 200),
            ("post_hosts_select_10k_limit10", 100,
             lambda: c.post(f"{V}/hosts/select", json={"resreq": req, "limit": 10}, headers=hdr), 200),
        ]
        for _ in range(repeat):
            for name, n, one, status in cases:
                out.setdefault(name, []).append(await _measure(n, one, status))
            backend.client.connected = False  # the link is down past the grace: breaker open
            health.grace = 0.0
            health.link_lost("benchmark")
            out.setdefault("post_jobs_503_degraded", []).append(
                await _measure(2000, lambda: c.post(f"{V}/jobs", json={"command": "x"}, headers=hdr), 503))
            backend.client.connected = True
            health.link_up()
    return {k: _median_runs(v) for k, v in out.items()}


def real_http(repeat: int) -> dict[str, Any]:
    from xcecore.testing import LocalCluster, wait_for

    root = Path(tempfile.mkdtemp(prefix="xce-bench-api-"))
    cluster = LocalCluster(root, 1)
    try:
        cluster.start()
        port_file = root / "api.port"
        users = f'[{{name = "u", password_hash = "{hash_password("pw", iterations=1000)}"}}]'
        proc = cluster.start_role("apiserver", 'apiserver.listen="127.0.0.1:0"',
                                  f'apiserver.port_file="{port_file}"', f"apiserver.users={users}",
                                  "log.level=\"WARNING\"")
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 30, what="port file")
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        wait_for(lambda: httpx.get(f"{base}{V}/readyz").status_code == 200, 30, what="readyz")
        token = httpx.post(f"{base}{V}/auth/logon", json={"username": "u", "password": "pw"}).json()
        hdr = {"Authorization": f"Bearer {token['data']['token']}"}

        async def run() -> dict[str, Any]:
            out: dict[str, list[dict[str, float]]] = {}
            # A default client, no socket options: the server sets TCP_NODELAY on accepted
            # connections (its headers and body are two send() calls; without it Nagle plus
            # the client's delayed ACK added ~40 ms to every response).
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                for _ in range(repeat):
                    out.setdefault("post_jobs_sequential", []).append(await _measure(
                        500, lambda: c.post(f"{V}/jobs", json={"command": "true"}, headers=hdr), 200))
                    lat: list[float] = []

                    async def worker(lat: list[float] = lat) -> None:
                        for _ in range(125):
                            t0 = time.perf_counter()
                            r = await c.post(f"{V}/jobs", json={"command": "true"}, headers=hdr)
                            lat.append(time.perf_counter() - t0)
                            assert r.status_code == 200, r.text

                    start = time.perf_counter()
                    async with anyio.create_task_group() as tg:
                        for _ in range(8):
                            tg.start_soon(worker)
                    out.setdefault("post_jobs_8_in_flight", []).append(
                        _figures(lat, time.perf_counter() - start))
                njobs = len((await c.get(f"{V}/jobs", headers=hdr)).json()["data"])
                for _ in range(repeat):
                    out.setdefault(f"get_jobs_{njobs}", []).append(await _measure(
                        30, lambda: c.get(f"{V}/jobs", headers=hdr), 200))
            return {k: _median_runs(v) for k, v in out.items()}

        result = anyio.run(run)
        if not proc.alive():
            raise SystemExit(proc.text()[-2000:])
        return result
    finally:
        cluster.close()


def write(results: dict[str, Any], argv: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "cores": os.cpu_count(),
            "python": sys.version.split()[0], "command": "python benchmarks/bench_apiserver.py " + " ".join(argv)}
    doc = {"meta": meta, **results}
    (RESULTS / "apiserver.json").write_text(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    lines = ["# API server benchmark", "", f"- date: {meta['date']}", f"- cores: {meta['cores']}",
             f"- python: {meta['python']}", f"- command: `{meta['command']}`",
             "- figures: medians over the repeated runs of each run's figure", ""]
    for section, rows in results.items():
        lines += [f"## {section}", "", "| case | n/run | req/s | p50 ms | p90 ms | p99 ms |",
                  "|---|---|---|---|---|---|"]
        for name, f in rows.items():
            lines.append(f"| {name} | {f['n']:.0f} | {f['rps']:.0f} | {f['p50_ms']:.2f} | "
                         f"{f['p90_ms']:.2f} | {f['p99_ms']:.2f} |")
        lines.append("")
    (RESULTS / "apiserver.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-real", action="store_true", help="skip the real-HTTP part")
    args = ap.parse_args()
    results: dict[str, Any] = {"in_process_asgi": anyio.run(in_process, args.repeat)}
    if not args.no_real:
        results["real_http_loopback"] = real_http(args.repeat)
    write(results, sys.argv[1:])


if __name__ == "__main__":
    main()
