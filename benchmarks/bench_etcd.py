"""The etcd backend's write throughput: etcd alone, then durable submissions through xce.

Run from the repository root::

    python benchmarks/bench_etcd.py [--quick]

A real three-member etcd on loopback (the operator's guide's flags; each member fsyncs its
own WAL on this one disk), then:

1. etcd alone: sequential single-key puts from one client over the JSON gateway (the rate
   an etcd-backed system gets without grouping), and the same 8 clients at once;
2. xce on the etcd backend (three candidates, ``[controller] backend = "etcd"``):
   ``bench_throughput``'s four library shapes -- one client sequential, one client with 256
   submissions in flight, 8 clients sequential, 8 clients with 32 in flight each. Every
   submission is acknowledged after the guarded etcd transaction holding it committed; the
   writer groups what is queued into one transaction (group commit).

Both with the members' data on this machine's disk (each of the three members fsyncs its
WAL on it: what a site has, but on one disk instead of three) and on tmpfs (``/dev/shm``:
no fsync; for tests only, a member that loses its power loses its data): the difference is
what the fsyncs cost. Medians over repeated runs. Writes ``benchmarks/results/etcd.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import library
from benchkit import BenchCluster, log, meta, quiet_logs, stats, write_result

PART = "etcd"


def etcd_alone(endpoints: list[str], quick: bool) -> dict[str, Any]:
    """Sequential puts per second: one client, then 8 clients on threads."""
    from xce_etcd.client import EtcdClient

    reps, n = (3, 200) if quick else (5, 1000)
    out: dict[str, Any] = {}
    for clients in (1, 8):
        rates = []
        for r in range(reps):
            cs = [EtcdClient(endpoints, timeout=5) for _ in range(clients)]

            def run(c: EtcdClient, k: int, r: int = r, each: int = n // clients) -> None:
                for i in range(each):
                    c.put(f"/bench-alone/{r}/{k}/{i}".encode(), b"x" * 200)

            threads = [threading.Thread(target=run, args=(c, k)) for k, c in enumerate(cs)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rates.append((n // clients) * clients / (time.perf_counter() - t0))
            for c in cs:
                c.close()
        out[f"puts_{clients}_clients"] = {"puts_per_s": stats(rates, 0), "puts_per_run": n, "runs": reps}
        log(PART, f"etcd alone, {clients} client(s): median {stats(rates, 0)['p50']:.0f} puts/s")
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
            alone = etcd_alone(etcd.endpoints, args.quick)
            bc = BenchCluster(root / "xce", controller='backend = "etcd"\n',
                              extra=etcd_config(etcd.endpoints, "/bench"))
            bc.start()
            runs[where] = {"etcd_alone": alone, "xce_on_etcd": anyio.run(library, bc, args.quick)}
        finally:
            if bc is not None:
                bc.close()
            etcd.stop()
            shutil.rmtree(root, ignore_errors=True)
    result = {**meta(), "etcd_members": 3, "etcd_flags": list(TUNING),
              "etcd_alone": runs["disk"]["etcd_alone"], "xce_on_etcd": runs["disk"]["xce_on_etcd"],
              "tmpfs": runs["tmpfs"],
              "aims": {"sequential_1_client": ">= 300/s", "pipelined": ">= 5,000/s"}}
    write_result(PART, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
