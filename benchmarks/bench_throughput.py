"""Durable submission throughput (library and REST) and end-to-end dispatch throughput.

Run from the repository root::

    python benchmarks/bench_throughput.py [--quick]

1. Library (``xcecore.connection.Client``, a separate process from the controller; three
   candidates, each submit acknowledged after its SQLite commit): one client sequential; one
   client pipelined (many ``jobsubmit`` calls in flight as anyio tasks on one connection);
   8 clients sequential; 8 clients pipelined. Jobs go to an inactive queue.
2. REST: ``POST /xce/v1/jobs`` through the API server (bearer token from ``/auth/logon``):
   one HTTP client sequential (keep-alive), and 16 requests in flight.
3. Dispatch, on a cluster with 2 workers of 4 slots and the scheduler: submit -> RUN (the
   ``job`` push showing RUN, seen by an observer joined as a third-party role) for single
   trivial jobs on an idle cluster; and trivial jobs (``true``) completed per second for a
   burst of jobs.

Each figure is repeated; medians and percentiles over the repeats. Writes
``benchmarks/results/throughput.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import (
    PARKED_QUEUE,
    BenchCluster,
    JobWatcher,
    log,
    logon,
    meta,
    quiet_logs,
    stats,
    write_result,
)

PART = "throughput"
FINISHED = ("DONE", "EXIT")
SUBMIT = {"command": "true", "user": "bench", "queue": PARKED_QUEUE}


async def _sequential(client: Any, n: int) -> None:
    for _ in range(n):
        await client.call("jobsubmit", SUBMIT)


async def _pipelined(client: Any, n: int, inflight: int) -> None:
    left = [n]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            await client.call("jobsubmit", SUBMIT)

    async with anyio.create_task_group() as tg:
        for _ in range(inflight):
            tg.start_soon(lane)


async def library(bc: BenchCluster, quick: bool) -> dict[str, Any]:
    """Jobs/s through the client library, four shapes, repeated."""
    from xcecore.connection import Client

    reps = 3 if quick else 5
    n_seq, n_pipe, n_each = (300, 2000, 150) if quick else (2000, 20000, 500)
    out: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            Client(bc.client_config(f"cli@bench-tp{i}"), role="cli")) for i in range(8)]
        for c in clients:
            await c.connect()
        await _sequential(clients[0], 100)  # warm-up

        async def timed(fn: Any, n: int) -> float:
            t0 = time.perf_counter()
            await fn()
            return n / (time.perf_counter() - t0)

        shapes = {
            "sequential_1_client": (lambda: _sequential(clients[0], n_seq), n_seq),
            "pipelined_1_client_256_inflight": (lambda: _pipelined(clients[0], n_pipe, 256), n_pipe),
            "sequential_8_clients": (lambda: _all(clients, lambda c: _sequential(c, n_each)), 8 * n_each),
            "pipelined_8_clients_32_inflight": (
                lambda: _all(clients, lambda c: _pipelined(c, n_pipe // 8, 32)), n_pipe),
        }
        for name, (fn, n) in shapes.items():
            rates = [await timed(fn, n) for _ in range(reps)]
            out[name] = {"jobs_per_s": stats(rates, 0), "jobs_per_run": n, "runs": reps}
            log(PART, f"library {name}: median {out[name]['jobs_per_s']['p50']:.0f} jobs/s")
    return out


async def _all(clients: list[Any], fn: Any) -> None:
    async with anyio.create_task_group() as tg:
        for c in clients:
            tg.start_soon(fn, c)


async def rest(url: str, quick: bool) -> dict[str, Any]:
    """Jobs/s through ``POST /jobs`` of the API server."""
    import httpx

    token = await anyio.to_thread.run_sync(logon, url)
    headers = {"authorization": f"Bearer {token}"}
    body = {"command": "true", "queue": PARKED_QUEUE}
    reps, n_seq, n_conc = (2, 100, 300) if quick else (3, 500, 2000)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30,
                                 limits=httpx.Limits(max_connections=16)) as http:
        async def post() -> float:
            t0 = time.perf_counter()
            r = await http.post("/jobs", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"POST /jobs -> {r.status_code}: {r.text[:300]}")
            return time.perf_counter() - t0

        await post()
        seq_rates, lat = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            lat += [await post() for _ in range(n_seq)]
            seq_rates.append(n_seq / (time.perf_counter() - t0))
        conc_rates = []
        for _ in range(reps):
            left = [n_conc]

            async def lane(left: list[int] = left) -> None:
                while left[0] > 0:
                    left[0] -= 1
                    await post()

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(lane)
            conc_rates.append(n_conc / (time.perf_counter() - t0))
    out["sequential_1_http_client"] = {"jobs_per_s": stats(seq_rates, 0), "latency_ms": stats(
        [x * 1e3 for x in lat], 2), "jobs_per_run": n_seq, "runs": reps}
    out["concurrent_16_inflight"] = {"jobs_per_s": stats(conc_rates, 0), "jobs_per_run": n_conc,
                                     "runs": reps}
    log(PART, f"REST sequential median {out['sequential_1_http_client']['jobs_per_s']['p50']:.0f}/s, "
              f"16 in flight {out['concurrent_16_inflight']['jobs_per_s']['p50']:.0f}/s")
    return out


async def dispatch(bc: BenchCluster, quick: bool) -> dict[str, Any]:
    """Submit -> RUN latency for single jobs, and completed trivial jobs per second."""
    from xcecore.connection import Client

    watcher = JobWatcher()
    n_single, bursts, n_burst = (10, 2, 50) if quick else (30, 3, 200)
    async with (Client(bc.client_config("cli@bench-submit"), role="cli") as sub,
                Client(bc.client_config("benchobs@bench"), role="benchobs", hooks=watcher) as obs):
        await sub.connect()
        await obs.connect()
        await obs.join()
        to_run, to_start, to_done = [], [], []
        for _ in range(n_single):
            t0 = time.time()
            jid = (await sub.call("jobsubmit", {"command": "true", "user": "bench"}))["jobid"]
            await _wait(lambda j=jid: watcher.seen.get(j, {}).keys() & {"DONE", "EXIT"}, 30)
            seen = watcher.seen[jid]
            rec = watcher.records[jid]
            if "RUN" in seen:
                to_run.append((seen["RUN"] - t0) * 1e3)
            if rec.get("start_time"):
                to_start.append((rec["start_time"] - rec["submit_time"]) * 1e3)
            to_done.append((min(seen.get("DONE", 1e20), seen.get("EXIT", 1e20)) - t0) * 1e3)
            await anyio.sleep(0.05)
        rates, failed = [], 0
        for _ in range(bursts):
            t0 = time.time()
            ids: list[int] = []

            async def one(ids: list[int] = ids) -> None:
                ids.append((await sub.call("jobsubmit", {"command": "true", "user": "bench"}))["jobid"])

            async with anyio.create_task_group() as tg:
                for _ in range(n_burst):
                    tg.start_soon(one)
            await _wait(lambda ids=ids: all(watcher.seen.get(j, {}).keys() & FINISHED for j in ids), 120)
            end = max(min(watcher.seen[j].get(s, 1e20) for s in FINISHED) for j in ids)
            failed += sum(1 for j in ids if "DONE" not in watcher.seen[j])
            rates.append(n_burst / (end - t0))
    out: dict[str, Any] = {"submit_to_run_ms": stats(to_run, 1), "submit_to_started_ms": stats(to_start, 1),
           "submit_to_done_ms": stats(to_done, 1),
           "completed_per_s": stats(rates, 1), "burst_jobs": n_burst, "bursts": bursts,
           "burst_jobs_not_done": failed, "slots": 8}
    log(PART, f"dispatch: submit->RUN median {out['submit_to_run_ms'].get('p50')} ms; "
              f"completed {out['completed_per_s'].get('p50')} jobs/s")
    return out


async def _wait(cond: Any, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(0.002)


def main(argv: list[str] | None = None) -> int:
    """Run the throughput benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts")
    args = ap.parse_args(argv)
    quiet_logs()
    result: dict[str, Any] = meta()
    with tempfile.TemporaryDirectory(prefix="xce-bench-tp-") as tmp:
        bc = BenchCluster(Path(tmp) / "ctl")
        try:
            bc.start()
            result["library"] = anyio.run(library, bc, args.quick)
        finally:
            bc.close()
        full = BenchCluster(Path(tmp) / "full", api=True)
        try:
            full.start()
            full.start_workers(2, slots=4)
            full.start_role("scheduler")
            full.start_role("apiserver")
            for name in ("node1", "node2", "scheduler"):
                full.wait_logged(name, "joined as", 60)
            full.wait_logged("apiserver", "serving it", 60)
            result["rest"] = anyio.run(rest, full.api_url(), args.quick)
            result["dispatch"] = anyio.run(dispatch, full, args.quick)
        except BaseException:
            print(full.cluster.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            full.close()
    result["aims"] = {"sequential_1_client": ">= 1,000/s", "pipelined": ">= 10,000/s",
                      "submit_to_run_ms": "<= 50 median", "completed_per_s": ">= 100 (2 slots)"}
    result["peers"] = {"slurm_sequential_cli_jobs_per_s": "101-105",
                       "slurm_submit_to_start_s": "1.72 median (0.58 tuned)",
                       "slurm_completed_per_s_2_slots": "0.6 (2.1 tuned)"}
    write_result(PART, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
