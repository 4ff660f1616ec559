"""Durable submission throughput (library and REST) and end-to-end dispatch throughput.

Run from the repository root::

    python benchmarks/bench_throughput.py [--quick]

1. Library (``xcecore.client.Client``, a separate process from the controller; three
   candidates, each submit acknowledged after its SQLite commit): one client sequential; one
   client pipelined (many ``jobsubmit`` calls in flight as anyio tasks on one connection);
   8 clients sequential; 8 clients pipelined. Jobs go to an inactive queue.
2. REST: ``POST /xce/v1/jobs`` through the API server (bearer token from ``/auth/logon``):
   one HTTP client sequential (keep-alive), and 16 requests in flight.
3. Dispatch, on a cluster with 2 workers of 4 slots and the scheduler: submit -> RUN (the
   ``job`` push showing RUN, seen by an observer joined as a third-party role) for single
   trivial jobs on an idle cluster; and trivial jobs (``true``) completed per second for a
   burst of jobs. This cluster also holds every job parts 1-2 parked in the inactive queue
   (thousands of pending jobs in the scheduler's view), as a busy site would.
4. Completed per second, the aim as stated: fresh clusters (nothing parked) with 2 slots
   (one worker) and with 8 slots (2 workers x 4): bursts of trivial jobs, end to end
   (submit -> dispatch -> ``true`` -> finish reported -> slot freed -> next dispatch),
   the rate of each burst; median over the bursts.

Each figure is repeated; medians and percentiles over the repeats. Writes
``benchmarks/results/throughput.json`` and ``throughput.md``.
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
SUBMIT = {"command": "true", "queue": PARKED_QUEUE}


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
    from xcecore.client import Client

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
    from xcecore.client import Client

    watcher = JobWatcher()
    n_single, bursts, n_burst = (10, 2, 50) if quick else (30, 5, 200)
    async with (Client(bc.client_config("cli@bench-submit"), role="cli") as sub,
                Client(bc.client_config("benchobs@bench"), role="benchobs", hooks=watcher) as obs):
        await sub.connect()
        await obs.connect()
        await obs.join()
        to_run, to_start, to_done = [], [], []
        for _ in range(n_single):
            t0 = time.time()
            jid = (await sub.call("jobsubmit", {"command": "true"}))["jobid"]
            await _wait(lambda j=jid: watcher.seen.get(j, {}).keys() & {"DONE", "EXIT"}, 30)
            seen = watcher.seen[jid]
            rec = watcher.records[jid]
            if "RUN" in seen:
                to_run.append((seen["RUN"] - t0) * 1e3)
            if rec.get("start_time"):
                to_start.append((rec["start_time"] - rec["submit_time"]) * 1e3)
            to_done.append((min(seen.get("DONE", 1e20), seen.get("EXIT", 1e20)) - t0) * 1e3)
            await anyio.sleep(0.05)
        rates, failed = await _bursts(sub, watcher, n_burst, bursts)
        parked = len([j for j, r in watcher.records.items() if r.get("state") == "PEND"])
    out: dict[str, Any] = {"submit_to_run_ms": stats(to_run, 1), "submit_to_started_ms": stats(to_start, 1),
           "submit_to_done_ms": stats(to_done, 1),
           "completed_per_s": stats(rates, 1), "burst_jobs": n_burst, "bursts": bursts,
           "burst_jobs_not_done": failed, "slots": 8, "parked_jobs_in_view": parked}
    log(PART, f"dispatch: submit->RUN median {out['submit_to_run_ms'].get('p50')} ms; "
              f"completed {out['completed_per_s'].get('p50')} jobs/s ({parked} jobs parked)")
    return out


async def _bursts(sub: Any, watcher: JobWatcher, n_burst: int, bursts: int) -> tuple[list[float], int]:
    """Submit ``bursts`` bursts of ``n_burst`` trivial jobs, one after the other; each burst's
    completion rate (jobs / (last DONE push seen - first submit)) and the jobs not DONE."""
    rates, failed = [], 0
    for _ in range(bursts):
        t0 = time.time()
        ids: list[int] = []

        async def one(ids: list[int] = ids) -> None:
            ids.append((await sub.call("jobsubmit", {"command": "true"}))["jobid"])

        async with anyio.create_task_group() as tg:
            for _ in range(n_burst):
                tg.start_soon(one)
        await _wait(lambda ids=ids: all(watcher.seen.get(j, {}).keys() & FINISHED for j in ids), 120)
        end = max(min(watcher.seen[j].get(s, 1e20) for s in FINISHED) for j in ids)
        failed += sum(1 for j in ids if "DONE" not in watcher.seen[j])
        rates.append(n_burst / (end - t0))
        await anyio.sleep(0.2)  # let the last reports settle: bursts do not overlap
    return rates, failed


async def completed(bc: BenchCluster, quick: bool, slots: int) -> dict[str, Any]:
    """Trivial jobs completed per second on a fresh cluster with ``slots`` slots in all."""
    from xcecore.client import Client

    watcher = JobWatcher()
    bursts, n_burst = (3, 100) if quick else (7, 200)
    async with (Client(bc.client_config("cli@bench-burst"), role="cli") as sub,
                Client(bc.client_config("benchobs@burst"), role="benchobs", hooks=watcher) as obs):
        await sub.connect()
        await obs.connect()
        await obs.join()
        await _bursts(sub, watcher, 20, 1)  # warm-up
        rates, failed = await _bursts(sub, watcher, n_burst, bursts)
    out = {"jobs_per_s": stats(rates, 1), "burst_jobs": n_burst, "bursts": bursts,
           "burst_jobs_not_done": failed, "slots": slots}
    log(PART, f"completed, {slots} slots: median {out['jobs_per_s'].get('p50')} jobs/s "
              f"(bursts of {n_burst}, {bursts} bursts)")
    return out


def completed_on_fresh_cluster(root: Path, quick: bool, workers: int, slots: int) -> dict[str, Any]:
    """Start a cluster with ``workers`` workers of ``slots`` slots and the scheduler; measure."""
    bc = BenchCluster(root)
    try:
        bc.start()
        bc.start_workers(workers, slots=slots)
        bc.start_role("scheduler")
        for name in [*(f"node{i}" for i in range(1, workers + 1)), "scheduler"]:
            bc.wait_logged(name, "joined as", 60)
        return anyio.run(completed, bc, quick, workers * slots)
    except BaseException:
        print(bc.cluster.logs()[-6000:], file=sys.stderr)
        raise
    finally:
        bc.close()


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
        result["completed"] = {
            "2_slots": completed_on_fresh_cluster(Path(tmp) / "two", args.quick, 1, 2),
            "8_slots": completed_on_fresh_cluster(Path(tmp) / "eight", args.quick, 2, 4),
        }
    result["aims"] = {"sequential_1_client": ">= 1,000/s", "pipelined": ">= 10,000/s",
                      "submit_to_run_ms": "<= 50 median", "completed_per_s": ">= 100 (2 slots)"}
    result["peers"] = {"slurm_sequential_cli_jobs_per_s": "101-105",
                       "slurm_submit_to_start_s": "1.72 median (0.58 tuned)",
                       "slurm_completed_per_s_2_slots": "0.6 (2.1 tuned)"}
    write_result(PART, result)
    write_markdown(result)
    return 0


def write_markdown(result: dict[str, Any]) -> None:
    """``benchmarks/results/throughput.md``: the dispatch figures, 2 and 8 slots."""
    from benchkit import RESULTS

    def row(label: str, s: dict[str, Any], aim: str = "") -> str:
        if not s.get("n"):
            return f"| {label} | - | - | - | 0 | {aim} |"
        return f"| {label} | {s['p50']} | {s['min']}-{s['max']} | {s['p90']} | {s['n']} | {aim} |"

    disp = result.get("dispatch", {})
    lines = ["# Throughput: trivial jobs completed per second", "",
             f"{result['date']}, {result['cores']} cores, `{result['command']}`.", "",
             "Each run is a burst of trivial jobs (`true`) submitted at once; its rate is jobs / "
             "(last DONE push seen - first submit). Median over the bursts.", "",
             "| setup | median jobs/s | min-max | p90 | bursts | aim |", "|---|---|---|---|---|---|"]
    for key, label in (("2_slots", "fresh cluster, 1 worker x 2 slots"),
                       ("8_slots", "fresh cluster, 2 workers x 4 slots")):
        v = result.get("completed", {}).get(key)
        if v:
            lines.append(row(f"{label}, bursts of {v['burst_jobs']}", v["jobs_per_s"],
                             "≥ 100 (Slurm 0.6, tuned 2.1)" if key == "2_slots" else ""))
    if disp:
        lines.append(row(f"2 workers x 4 slots, {disp.get('parked_jobs_in_view')} jobs parked in "
                         f"an inactive queue, bursts of {disp['burst_jobs']}",
                         disp["completed_per_s"]))
        lines += ["", "| latency, single jobs on an idle cluster | p50 ms | min-max | p90 | n | aim |",
                  "|---|---|---|---|---|---|",
                  row("submit -> RUN push seen", disp["submit_to_run_ms"], "≤ 50 median"),
                  row("submit -> started (controller clock)", disp["submit_to_started_ms"]),
                  row("submit -> DONE push seen", disp["submit_to_done_ms"])]
    path = RESULTS / f"{PART}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"[{PART}] wrote {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
