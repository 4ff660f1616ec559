"""Chaos: seeded random faults on the fault test bed, checked end to end.

Run from the repository root, as root (network namespaces, nftables, tmpfs)::

    python benchmarks/bench_chaos.py [--runs 5] [--faults 30] [--seed S] [--quick]
    python benchmarks/bench_chaos.py --kinds stop-primary,kill-primary --faults 20
    python benchmarks/bench_chaos.py --backend etcd [--runs 4] [--faults 25]

Each run builds a fresh bed (``xcecore.testing.chaos``): three controller candidates on host
``ctl`` (the file backend), two workers on ``n1``/``n2``, the scheduler and the API server on
``svc``, three recorded sequential writers and an observer on ``cli``. A seeded nemesis
(``xcecore.testing.nemesis``) applies ``--faults`` faults one after another, each kind once
before any repeats, then everything is healed and the checker rules on the whole history.

Reported per fault kind: how many were applied and survived (the writes resumed after the
heal), the client-visible outage (injection -> first acknowledged write issued after it;
p50/p99) and the checker's verdict over all runs; plus jobs left unfinished at the end (a
liveness finding, not one of the checker's safety properties). Writes
``benchmarks/results/chaos.json``.

``--backend etcd``: each run builds the etcd backend's bed instead (``xce_etcd.chaos``: hosts
``h1``-``h3`` each an etcd member and a candidate, writers on ``cli``) and draws from its
fault kinds (the primary killed, frozen, powered off, cut from the etcd majority; the etcd
leader killed or frozen; a standby's host powered off). Writes ``chaos-etcd.json``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import log, meta, quiet_logs, scratch, stats, write_result
from xce_worker.containment import remove_listed

from xcecore.testing import nemesis
from xcecore.testing.faultbed import FaultBed, requirements
from xcecore.testing.nemesis import FAULTS

PART = "chaos"


def summarize(runs: list[dict[str, Any]], all_kinds: Any = FAULTS) -> dict[str, Any]:
    """Per kind: applied, survived, outage distribution (ms); overall verdict."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        for f in r["faults"]:
            by_kind[f["kind"]].append(f)
    kinds = {}
    for kind in all_kinds:
        fs = by_kind.get(kind, [])
        kinds[kind] = {
            "applied": len(fs),
            "recovered": sum(1 for f in fs if f["recovered"]),
            "no_write_after": sum(1 for f in fs if f["outage"] is None),
            "refused_writes": sum(f.get("refused", 0) for f in fs),
            "outage_ms": stats([f["outage"] * 1e3 for f in fs if f["outage"] is not None], 1),
            "held_s": stats([f["held"] for f in fs], 2),
        }
    violations: dict[str, int] = defaultdict(int)
    for r in runs:
        for prop, items in r["verdict"]["violations"].items():
            violations[prop] += len(items)
    ops: dict[str, int] = defaultdict(int)
    for r in runs:
        for k, v in r["verdict"]["counts"].items():
            ops[k] += v
    return {
        "runs": len(runs),
        "faults": sum(len(r["faults"]) for r in runs),
        "faults_survived": sum(1 for r in runs for f in r["faults"] if f["recovered"]),
        "verdict_ok": all(r["verdict"]["ok"] for r in runs),
        "violations": dict(violations),
        "operations": dict(ops),
        "unfinished_jobs": sum(len(r["unfinished"]) for r in runs),
        "by_kind": kinds,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the chaos benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs, each on a fresh bed (default 5)")
    ap.add_argument("--faults", type=int, default=30, help="faults per run (default 30)")
    ap.add_argument("--quick", action="store_true", help="1 run of 15 faults (every kind once)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the first run (then +1 per run)")
    ap.add_argument("--kinds", default="", help=f"comma-separated fault kinds (default all: {', '.join(FAULTS)})")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--hung-timeout", type=float, default=2.0)
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (logs)")
    ap.add_argument("--backend", choices=("file", "etcd"), default="file",
                    help="the controller backend (etcd: the etcd backend's bed and faults)")
    args = ap.parse_args(argv)
    missing = requirements()
    if missing:
        ap.error(missing)
    if args.backend == "etcd":
        return run_etcd(args)
    runs_n, faults_n = (1, len(FAULTS)) if args.quick else (args.runs, args.faults)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or None
    quiet_logs("ERROR")
    seed0 = args.seed if args.seed is not None else random.randrange(1 << 30)
    runs: list[dict[str, Any]] = []
    for i in range(runs_n):
        seed = seed0 + i
        with scratch("xce-bench-chaos-", PART, args.keep, f"run {i + 1}: ") as sc, FaultBed(sc.path) as bed:
            bed.at_close(partial(remove_listed, sc.path))
            report = nemesis.run(bed, seed=seed, faults=faults_n, kinds=kinds, writers=args.writers,
                                 hung_timeout=args.hung_timeout)
            if not report.verdict.ok or report.unfinished:
                sc.keep = True
                print(report.summary(), file=sys.stderr)
        runs.append({"seed": seed, "duration_s": round(report.duration, 1),
                     "verdict": report.verdict.as_dict(),
                     "faults": [f.as_dict() for f in report.faults],
                     "unfinished": [{k: j.get(k) for k in ("jobid", "name", "state", "attempt", "alloc", "command")}
                                    for j in report.unfinished],
                     "members": report.members})
        log(PART, f"run {i + 1}/{runs_n} (seed {seed}): {len(report.faults)} faults in {report.duration:.0f} s; "
                  f"{'checker OK' if report.verdict.ok else 'VIOLATIONS'}; "
                  f"{len(report.unfinished)} unfinished job(s)")
    summary = summarize(runs)
    write_result(PART, {**meta(), "runs_requested": runs_n, "faults_per_run": faults_n,
                        "first_seed": seed0, "writers": args.writers, "hung_timeout": args.hung_timeout,
                        "kinds": kinds or list(FAULTS), "summary": summary, "runs": runs})
    log(PART, f"{summary['faults_survived']}/{summary['faults']} faults survived; checker "
              f"{'OK' if summary['verdict_ok'] else 'VIOLATIONS ' + str(summary['violations'])}; "
              f"{summary['operations']}")
    return 0 if summary["verdict_ok"] else 1


def run_etcd(args: Any) -> int:
    """``--backend etcd``: seeded runs of ``xce_etcd.chaos``."""
    import time

    from xce_etcd import chaos

    runs_n, faults_n = (1, len(chaos.FAULTS)) if args.quick else (args.runs, args.faults)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or None
    quiet_logs("ERROR")
    seed0 = args.seed if args.seed is not None else random.randrange(1 << 30)
    runs: list[dict[str, Any]] = []
    for i in range(runs_n):
        seed = seed0 + i
        t0 = time.monotonic()
        with scratch("xce-bench-chaos-etcd-", PART, args.keep, f"run {i + 1}: ") as sc:
            with FaultBed(sc.path / "bed") as bed:
                bed.at_close(partial(remove_listed, sc.path))
                verdict, records = chaos.run(bed, sc.path, seed=seed, faults=faults_n, kinds=kinds,
                                             writers=args.writers)
            if not verdict.ok:
                sc.keep = True
                print(verdict.summary(), file=sys.stderr)
        duration = time.monotonic() - t0
        runs.append({"seed": seed, "duration_s": round(duration, 1), "verdict": verdict.as_dict(),
                     "faults": [f.as_dict() for f in records], "unfinished": []})
        log(PART, f"etcd run {i + 1}/{runs_n} (seed {seed}): {len(records)} faults in {duration:.0f} s; "
                  f"{'checker OK' if verdict.ok else 'VIOLATIONS'}")
    summary = summarize(runs, chaos.FAULTS)
    write_result(f"{PART}-etcd", {**meta(), "backend": "etcd", "runs_requested": runs_n,
                                  "faults_per_run": faults_n, "first_seed": seed0,
                                  "writers": args.writers, "kinds": kinds or list(chaos.FAULTS),
                                  "summary": summary, "runs": runs})
    log(PART, f"etcd: {summary['faults_survived']}/{summary['faults']} faults survived; checker "
              f"{'OK' if summary['verdict_ok'] else 'VIOLATIONS ' + str(summary['violations'])}; "
              f"{summary['operations']}")
    return 0 if summary["verdict_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
