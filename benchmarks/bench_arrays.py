"""Job arrays (issue #22): submit time, controller memory per pending element, dispatch rate.

Real processes on loopback: one controller candidate (its state durable in SQLite), a client
that makes the calls, and for the dispatch part the real scheduler and simulated workers
(real ``Client``s joined as hosts by a child process of this script, ``--serve-hosts``, with
``simworkers.py``'s attributes; they take jobs and never finish them, so the figure is the
controller's and the scheduler's, not process start-up).

1. ``submit``: one ``jobsubmit`` of a ``--size``-element array (``1-N``), acknowledged after
   its durable commit; ``--runs`` times; wall ms of the call (aim: <= 1 s at 100,000).
2. ``memory``: the primary's RSS (``/proc/PID/status`` VmRSS) before and after ``--arrays``
   arrays of ``--size`` pending elements each (in an inactive queue, so they stay pending),
   per pending element (aim: <= 200 bytes).
3. ``dispatch``: an array of ``--dispatch-size`` elements onto ``--hosts`` simulated hosts
   (slots to spare): submit -> every element RUN (the array's record says ``left`` 0 and
   ``counts.RUN`` = size), elements per second; ``--runs`` times, a fresh cluster each.

    python benchmarks/bench_arrays.py                       # full run
    python benchmarks/bench_arrays.py --runs 3 --arrays 3 --dispatch-size 2000   # short
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import PARKED_QUEUE, BenchCluster, log, meta, stats, write_result

HERE = Path(__file__).resolve().parent
PART = "arrays"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cli(bench: BenchCluster) -> Any:
    from xcecore.client import SyncClient

    return SyncClient.open(bench.client_config("cli@arrays"), role="cli")


def measure_submit(root: Path, size: int, runs: int, arrays: int) -> dict[str, Any]:
    """Submit wall times, and RSS per pending element."""
    bench = BenchCluster(root / "submit", candidates=1)
    try:
        bench.start()
        pid = bench.cluster.candidates[0].pid
        with _cli(bench) as cli:
            for _ in range(3):  # warm the connection, the store, the code paths
                cli.call("jobsubmit", {"command": "true", "queue": PARKED_QUEUE})
            time.sleep(1.0)
            before = rss_bytes(pid)
            for _ in range(arrays):
                cli.call("jobsubmit", {"command": "true", "queue": PARKED_QUEUE, "array": f"1-{size}"})
            time.sleep(1.0)
            after = rss_bytes(pid)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                res = cli.call("jobsubmit", {"command": "echo $XCE_ARRAY_INDEX", "queue": PARKED_QUEUE,
                                             "name": "bench", "array": f"1-{size}%50"})
                times.append((time.perf_counter() - t0) * 1000)
                assert res["size"] == size, res
        pending = arrays * size
        return {"submit_ms": stats(times), "size": size,
                "memory": {"arrays": arrays, "pending_elements": pending, "rss_before_bytes": before,
                           "rss_after_bytes": after,
                           "bytes_per_pending_element": round((after - before) / pending, 3)}}
    finally:
        bench.close()


def measure_dispatch(root: Path, size: int, hosts: int, run: int) -> float:
    """Seconds from the submission of a ``size``-element array to every element RUN."""
    bench = BenchCluster(root / f"dispatch{run}", candidates=1)
    sim = None
    try:
        bench.start()
        sim = subprocess.Popen([sys.executable, __file__, "--serve-hosts", str(hosts), "--config",
                                str(bench.cluster.config_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
        assert sim.stdout is not None
        ready = sim.stdout.readline().split()
        if not ready or ready[0] != "ready" or int(ready[1]) != hosts:
            raise RuntimeError(f"simulated workers: {ready}")
        bench.start_role("scheduler")
        bench.wait_logged("scheduler", "picker started", 60)
        with _cli(bench) as cli:
            t0 = time.perf_counter()
            res = cli.call("jobsubmit", {"command": "true", "array": f"1-{size}"})
            jobid = res["jobid"]
            deadline = time.monotonic() + 600
            while True:
                rec = cli.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
                a = rec["array"]
                if a["left"] == 0 and a["counts"].get("RUN") == size:
                    return time.perf_counter() - t0
                if time.monotonic() > deadline:
                    raise TimeoutError(f"array not dispatched in 600 s: {a}")
                time.sleep(0.01)
    finally:
        if sim is not None and sim.poll() is None:
            assert sim.stdin is not None
            sim.stdin.close()
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait(10)
        bench.close()


def serve_hosts(config: str, count: int) -> int:
    """Join ``count`` hosts (one ``Client`` each, on one loop); ``ready N`` once joined; keep
    them until stdin ends."""
    import anyio
    from benchkit import quiet_logs
    from simworkers import SimHooks, attrs_for

    from xcecore.client import Client, client_config
    from xcecore.runtime import load

    quiet_logs("ERROR")
    _, cfg = load(Path(config))

    async def serve() -> None:
        joined = [0]
        done = anyio.Event()

        async def one(i: int) -> None:
            cc = client_config(cfg.cluster, cfg.section("client"), f"worker@ah{i:05d}")
            async with Client(cc, role="worker", hooks=SimHooks(), join_attrs=attrs_for(i, "ah"),
                              rejoin_points=("hello",)) as client:
                await client.connect()
                await client.join()
                joined[0] += 1
                if joined[0] == count:
                    done.set()
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            for i in range(count):
                tg.start_soon(one, i)
            with anyio.fail_after(120):
                await done.wait()
            print(f"ready {joined[0]}", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)
            tg.cancel_scope.cancel()

    anyio.run(serve)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-hosts", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--arrays", type=int, default=10, help="arrays held for the memory figure")
    ap.add_argument("--dispatch-size", type=int, default=10_000)
    ap.add_argument("--hosts", type=int, default=300)
    args = ap.parse_args()
    if args.serve_hosts:
        return serve_hosts(args.config, args.serve_hosts)
    with tempfile.TemporaryDirectory(prefix="bench-arrays-") as tmp:
        root = Path(tmp)
        log(PART, f"submit: {args.runs} arrays of {args.size:,}; memory: {args.arrays} held")
        sub = measure_submit(root, args.size, args.runs, args.arrays)
        log(PART, f"submit p50 {sub['submit_ms']['p50']} ms; "
                  f"{sub['memory']['bytes_per_pending_element']} B per pending element")
        rates = []
        for run in range(max(1, args.runs // 3)):
            secs = measure_dispatch(root, args.dispatch_size, args.hosts, run)
            rates.append(args.dispatch_size / secs)
            log(PART, f"dispatch run {run}: {args.dispatch_size:,} elements RUN in {secs:.2f} s")
    write_result(PART, {"meta": meta(), "results": {
        **sub, "dispatch": {"elements": args.dispatch_size, "hosts": args.hosts,
                            "elements_per_s": stats(rates, 1),
                            "median_s": round(args.dispatch_size / statistics.median(rates), 3)}}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
