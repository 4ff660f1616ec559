"""Benchmark of the scheduler role (plugins/scheduler).

Run from the repository root::

    python benchmarks/bench_scheduler.py [--quick] [--skip-latency]

1. **cycle**: one picker cycle over 10,000 pending jobs and 1,000 hosts (8 slots each) with a
   mix of requirements (none, select+order, rusage, span[hosts=1], span[ptile], same[rack], a
   bad one, an inactive queue), in process, no network: the first (cold) cycle of a fresh
   picker, and a second cycle over the same view (everything proposed is still in flight, so it
   re-examines the ~2,000 jobs that did not fit).
   With ``--holds``: 5,000 running jobs besides (40 % holding ``rusage[mem=2048]`` while
   they run, some with ``duration``/``decay``, 2 % exclusive): the first cycle (it takes
   every hold), a warm one, and one after 100 of them ended and 100 started
   (``results/scheduler_holds.json``).
2. **latency**: submit -> dispatch of a single job on an idle cluster of real processes (three
   controller candidates, one ``xce run scheduler``, one host joined as a worker): the time
   from sending ``jobsubmit`` to receiving the ``job`` push with state RUN, repeated.

Each figure is the median, 90th percentile and minimum of repeated trials. Writes
``benchmarks/results/scheduler.json`` and ``benchmarks/results/scheduler.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xce_scheduler.allocator import Dispatch, ReasonBatch  # noqa: E402
from xce_scheduler.matching import Requirements  # noqa: E402
from xce_scheduler.picker import Picker  # noqa: E402
from xce_scheduler.view import SchedulerView  # noqa: E402

from xcecore.resreq import Evaluator  # noqa: E402

SITE = [{"name": "gpu", "type": "bool"}, {"name": "rack", "type": "string"}]
# (requirement, ntasks, share of jobs)
MIX: list[tuple[str, int, float]] = [
    ("", 1, 0.40),
    ("select[mem>4000] order[r1m]", 1, 0.20),
    ("select[type==X86_64 && ncpus>=8] order[-mem]", 2, 0.10),
    ("select[gpu] rusage[mem=2048]", 1, 0.08),
    ("span[hosts=1]", 4, 0.08),
    ("span[ptile=2]", 4, 0.08),
    ("select[ncpus>=8] same[rack]", 2, 0.02),
    ("select[gpus]", 1, 0.02),  # a typo: bad requirement
]
INACTIVE_SHARE = 0.02
TARGETS = {"cycle_ms": 1000.0, "latency_ms": 50.0}


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def summary(values: list[float], unit: str, **extra: Any) -> dict[str, Any]:
    """median / p90 / min of ``values``."""
    return {"median": round(statistics.median(values), 3), "p90": round(pct(values, 90), 3),
            "min": round(min(values), 3), "trials": len(values), "unit": unit, **extra}


# ------------------------------------------------------------------------------ cycle
def make_state(njobs: int, nhosts: int, seed: int = 11) -> dict[str, Any]:
    """The records of a cluster: ``nhosts`` hosts (8 slots) and ``njobs`` pending jobs."""
    rnd = random.Random(seed)
    hosts = []
    for i in range(nhosts):
        name = f"node{i:05d}"
        attrs = {"hname": name, "ncpus": rnd.choice([4, 8, 16]),
                 "maxmem": rnd.choice([16384, 65536]), "type": rnd.choice(["X86_64", "ARM64"]),
                 "rack": f"r{rnd.randrange(20)}",
                 "resources": ["gpu"] if rnd.random() < 0.1 else []}
        state = "ok" if rnd.random() > 0.03 else rnd.choice(["closed", "unavail"])
        hosts.append({"name": name, "state": state, "available": state != "unavail",
                      "closed": state == "closed", "comment": "", "max_slots": 8,
                      "used_slots": rnd.choice([0, 0, 0, 2, 8]), "attrs": attrs,
                      "resvals": {"r1m": round(rnd.random() * 4, 2),
                                  "mem": float(rnd.randrange(1000, 60000))},
                      "joined_at": 1.0})
    texts = [m[0] for m in MIX]
    weights = [m[2] for m in MIX]
    ntasks = {m[0]: m[1] for m in MIX}
    jobs = []
    for jobid in range(1, njobs + 1):
        text = rnd.choices(texts, weights)[0]
        queue = "idle" if rnd.random() < INACTIVE_SHARE else rnd.choice(["normal", "priority"])
        jobs.append({"jobid": jobid, "queue": queue, "resreq": text, "ntasks": ntasks[text],
                     "state": "PEND", "submit_time": 1000.0 + jobid * 0.001,
                     "pend_reason": None, "alloc": []})
    queues = [{"name": "priority", "priority": 43, "active": True, "open": True},
              {"name": "normal", "priority": 30, "active": True, "open": True},
              {"name": "idle", "priority": 10, "active": False, "open": True}]
    cluster = {"name": "bench", "resources": SITE, "queues": ["priority", "normal", "idle"]}
    return {"cluster": [cluster], "queues": queues, "hosts": hosts, "jobs": jobs}


def feed(view: SchedulerView, state: dict[str, Any]) -> None:
    """Give ``view`` the state as one snapshot sync (docs/protocol.md), 1,000 records a frame."""
    view.apply("sync_begin", {"mode": "snapshot", "store": "bench", "rev": 1, "since": None})
    for kind, items in state.items():
        for start in range(0, len(items), 1000):
            view.apply("sync_records", {"kind": kind, "items": items[start:start + 1000]})
    view.apply("sync_end", {"rev": 1})


def bench_cycle(trials: int, njobs: int, nhosts: int) -> dict[str, Any]:
    """Cold and warm picker cycles over one synthetic cluster."""
    state = make_state(njobs, nhosts)
    cold, warm = [], []
    info: dict[str, Any] = {}
    for _ in range(trials):
        view = SchedulerView()
        feed(view, state)
        sent: list[Any] = []
        picker = Picker(view, Requirements(Evaluator), sent.extend, max_dispatch=njobs)
        gc.collect()
        t0 = time.perf_counter()
        picker.cycle()
        cold.append((time.perf_counter() - t0) * 1000)
        view.apply("host", dict(state["hosts"][0]))  # a changed view: a full cycle again
        t0 = time.perf_counter()
        picker.cycle()
        warm.append((time.perf_counter() - t0) * 1000)
        dispatches = [s for s in sent if isinstance(s, Dispatch)]
        reasons: dict[str, str] = {}
        for s in sent:
            if isinstance(s, ReasonBatch):
                reasons.update(s.reasons)
        counts: dict[str, int] = {}
        for r in reasons.values():
            key = r if not r.startswith("bad resource") else "bad resource requirement"
            counts[key] = counts.get(key, 0) + 1
        info = {"dispatches": len(dispatches),
                "tasks": sum(a["ntasks"] for d in dispatches for a in d.alloc),
                "reasons": counts}
    return {"cycle_cold": summary(cold, "ms", jobs=njobs, hosts=nhosts, **info),
            "cycle_warm": summary(warm, "ms", jobs=njobs, hosts=nhosts)}


def running_jobs(state: dict[str, Any], nrunning: int, seed: int = 12) -> list[dict[str, Any]]:
    """``nrunning`` running jobs on the state's ok hosts: 40 % hold ``rusage[mem=2048]`` (a
    tenth of those for 10 minutes, decaying), 2 % are exclusive (``-x``)."""
    rnd = random.Random(seed)
    ok = [h["name"] for h in state["hosts"] if h["state"] == "ok"]
    out = []
    for i in range(nrunning):
        kind = rnd.random()
        resreq = ("rusage[mem=2048:duration=10:decay=1]" if kind < 0.04 else
                  "rusage[mem=2048]" if kind < 0.4 else "")
        out.append({"jobid": 1_000_000 + i, "queue": "normal", "resreq": resreq, "ntasks": 1,
                    "state": "RUN", "submit_time": 900.0, "start_time": time.time(),
                    "pend_reason": None, "alloc": [{"host": rnd.choice(ok), "ntasks": 1}],
                    "exclusive": rnd.random() < 0.02, "attempt": 0})
    return out


def bench_cycle_running(trials: int, njobs: int, nhosts: int, nrunning: int,
                        churn: int) -> dict[str, Any]:
    """Cycles with ``nrunning`` running jobs whose rusage is held and some exclusive: the first
    cycle (it takes every running job's hold), a warm one (holds kept, nothing changed but a
    host), and one after ``churn`` running jobs ended and as many started (costs the change)."""
    state = make_state(njobs, nhosts)
    run = running_jobs(state, nrunning)
    state = {**state, "jobs": state["jobs"] + run}
    first, warm, churned = [], [], []
    held = 0
    for _ in range(trials):
        view = SchedulerView()
        feed(view, state)
        picker = Picker(view, Requirements(Evaluator), lambda items: None, max_dispatch=njobs)
        gc.collect()
        t0 = time.perf_counter()
        picker.cycle()
        first.append((time.perf_counter() - t0) * 1000)
        view.apply("host", dict(state["hosts"][0]))
        t0 = time.perf_counter()
        picker.cycle()
        warm.append((time.perf_counter() - t0) * 1000)
        for i, job in enumerate(run[:churn]):
            view.apply("job", {**job, "state": "DONE"})
            view.apply("job", {**job, "jobid": 2_000_000 + i})
        t0 = time.perf_counter()
        picker.cycle()
        churned.append((time.perf_counter() - t0) * 1000)
        held = len(picker.holds)
    extra = {"jobs": njobs, "hosts": nhosts, "running": nrunning}
    return {"cycle_running_first": summary(first, "ms", **extra, holding=held),
            "cycle_running_warm": summary(warm, "ms", **extra),
            "cycle_running_churn": summary(churned, "ms", **extra, churn=churn)}


# ------------------------------------------------------------------------------ latency
class _Watch:
    """Client hooks recording when each job's RUN push arrives."""

    def __init__(self) -> None:
        self.run_at: dict[int, float] = {}
        self.cond = threading.Condition()

    def reconnected(self, client: Any, candidate: Any) -> None:
        client.mark_rejoin_pending()

    def connection_state(self, client: Any, state: str, candidate: Any, detail: str) -> None:
        return None

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> None:
        if event == "job" and data.get("state") == "RUN":
            with self.cond:
                self.run_at.setdefault(data["jobid"], time.perf_counter())
                self.cond.notify_all()


def bench_latency(trials: int) -> dict[str, Any]:
    """Submit -> RUN push of one job at a time on an idle cluster of real processes."""
    from xcecore.client import SyncClient
    from xcecore.runtime import client_config, load
    from xcecore.testing import LocalCluster, wait_for

    root = Path(tempfile.mkdtemp(prefix="xce-bench-sched-"))
    cluster = LocalCluster(root, 3)
    samples: list[float] = []
    try:
        cluster.start()
        sched = cluster.start_role("scheduler")
        wait_for(lambda: "picker started" in sched.text(), 30, what="scheduler")
        _, config = load(cluster.config_path)
        watch = _Watch()
        with SyncClient.open(client_config(config, "worker@bench1"), role="worker",
                             join_attrs={"hname": "bench1", "ncpus": 1}) as worker, \
                SyncClient.open(client_config(config, "benchwatch@bench"), role="benchwatch",
                                hooks=watch) as watcher, \
                SyncClient.open(client_config(config, "cli@bench"), role="cli") as cli:
            worker.join()
            watcher.join()
            for i in range(trials + 3):
                t0 = time.perf_counter()
                jobid = cli.call("jobsubmit", {"command": "true"})["jobid"]
                with watch.cond:
                    if not watch.cond.wait_for(lambda j=jobid: j in watch.run_at, 10):
                        raise TimeoutError(f"job {jobid} was not dispatched in 10 s")
                if i >= 3:  # the first few warm up imports and caches
                    samples.append((watch.run_at[jobid] - t0) * 1000)
                worker.call("notify_job", {"jobid": jobid, "event": "finish", "exit_status": 0})
                time.sleep(0.05)  # idle cluster: let the slot-release pushes settle
    finally:
        cluster.close()
    return {"submit_to_dispatch": summary(samples, "ms", candidates=3,
                                          measured="jobsubmit sent -> job push RUN received")}


def write(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Write the JSON and Markdown results files."""
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/bench_scheduler.py" + (" --quick" if args.quick else "")
    meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": cmd,
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "mix": [{"resreq": t, "ntasks": n, "share": s} for t, n, s in MIX],
            "inactive_queue_share": INACTIVE_SHARE, "targets": TARGETS}
    meets = {}
    if "cycle_cold" in results:
        meets["cycle_ms"] = results["cycle_cold"]["median"] <= TARGETS["cycle_ms"]
    if "submit_to_dispatch" in results:
        meets["latency_ms"] = results["submit_to_dispatch"]["median"] <= TARGETS["latency_ms"]
    data = {**meta, "meets_targets": meets, "results": results}
    (out / "scheduler.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = ["# scheduler benchmark", "", f"- date: {meta['date']}", f"- command: `{cmd}`",
             f"- Python {meta['python']} ({meta['implementation']}), {meta['platform']}, "
             f"{meta['cpu_count']} cores",
             "- cycle: 10,000 pending jobs, 1,000 hosts x 8 slots, requirement mix: "
             + ", ".join(f"`{t or '(none)'}` x{n} {s:.0%}" for t, n, s in MIX)
             + f", {INACTIVE_SHARE:.0%} in an inactive queue",
             f"- targets: cycle <= {TARGETS['cycle_ms']:.0f} ms (ours), submit->dispatch <= "
             f"{TARGETS['latency_ms']:.0f} ms median (BENCHMARKS.md; Slurm 580-1720 ms)", "",
             "| measurement | median | p90 | min | unit | trials | notes |",
             "|---|---:|---:|---:|---|---:|---|"]
    for name, r in results.items():
        notes = ", ".join(f"{k}={v}" for k, v in r.items()
                          if k not in ("median", "p90", "min", "unit", "trials"))
        lines.append(f"| {name} | {r['median']} | {r['p90']} | {r['min']} | {r['unit']} | "
                     f"{r['trials']} | {notes} |")
    (out / "scheduler.md").write_text("\n".join(lines) + "\n")


def write_holds(results: dict[str, Any], args: argparse.Namespace) -> None:
    """``results/scheduler_holds.json``: the cycles with running jobs (``--holds``), with the
    load average the machine had (a shared machine's figures are pessimistic)."""
    cmd = "python benchmarks/bench_scheduler.py --holds" + (" --quick" if args.quick else "")
    data = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": cmd,
            "python": platform.python_version(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "results": results}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_holds.json").write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    """Run the benchmarks and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--skip-latency", action="store_true", help="no real processes")
    parser.add_argument("--holds", action="store_true",
                        help="only the cycles with running jobs holding rusage (writes "
                             "results/scheduler_holds.json)")
    args = parser.parse_args()
    from loguru import logger

    logger.remove()  # the picker logs per cycle; keep the figures clean
    if args.holds:
        holds = bench_cycle_running(3 if args.quick else 9, 10_000, 1_000, 5_000, 100)
        print(json.dumps(holds, indent=2))
        write_holds(holds, args)
        return
    results = bench_cycle(3 if args.quick else 9, 10_000, 1_000)
    print(json.dumps(results, indent=2))
    if not args.skip_latency:
        lat = bench_latency(10 if args.quick else 40)
        print(json.dumps(lat, indent=2))
        results.update(lat)
    write(results, args)


if __name__ == "__main__":
    main()
