"""The etcd backend's write throughput: etcd alone, then durable submissions through xce.

Run from the repository root::

    python benchmarks/bench_etcd.py [--quick]

A real three-member etcd on loopback (the operator's guide's flags; each member fsyncs its
own WAL on this one disk), then:

1. etcd alone (:mod:`etcd_ceiling`): one client's sequential puts, 8 clients' concurrent
   puts, and one client's sequential 64-put transactions, each through the JSON gateway and
   through gRPC (what the gateway costs);
2. xce on the etcd backend (three candidates, ``[controller] backend = "etcd"``):
   ``bench_throughput``'s four library shapes -- one client sequential, one client with 256
   submissions in flight, 8 clients sequential, 8 clients with 32 in flight each. Every
   submission is acknowledged after the guarded etcd transaction holding it committed; the
   writer groups what is queued into one transaction (group commit). On disk twice: the
   store's transactions over gRPC (``[etcd] transport = "grpc"``, the default), then through
   the JSON gateway (``"gateway"``), each on a prefix of its own.

3. Where the CPU goes (disk, gRPC): one more sequential and one more pipelined run (1 client,
   256 in flight) with each process's CPU time (utime + stime from ``/proc``) counted over
   the run -- the three etcd members, the primary, the two standbys, the client (this
   process) -- per submission, and etcd's own counters over it (``/metrics``: WAL fsyncs
   and their mean duration, raft proposals -- the write transactions: the store's, and a
   few of the election's --, puts), so the submissions per transaction show.
   CPU per submission is what a shared machine distorts least.

Both with the members' data on this machine's disk (each of the three members fsyncs its
WAL on it: what a site has, but on one disk instead of three) and on tmpfs (``/dev/shm``:
no fsync; for tests only, a member that loses its power loses its data): the difference is
what the fsyncs cost. Medians over repeated runs. Writes ``benchmarks/results/etcd.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import _pipelined, _sequential, library
from benchkit import BenchCluster, log, meta, quiet_logs, write_result
from etcd_ceiling import ceiling

PART = "etcd"
TICK = os.sysconf("SC_CLK_TCK")
METRICS = {"etcd_disk_wal_fsync_duration_seconds_sum": "fsync_s",
           "etcd_disk_wal_fsync_duration_seconds_count": "fsyncs",
           "etcd_mvcc_txn_total": "txns", "etcd_mvcc_put_total": "puts",
           "etcd_server_proposals_committed_total": "proposals"}


def cpu_s(pid: int) -> float:
    """Seconds of CPU (user + system) process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def counters(url: str) -> dict[str, float]:
    """A member's counters of :data:`METRICS` (its ``/metrics``)."""
    import httpx

    out = dict.fromkeys(METRICS.values(), 0.0)
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:
            out[METRICS[name]] += float(line.rsplit(" ", 1)[1])
    return out


async def cpu_split(bc: BenchCluster, endpoints: list[str], pids: dict[str, int],
                    quick: bool) -> dict[str, Any]:
    """CPU per submission by process and etcd's counters over a sequential and a pipelined
    run (see the module docstring)."""
    from xcecore.client import Client

    n_seq, n_pipe = (300, 3000) if quick else (1000, 10000)
    out: dict[str, Any] = {}
    async with Client(bc.client_config("cli@bench-cpu"), role="cli") as c:
        await c.connect()
        await _sequential(c, 100)
        for shape, n, run in (("sequential_1_client", n_seq, lambda: _sequential(c, n_seq)),
                              ("pipelined_1_client_256_inflight", n_pipe,
                               lambda: _pipelined(c, n_pipe, 256))):
            m0 = [counters(u) for u in endpoints]
            c0 = {k: cpu_s(p) for k, p in pids.items()}
            t0 = time.perf_counter()
            await run()
            wall = time.perf_counter() - t0
            c1 = {k: cpu_s(p) for k, p in pids.items()}
            m1 = [counters(u) for u in endpoints]
            us = {k: round((c1[k] - c0[k]) / n * 1e6) for k in pids}
            members = [{k: b[k] - a[k] for k in b} for a, b in zip(m0, m1, strict=True)]
            fsyncs = sum(m["fsyncs"] for m in members)
            txns = max(m["proposals"] for m in members)  # writes (mvcc's txns count reads too)
            out[shape] = {
                "submissions": n, "per_s": round(n / wall), "load": round(os.getloadavg()[0], 1),
                "cpu_us_per_submission": us, "cpu_us_total": sum(us.values()),
                "etcd_proposals": txns, "submissions_per_proposal": round(n / txns, 1) if txns else None,
                "etcd_puts_per_submission": round(max(m["puts"] for m in members) / n, 2),
                "wal_fsync_ms_mean": round(sum(m["fsync_s"] for m in members) / fsyncs * 1000, 2)
                if fsyncs else None}
            log(PART, f"cpu {shape}: {n / wall:.0f}/s, CPU us per submission {us}, "
                      f"{out[shape]['submissions_per_proposal']} submissions per write transaction")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = ap.parse_args(argv)
    quiet_logs()
    from xce_etcd.testing import TUNING, EtcdCluster, etcd_config

    runs: dict[str, Any] = {}
    for where, base in (("disk", None), ("tmpfs", "/dev/shm")):
        root = Path(tempfile.mkdtemp(prefix="xce-bench-etcd-", dir=base))
        etcd = EtcdCluster(root / "etcd", ["127.0.0.1"] * 3, client_port=23500, peer_port=23501)
        bc = None
        try:
            etcd.start()
            log(PART, f"etcd data on {where} ({root})")
            alone = ceiling(etcd.endpoints, args.quick)
            runs[where] = {"etcd_alone": alone}
            for transport in ("grpc", "gateway") if where == "disk" else ("grpc",):
                log(PART, f"xce on etcd, [etcd] transport = {transport!r}")
                bc = BenchCluster(root / f"xce-{transport}", controller='backend = "etcd"\n',
                                  extra=etcd_config(etcd.endpoints, f"/bench-{transport}",
                                                    transport=transport))
                bc.start()
                name = "xce_on_etcd" if transport == "grpc" else "xce_on_etcd_gateway"
                runs[where][name] = anyio.run(library, bc, args.quick)
                if where == "disk" and transport == "grpc":
                    lead = bc.cluster.primary()
                    others = [p for i, p in sorted(bc.cluster.candidates.items()) if i != lead]
                    pids = {**{f"etcd member {i}": m.pid for i, m in enumerate(etcd.members)},
                            "primary": bc.cluster.candidates[lead if lead is not None else 0].pid,
                            **{f"standby {i}": p.pid for i, p in enumerate(others, 1)},
                            "client": os.getpid()}
                    runs[where]["cpu"] = anyio.run(cpu_split, bc, etcd.endpoints, pids, args.quick)
                bc.close()
                bc = None
        finally:
            if bc is not None:
                bc.close()
            etcd.stop()
            shutil.rmtree(root, ignore_errors=True)
    result = {**meta(), "etcd_members": 3, "etcd_flags": list(TUNING),
              "etcd_alone": runs["disk"]["etcd_alone"], "xce_on_etcd": runs["disk"]["xce_on_etcd"],
              "xce_on_etcd_gateway": runs["disk"]["xce_on_etcd_gateway"], "tmpfs": runs["tmpfs"],
              "cpu": runs["disk"]["cpu"],
              "aims": {"sequential_1_client": ">= 300/s", "pipelined": ">= 5,000/s"}}
    write_result(PART, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
