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
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import library
from benchkit import BenchCluster, log, meta, quiet_logs, write_result
from etcd_ceiling import ceiling

PART = "etcd"


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
              "aims": {"sequential_1_client": ">= 300/s", "pipelined": ">= 5,000/s"}}
    write_result(PART, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
