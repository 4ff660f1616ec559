"""What TLS costs on the wire: handshakes and durable submit throughput, TLS against plain TCP.

Run from the repository root::

    python benchmarks/bench_tls.py [--runs 300] [--quick]

Two single-candidate clusters run side by side, one plain and one with ``[tls]`` (a CA and an
EC P-256 host certificate made by ``xcecore.tlscerts``, as ``xce tls init`` makes them; TLS
1.3). Parts (medians and percentiles of repeated runs):

- ``tls_only``: the TLS handshake alone (TCP connect, then the TLS handshake, then close),
  blocking sockets, milliseconds;
- ``handshake``: a whole xce handshake to the primary (connect, TLS if on, hello, answer,
  verdict) with the one-shot client, milliseconds;
- ``throughput``: durable ``jobsubmit`` through the event-loop client -- one client
  sequential and one client with 64 in flight -- jobs per second, each run of ``--jobs``
  jobs (to an inactive queue).

The failover figures with TLS on come from ``bench_failover.py --tls``. Writes
``benchmarks/results/tls.json``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import PARKED_QUEUE, BenchCluster, log, meta, quiet_logs, stats, write_result

PART = "tls"
SUBMIT = {"command": "true", "queue": PARKED_QUEUE}


def tls_only_ms(bc: BenchCluster, runs: int) -> dict[str, float]:
    """TCP connect + TLS handshake + close, blocking, per run (ms)."""
    tls = bc.cluster.client_tls()
    assert tls is not None
    port = bc.cluster.ports[0]
    times = []
    for i in range(runs + 10):
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                tls.context.wrap_socket(raw, server_hostname="127.0.0.1"):
            pass
        if i >= 10:  # warm-up
            times.append((time.perf_counter() - t0) * 1e3)
    return stats(times)


def handshake_ms(bc: BenchCluster, runs: int) -> dict[str, float]:
    """A whole xce handshake with the one-shot client (connect, TLS if on, hello, answer,
    verdict), per run (ms)."""
    from xcecore.client.oneshot import OneShotClient

    cfg = bc.client_config("cli@bench-tls")
    cand = cfg.candidates[0]
    times = []
    with OneShotClient(cfg) as client:
        for i in range(runs + 10):
            t0 = time.perf_counter()
            state = client.probe(cand, 5.0)
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1e3)
            assert state == "primary", state
    return stats(times)


async def throughput(bc: BenchCluster, reps: int, jobs: int) -> dict[str, Any]:
    """Durable jobsubmit rates through the event-loop client: sequential and 64 in flight."""
    from xcecore.client import Client

    out: dict[str, Any] = {}
    async with Client(bc.client_config("cli@bench-tls-tp"), role="cli") as client:
        await client.connect()
        for _ in range(50):
            await client.call("jobsubmit", SUBMIT)

        async def sequential() -> None:
            for _ in range(jobs):
                await client.call("jobsubmit", SUBMIT)

        async def pipelined() -> None:
            left = [jobs]

            async def lane() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    await client.call("jobsubmit", SUBMIT)

            async with anyio.create_task_group() as tg:
                for _ in range(64):
                    tg.start_soon(lane)

        for name, fn in (("sequential", sequential), ("pipelined_64", pipelined)):
            rates = []
            for _ in range(reps):
                t0 = time.perf_counter()
                await fn()
                rates.append(jobs / (time.perf_counter() - t0))
            out[name] = {"jobs_per_s": stats(rates, 0), "jobs_per_run": jobs, "runs": reps}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the TLS benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="handshakes per measure (default 300)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per throughput run (default 1000)")
    ap.add_argument("--reps", type=int, default=5, help="throughput runs per shape (default 5)")
    ap.add_argument("--quick", action="store_true", help="50 handshakes, 3 x 300 jobs")
    args = ap.parse_args(argv)
    runs, jobs, reps = (50, 300, 3) if args.quick else (args.runs, args.jobs, args.reps)
    quiet_logs()
    root = Path(tempfile.mkdtemp(prefix="xce-bench-tls-"))
    result: dict[str, Any] = {**meta(), "runs": runs, "jobs_per_run": jobs, "reps": reps,
                              "tls_version": None, "cipher": None,
                              "loadavg_1min_at_start": round(os.getloadavg()[0], 2)}
    clusters = {"plain": BenchCluster(root / "plain", candidates=1),
                "tls": BenchCluster(root / "tls", candidates=1, tls=True)}
    try:
        for bc in clusters.values():
            bc.start()
        tls = clusters["tls"].cluster.client_tls()
        assert tls is not None
        with socket.create_connection(("127.0.0.1", clusters["tls"].cluster.ports[0])) as raw, \
                tls.context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            result["tls_version"], result["cipher"] = s.version(), (s.cipher() or ("?",))[0]
        result["tls_only_ms"] = tls_only_ms(clusters["tls"], runs)
        log(PART, f"TLS handshake alone p50 {result['tls_only_ms']['p50']} ms")
        for name, bc in clusters.items():
            result[name] = {"handshake_ms": handshake_ms(bc, runs)}
            log(PART, f"{name}: xce handshake p50 {result[name]['handshake_ms']['p50']} ms")
            result[name]["throughput"] = anyio.run(throughput, bc, reps, jobs)
            t = result[name]["throughput"]
            log(PART, f"{name}: sequential p50 {t['sequential']['jobs_per_s']['p50']:.0f} jobs/s, "
                      f"64 in flight p50 {t['pipelined_64']['jobs_per_s']['p50']:.0f} jobs/s")
    finally:
        for bc in clusters.values():
            bc.close()
    result["loadavg_1min_at_end"] = round(os.getloadavg()[0], 2)
    write_result(PART, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
