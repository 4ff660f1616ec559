"""Issue #17 at scale: the cluster with 10,000 / 100,000 / 1,000,000 jobs in state.

Run from the repository root::

    python benchmarks/bench_scale.py [--sizes 10000,100000,1000000] [--only NAME,...] [--quick]

One function per measurement (``MEASUREMENTS``); ``--only`` runs some of them. Results go to
``benchmarks/results/scale.json``: ``{"meta": {...}, "results": {name: {...}}}``, and a run
replaces only the measurements (and sizes) it ran (so the controller's and the members' figures, measured
at different times, live in one file). Real processes on loopback, real SIGKILL; the jobs of
a size are parked in an inactive queue (stored and synced like any job, never dispatched),
filled by pipelined submissions (:func:`fill`).

Members (branch ``scale-members``):

- ``member_join``: the scheduler, the API server and a worker join a cluster with N jobs;
  each member's join -> state complete (its ``joined as`` log line to its replica's ``sync
  complete`` line), then the same after a SIGKILL of the primary (``re-joined as`` -> the next
  ``sync complete``, and the sync's mode: delta when the new primary still has what they
  missed), and how many times each re-joined (once).
- ``picker_pass``: in process, a picker with N jobs parked and 1,000 hosts: one cycle after
  one push (the target: <= 5 ms at 1,000,000); and the cost per dispatch with 10,000 and
  100,000 pending jobs (flat).
- ``scheduler_dispatch``: 10,000 pending jobs (their queue activated at once) onto 1,000
  simulated hosts, a real scheduler and controller: activation -> the last job RUN (target
  <= 2 s), and the picker's CPU per full cycle (its status file); ``--in-state N``: with N
  parked jobs in state besides (the 10,000 wait in queue ``normal``, inactive meanwhile).
  CPU of each process from right before the activation (the observer has synced) to the last
  RUN, and the controller's plus the scheduler's per job (what a real cluster spends on their
  hosts: the simulated hosts stand for 1,000 other machines). ``--sim-nice N`` runs the
  simulated hosts niced (all of their work still done, heartbeats included, on whatever
  CPU the controller and scheduler leave): the wall time of a cluster whose workers are
  elsewhere; the default (0) lets them compete for the two cores.
  ``XCE_SCALE_PROFILE=DIR``: py-spy samples each of its processes over the dispatch (collapsed
  stacks in DIR, to read; a profiled run's figures are not the benchmark's).
- ``apiserver``: a real API server with N jobs (``--sizes 0,...``: 0 is an empty cluster):
  ``GET /jobs?limit=100`` latency (p50 <= 10 ms at 1,000,000); ``POST /jobs`` per second with
  16 requests in flight (>= 2,000) and the CPU each costs the API server, the primary and a
  standby; ``POST /jobs`` p50 alone and while another client pages through every job
  (<= 1.2x); the API server's event-loop stalls meanwhile (its ``/metrics`` loop-lag
  histogram, scraped before and after each phase); the load generator's own CPU per POST.
  With ``XCE_PROFILE_DIR`` set, every role profiles its event loop (cProfile) and is stopped
  by SIGTERM at the end, so it writes ``<identity>-<pid>.prof`` there.
- ``cli_jobs``: ``xce jobs`` (the caller's unfinished jobs, first page) wall time with N
  jobs in state (<= 150 ms at 1,000,000).

Controller (branch ``scale-ctl``):

- ``ctl_failover``: a primary with N jobs and two hot standbys (each has logged that it
  loaded the state and follows); SIGKILL of the primary -> the first acknowledged write issued
  after it (p50 <= 100 ms, p99 <= 300 ms at 1,000,000), and what the promotion touched (its
  ``status`` ``promotion``: hot, the changes caught up).
- ``ctl_restart``: a lone controller with N jobs, SIGKILLed and, once it is gone (reaped),
  started again: start -> the first acknowledged write (<= 3 s at 1,000,000), and start ->
  every job loaded; and SIGKILL -> reaped (the kernel's teardown of its memory).
- ``ctl_load_stall``: a lone controller with N jobs started again while another process
  calls ``status`` back to back: the longest gap between answers during the cold load (the
  loop must keep answering: heartbeats, lease renewal, queries), the first write, the load.
- ``ctl_memory``: the primary's RSS per job in state (<= 1.5 KB), after N pipelined
  submissions and after a restart that loaded them; its growth per write over 20,000 more
  writes (the idempotency memory, <= 100 B a remembered write).
- ``ctl_queries``: ``jobinfo`` that matches nothing (an unknown owner), a page of the caller's
  unfinished jobs (100), and a page of a user's few jobs, round trips over a real connection.
- ``ctl_housekeeping``: in process, a state of N finished jobs and 10,000 hosts: one pass of
  the finished-job cleaner with nothing due and with a batch due, and one host-expiry pass
  with nothing due (the loop's cost per timer).

The machine is shared with other work: figures are medians and percentiles of repeated runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import (
    BENCH_USER,
    PARKED_QUEUE,
    RESULTS,
    BenchCluster,
    log,
    log_times,
    logon,
    meta,
    percentile,
    quiet_logs,
    stats,
)

PART = "scale"
SIZES = (10_000, 100_000, 1_000_000)
SMALL_USER = "carol"  # owns a handful of the parked jobs: `xce jobs -u carol` pages little
BULK_USER = pwd.getpwuid(os.getuid()).pw_name
"""Owns the other parked jobs: the benchmark's own user, whose `xce jobs` pages them (a
direct client lists the jobs of the user it authenticated as)."""
MEASUREMENTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {}


def measurement(fn: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """Register ``fn`` as a measurement named after it."""
    MEASUREMENTS[fn.__name__] = fn
    return fn


# ------------------------------------------------------------------------------ a loaded cluster
async def _fill(cfg: Any, n: int, queue: str, users: Callable[[int], str], inflight: int) -> None:
    from xcecore.client import Client

    async with Client(cfg, role="apiserver") as client:
        await client.connect()
        next_i = iter(range(n))

        async def lane() -> None:
            for i in next_i:
                await client.call("jobsubmit", {"command": "true", "user": users(i), "queue": queue,
                                                "name": f"s{i}"})

        async with anyio.create_task_group() as tg:
            for _ in range(inflight):
                tg.start_soon(lane)


def fill(bench: BenchCluster, n: int, *, queue: str = PARKED_QUEUE, inflight: int = 256,
         users: Callable[[int], str] | None = None) -> float:
    """Submit ``n`` jobs to ``queue`` with ``inflight`` pipelined submissions; seconds taken.

    Every submission is a real, durable ``jobsubmit`` (acknowledged after its commit): a
    1,000,000-job state takes about a minute here.
    """
    def default_users(i: int) -> str:
        return SMALL_USER if i % 10_000 == 0 else BULK_USER

    # A front end names the user each job is for (a direct client's jobs are its own).
    cfg = bench.client_config("apiserver@bench-fill")
    t0 = time.perf_counter()
    anyio.run(_fill, cfg, n, queue, users or default_users, inflight)
    return time.perf_counter() - t0


FILL_CACHE = Path(os.environ.get("XCE_SCALE_FILL_CACHE", Path(tempfile.gettempdir()) / "xce-scale-fills"))
"""Where :func:`filled_state` keeps one filled state directory per size (``--fresh``: refill)."""


def filled_state(size: int, fresh: bool = False) -> Path:
    """A state directory holding ``size`` parked jobs, filled once and reused.

    Filling 1,000,000 jobs by durable submissions takes minutes; every measurement that only
    needs the jobs in state starts from a copy of this directory (:func:`loaded_cluster`).
    It is filled by a lone candidate, which is then SIGKILLed (SQLite's WAL makes the copy
    what was committed), and marked complete only once the fill ended.
    """
    cache = FILL_CACHE / f"parked-{size}"
    done = cache / "FILLED"
    if done.exists() and not fresh:
        return cache / "state"
    if cache.exists():
        shutil.rmtree(cache)
    bench = BenchCluster(cache, candidates=1, api=False, hash_iterations=1000)
    try:
        bench.start()
        pid = bench.cluster.candidates[0].pid
        base = _rss_mib(pid)
        took = fill(bench, size)
        filled = {"jobs": size, "fill_s": round(took, 1), "rss_empty_mib": base,
                  "rss_after_submissions_mib": _rss_mib(pid)}
        log(PART, f"{size:,} jobs submitted in {took:.1f} s ({size / took:,.0f}/s), kept in "
                  f"{cache}: {json.dumps(filled)}")
    finally:
        bench.close()
    done.write_text(json.dumps(filled) + "\n")
    return cache / "state"


def fill_figures(size: int) -> dict[str, Any]:
    """What :func:`filled_state` measured while it filled ``size`` jobs (RSS before, after)."""
    filled_state(size)
    return dict(json.loads((FILL_CACHE / f"parked-{size}" / "FILLED").read_text()))


def copy_state(size: int, root: Path, fresh: bool = False) -> None:
    """Put a copy of the filled state of ``size`` jobs at ``root/state`` (a cluster's)."""
    src = filled_state(size, fresh)
    t0 = time.perf_counter()
    shutil.copytree(src, root / "state")
    log(PART, f"{size:,} jobs: copied the filled state in {time.perf_counter() - t0:.1f} s")


SHARED_MACHINE = "hung_timeout = 0\n"
"""On a 2-core machine shared with other test suites, a primary loading 1,000,000 jobs missed
its beats for over 2 s (and over 10 s) and was fenced; these measurements are of SIGKILLs,
not of hang detection, so the standbys do not fence."""


def loaded_cluster(size: int, root: Path, *, api: bool = True, candidates: int = 3,
                   fresh: bool = False) -> BenchCluster:
    """``candidates`` candidates on a copy of ``size`` parked jobs (1 in 10,000 of user
    carol, the rest bench's), filled once per size (:func:`filled_state`)."""
    copy_state(size, root, fresh)
    bench = BenchCluster(root, candidates=candidates, api=api, hash_iterations=1000,
                         controller=SHARED_MACHINE)
    bench.cluster.start(600)
    wait_loaded(bench)
    return bench


def wait_loaded(bench: BenchCluster, timeout: float = 900) -> float:
    """Until the primary has loaded every job (its ``status`` says ``loading`` false: a
    query waits for the load, longer than a client's liveness timeout); seconds waited."""
    from xcecore.client import SyncClient

    t0 = time.monotonic()
    with SyncClient.open(bench.client_config("cli@bench-load"), role="cli") as cli:
        while cli.call("status").get("loading"):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the primary did not load its jobs in {timeout} s")
            time.sleep(0.2)
    return time.monotonic() - t0


# ------------------------------------------------------------------------------ member_join
def _sync_lines(text: str, near: float) -> list[tuple[float, str]]:
    """(time, line) of each replica "sync complete" line of a role's log."""
    out = []
    for line in text.splitlines():
        if "sync complete (store" in line:
            times = log_times(line, "sync complete", near)
            if times:
                out.append((times[0], line))
    return out


def _member_times(text: str, near: float, after: float) -> dict[str, Any]:
    """From a role's log: its (re-)join after ``after`` and the sync that completed next."""
    joins = [t for t in log_times(text, "joined as", near) if t >= after]
    rejoins = [t for t in log_times(text, "re-joined as", near) if t >= after]
    if not joins:
        return {"joined": False}
    start = joins[0]
    syncs = [(t, line) for t, line in _sync_lines(text, near) if t >= start]
    if not syncs:
        return {"joined": True, "complete": False, "rejoins": len(rejoins)}
    t, line = syncs[0]
    return {"joined": True, "complete": True, "join_to_complete_s": round(t - start, 3),
            "mode": "delta" if " delta sync" in line else "snapshot", "rejoins": len(rejoins),
            "line": line.split(" - ", 1)[-1][:200]}


@measurement
def member_join(args: argparse.Namespace) -> dict[str, Any]:
    """Join, and re-join after a SIGKILL of the primary, at each size."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-join-{size}-"))
        bench = loaded_cluster(size, root)
        try:
            started = time.time()
            bench.start_role("scheduler")
            bench.start_role("apiserver")
            bench.start_workers(1)
            roles = ("scheduler", "apiserver", "node1")
            deadline = time.monotonic() + 600
            first: dict[str, Any] = {}
            cpu: dict[str, float] = {}  # each role's CPU seconds when its sync was seen complete
            while time.monotonic() < deadline:
                first = {r: _member_times(bench.roles[r].text(), started, started) for r in roles}
                for r, v in first.items():
                    if v.get("complete") and r not in cpu:
                        cpu[r] = _cpu_seconds(bench.roles[r].pid)
                if all(v.get("complete") for v in first.values()):
                    break
                time.sleep(0.2)
            for r, v in first.items():  # on a shared machine the wall time waits for others
                v["cpu_s_start_to_complete"] = cpu.get(r)
            log(PART, f"{size:,} jobs: joins {json.dumps({r: v.get('join_to_complete_s') for r, v in first.items()})}")
            time.sleep(2.0)  # steady: heartbeats going, nothing in flight
            killed = time.time()
            bench.cluster.kill_primary()
            again: dict[str, Any] = {}
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                again = {r: _member_times(bench.roles[r].text(), killed, killed) for r in roles}
                if all(v.get("complete") for v in again.values()):
                    break
                time.sleep(0.2)
            time.sleep(3.0)  # any second re-join would show by now
            again = {r: _member_times(bench.roles[r].text(), killed, killed) for r in roles}
            summary = {r: (v.get("join_to_complete_s"), v.get("mode"), v.get("rejoins"))
                       for r, v in again.items()}
            log(PART, f"{size:,} jobs: re-joins (s, mode, count) {json.dumps(summary)}")
            out[str(size)] = {"join": first, "rejoin_after_sigkill": again}
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------ picker_pass
def _picker(jobs: int, parked: bool, hosts: int = 1000) -> tuple[Any, list[Any]]:
    from xce_scheduler.matching import Requirements
    from xce_scheduler.picker import Picker
    from xce_scheduler.view import SchedulerView

    from xcecore.resreq import Evaluator

    view = SchedulerView()
    view.apply("sync_begin", {"mode": "snapshot", "store": "bench", "rev": 1, "since": None})
    view.apply("sync_records", {"kind": "queues", "items": [
        {"name": "normal", "priority": 30, "active": True, "open": True},
        {"name": PARKED_QUEUE, "priority": 10, "active": False, "open": True}]})
    view.apply("sync_records", {"kind": "hosts", "items": [
        {"name": f"h{i:05d}", "state": "ok", "max_slots": 16, "used_slots": 0,
         "attrs": {"hname": f"h{i:05d}", "ncpus": 16, "maxmem": 65536, "type": "X86_64"}}
        for i in range(hosts)]})
    queue = PARKED_QUEUE if parked else "normal"
    mix = ("", "select[ncpus>=8] order[r1m]", "span[hosts=1]")
    for start in range(1, jobs + 1, 1000):
        view.apply("sync_records", {"kind": "jobs", "items": [
            {"jobid": i, "state": "PEND", "queue": queue, "resreq": mix[i % 3],
             "ntasks": 1 + i % 2, "submit_time": 1e9 + i, "user": BENCH_USER}
            for i in range(start, min(start + 1000, jobs + 1))]})
    view.apply("sync_end", {"rev": 1})
    sent: list[Any] = []
    return Picker(view, Requirements(Evaluator), sent.extend, max_dispatch=1000), sent


@measurement
def picker_pass(args: argparse.Namespace) -> dict[str, Any]:
    """In process: a cycle after one push with N jobs parked; cost per dispatch vs pending."""
    from xce_scheduler.allocator import ReasonBatch

    out: dict[str, Any] = {}
    for size in args.sizes:
        picker, sent = _picker(size, parked=True)
        t0 = time.perf_counter()
        picker.cycle()  # the first cycle gives every parked job its reason, once
        first = time.perf_counter() - t0
        reasons: dict[str, str] = {}
        for item in sent:
            if isinstance(item, ReasonBatch):
                reasons.update(item.reasons)
        picker.view.apply("pend_reasons", {"reasons": reasons})  # the controller echoes them
        picker.cycle()
        samples = []
        for i in range(args.trials * 10):
            picker.view.apply("host", {"name": "h00001", "state": "ok", "max_slots": 16,
                                       "used_slots": i % 3, "attrs": {"hname": "h00001", "ncpus": 16}})
            t0 = time.perf_counter()
            picker.cycle()
            samples.append((time.perf_counter() - t0) * 1000)
        out[f"parked_{size}"] = {"after_one_push_ms": stats(samples), "first_cycle_s": round(first, 3),
                                 "looked_at": picker.status.looked, "target_ms": 5.0}
        log(PART, f"picker, {size:,} parked: {stats(samples)['p50']} ms after one push")
        del picker, sent
        gc.collect()
    for pending in (10_000, 100_000):
        per = []
        for _ in range(args.trials):
            picker, _sent = _picker(pending, parked=False)
            picker.cycle()  # warm: requirements compiled, board filled
            for jobid in list(picker.inflight()):  # answered and gone: the next 1,000 go
                picker.view.apply("job", {"jobid": jobid, "state": "RUN", "queue": "normal"})
            picker.view.apply("host", {"name": "h00000", "state": "ok", "max_slots": 16, "used_slots": 0,
                                       "attrs": {"hname": "h00000", "ncpus": 16}})
            t0 = time.perf_counter()
            proposed = picker.cycle()
            per.append((time.perf_counter() - t0) * 1e6 / max(1, proposed))
        out[f"per_dispatch_{pending}_pending"] = {"us": stats(per)}
        log(PART, f"picker, {pending:,} pending: {stats(per)['p50']} µs per dispatch")
    return out


# ------------------------------------------------------------------------------ scheduler_dispatch
@measurement
def scheduler_dispatch(args: argparse.Namespace) -> dict[str, Any]:
    """10,000 pending jobs onto 1,000 simulated hosts: activation -> the last one RUN."""
    from xcecore.client import SyncClient

    njobs, nhosts = (2_000, 200) if args.quick else (10_000, 1_000)
    in_state = args.in_state
    # With jobs in state (a copy of the parked fill), the 10,000 wait in queue "normal",
    # inactivated for the fill: activating it releases them at once, the parked stay.
    queue = "normal" if in_state else PARKED_QUEUE
    runs = []
    for trial in range(1 if args.quick else min(args.trials, 3)):
        root = Path(tempfile.mkdtemp(prefix="xce-scale-dispatch-"))
        sims: list[subprocess.Popen[bytes]] = []
        if in_state:
            bench = loaded_cluster(in_state, root, api=False, candidates=1)
        else:
            bench = BenchCluster(root, candidates=1, api=False, controller="")
        try:
            if not in_state:
                bench.start()
            per = nhosts // 2
            for k in range(2):
                # --sim-nice: the simulated hosts stand for 1,000 other machines; niced, they
                # still do all of a worker's work, but take the two cores only when the
                # controller and the scheduler leave them (as if on hosts of their own).
                sims.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).parent / "simworkers.py"), "--config",
                     str(bench.cluster.config_path), "--first", str(k * per), "--count", str(per),
                     "--prefix", "dh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    preexec_fn=(lambda: os.nice(args.sim_nice)) if args.sim_nice else None))
            for p in sims:
                assert p.stdout is not None
                line = p.stdout.readline().decode()
                if not line.startswith("ready"):
                    raise RuntimeError(f"simulated workers did not start: {line!r}")
            if in_state:
                with SyncClient.open(bench.client_config("apiserver@scale"), role="apiserver") as front:
                    front.call("queuectrl", {"queue": queue, "action": "inactivate", "user": BENCH_USER})
            fill(bench, njobs, queue=queue)
            bench.start_role("scheduler")
            bench.wait_logged("scheduler", "picker started", 120)
            # Its sync of a million parked jobs took 2 min on the shared machine, over 5 with
            # six test suites running besides.
            bench.wait_logged("scheduler", "sync complete", 300 + in_state // 1000)
            # CPU of each process over the dispatch alone (activation -> the last RUN): on a
            # shared machine the wall time waits for other work, the CPU does not.
            pids = {"controller": bench.cluster.candidates[0].pid,
                    "scheduler": bench.roles["scheduler"].pid,
                    "simworkers": [p.pid for p in sims]}
            profilers = _start_profilers(pids, trial)
            before: dict[str, float] = {}
            # Taken right before the activation (the observer has synced by then).
            start_clock = functools.partial(_cpu_into, before, pids)
            if in_state:
                last, running = _activate_and_poll(bench, queue, njobs, start_clock)
            else:
                last, running = _activate_and_watch(bench, queue, njobs, start_clock)
            during = {k: round(v - before[k], 3) for k, v in _cpu_of(pids).items()}
            _stop_profilers(profilers)
            status = json.loads((root / "scheduler.status").read_text())
            cpu = _cpu_seconds(bench.roles["scheduler"].pid)
            full = max(1, status["cycles"] - status["idle_cycles"])
            runs.append({"jobs": njobs, "hosts": nhosts, "in_state": in_state, "running": running,
                         "activate_to_last_run_s": round(last, 3),
                         "cycles": status["cycles"], "idle_cycles": status["idle_cycles"],
                         "dispatch_calls": status.get("batches"),
                         "scheduler_cpu_s": cpu,
                         "cpu_during_dispatch_s": during,
                         # what a real cluster spends on the controller's and scheduler's hosts
                         "cpu_ctl_sched_per_job_ms": round(
                             (during["controller"] + during["scheduler"]) * 1000 / njobs, 4),
                         "sim_nice": args.sim_nice,
                         "cpu_per_full_cycle_ms": round(cpu * 1000 / full, 2)})
            log(PART, f"dispatch trial {trial}: {runs[-1]}")
        finally:
            for p in sims:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            bench.close()
            if not os.environ.get("XCE_BENCH_KEEP"):  # its logs, for a look at a slow run
                shutil.rmtree(root, ignore_errors=True)
    out = {"runs": runs, "activate_to_last_run_s": stats([r["activate_to_last_run_s"] for r in runs]),
           "target_s": 2.0}
    # Variants live beside the plain run's figures (a merge keeps the others).
    if in_state:
        return {f"in_state_{in_state}": out}
    return {f"sim_nice_{args.sim_nice}": out} if args.sim_nice else out


def _start_profilers(pids: dict[str, Any], trial: int) -> list[subprocess.Popen[bytes]]:
    """With ``XCE_SCALE_PROFILE=DIR``: a py-spy sampler on each process of the dispatch (every
    thread, on-CPU samples only), writing collapsed stacks to ``DIR/dispatch-T-NAME.txt``
    when stopped. Sampling costs each process a little: profiled runs are for reading, their
    figures are not the benchmark's."""
    where = os.environ.get("XCE_SCALE_PROFILE")
    if not where:
        return []
    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("XCE_SCALE_PROFILE needs py-spy on PATH (pip install py-spy)")
    out = Path(where)
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        for i, one in enumerate(pid if isinstance(pid, list) else [pid]):
            path = out / f"dispatch-{trial}-{name}{i if isinstance(pid, list) else ''}.txt"
            procs.append(subprocess.Popen(
                [spy, "record", "--pid", str(one), "--rate", "250", "--format", "raw",
                 "--nonblocking", "--output", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached before the clock starts
    return procs


def _stop_profilers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    for p in procs:
        p.wait(30)


def _activate_and_watch(bench: BenchCluster, queue: str, njobs: int,
                        start_clock: Callable[[], None]) -> tuple[float, int]:
    """Activate ``queue``; (s from it to the last push showing a job RUN, jobs RUN), as a
    joined observer sees them (every push: only for a state without other jobs).
    ``start_clock`` runs right before the activation, once the observer has synced."""
    from benchkit import JobWatcher

    from xcecore.client import SyncClient

    watcher = JobWatcher()
    with SyncClient.open(bench.client_config("benchwatch@scale"), role="benchwatch",
                         hooks=watcher) as watch, \
            SyncClient.open(bench.client_config("apiserver@scale"), role="apiserver") as front:
        watch.join()
        time.sleep(1.0)
        start_clock()
        t0 = time.time()
        front.call("queuectrl", {"queue": queue, "action": "activate", "user": BENCH_USER})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if sum(1 for s in list(watcher.seen.values()) if "RUN" in s) >= njobs:
                break
            time.sleep(0.05)
        seen = list(watcher.seen.values())
    last = max((s["RUN"] for s in seen if "RUN" in s), default=t0)
    return last - t0, sum(1 for s in seen if "RUN" in s)


def _activate_and_poll(bench: BenchCluster, queue: str, njobs: int,
                       start_clock: Callable[[], None]) -> tuple[float, int]:
    """Activate ``queue``; (s from it until none of its jobs is unfinished but not RUN, jobs
    RUN): polled with one-job ``jobinfo`` pages every 20 ms (an observer joined to a state of
    a million jobs would spend minutes on its sync)."""
    from xcecore.client import SyncClient
    from xcecore.protocol import UNFINISHED

    waiting = sorted(s for s in UNFINISHED if s != "RUN")
    with SyncClient.open(bench.client_config("apiserver@scale"), role="apiserver") as front:
        start_clock()
        t0 = time.time()
        front.call("queuectrl", {"queue": queue, "action": "activate", "user": BENCH_USER})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if not front.call("jobinfo", {"queue": queue, "states": waiting, "limit": 1})["jobs"]:
                break
            time.sleep(0.02)
        last = time.time() - t0
        running, cursor = 0, None
        while True:  # count them (after the clock stopped)
            page = front.call("jobinfo", {"queue": queue, "state": "RUN", "limit": 1000,
                                          **({"cursor": cursor} if cursor else {})})
            running += len(page["jobs"])
            cursor = page.get("next")
            if not cursor:
                break
    return last, running


def _cpu_of(pids: dict[str, Any]) -> dict[str, float]:
    """CPU seconds so far of each named pid (a list of pids: their sum)."""
    return {name: sum(_cpu_seconds(p) for p in (pid if isinstance(pid, list) else [pid]))
            for name, pid in pids.items()}


def _cpu_into(into: dict[str, float], pids: dict[str, Any]) -> None:
    """:func:`_cpu_of` into ``into`` (a clock started from a callback)."""
    into.update(_cpu_of(pids))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)


# ------------------------------------------------------------------------------ apiserver
class RawHttp:
    """A minimal HTTP/1.1 keep-alive client (asyncio streams): the load generator must cost
    far less than the server it measures (httpx costs ~3 ms of CPU a request here)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port, self.token = host, port, token

    def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode() + body

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, limit=1 << 24)

    @staticmethod
    async def roundtrip(r: asyncio.StreamReader, w: asyncio.StreamWriter, req: bytes) -> tuple[int, bytes]:
        w.write(req)
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        low = head.lower()
        i = low.find(b"content-length:")
        if i >= 0:
            body = await r.readexactly(int(head[i + 15:head.find(b"\r\n", i)]))
        else:  # chunked (a streamed listing)
            parts = []
            while True:
                size = int((await r.readuntil(b"\r\n")).strip(), 16)
                chunk = await r.readexactly(size + 2)
                if not size:
                    break
                parts.append(chunk[:-2])
            body = b"".join(parts)
        return status, body


async def _posts(http: RawHttp, n: int, inflight: int, lat: list[float]) -> float:
    req = http.request("POST", "/xce/v1/jobs", json.dumps({"command": "true", "queue": PARKED_QUEUE}).encode())

    async def lane(count: int) -> None:
        r, w = await http.connect()
        try:
            for _ in range(count):
                t0 = time.perf_counter()
                status, body = await http.roundtrip(r, w, req)
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    raise RuntimeError(f"POST /jobs answered {status}: {body[:300]!r}")
        finally:
            w.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane(n // inflight) for _ in range(inflight)))
    return time.perf_counter() - t0


def page_tail(body: bytes) -> tuple[int, str | None]:
    """``(count, next)`` of a page's envelope, read from its end (``..."count":N,"next":X}``):
    the pager must not spend a core decoding every job it is sent."""
    i = body.rfind(b',"count":')
    if i < 0 or not body.endswith(b"}"):
        raise RuntimeError(f"GET /jobs answered no page: {body[:300]!r}")
    tail = json.loads(b"{" + body[i + 1:])
    return int(tail["count"]), tail["next"]


async def _pager(http: RawHttp, stop: asyncio.Event, pages: list[int]) -> None:
    r, w = await http.connect()
    try:
        while not stop.is_set():
            cursor = None
            while not stop.is_set():
                path = "/xce/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
                status, body = await http.roundtrip(r, w, http.request("GET", path))
                if status != 200:
                    raise RuntimeError(f"GET /jobs answered {status}: {body[:300]!r}")
                count, cursor = page_tail(body)
                pages.append(count)
                if cursor is None:
                    break
    finally:
        w.close()


class LoopLagScrape:
    """The API server's loop-lag histogram (``xce_apiserver_loop_lag_seconds`` on its
    ``/metrics``): two scrapes give a window's ticks by bucket, its worst bucket and p99."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def scrape(self) -> dict[str, float]:
        import re
        import urllib.request

        with urllib.request.urlopen(self.url, timeout=30) as r:
            text = r.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^xce_apiserver_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}

    @staticmethod
    def window(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        """Ticks in the window, the upper bound of its worst non-empty bucket and of the
        bucket holding its 99th percentile (ms), and the ticks later than 5 and 20 ms."""
        diff = [(k, after[k] - before.get(k, 0.0)) for k in after]  # cumulative, by bound
        total = diff[-1][1] if diff else 0.0
        worst = p99 = None
        prev = 0.0
        for bound, cum in diff:
            if cum > prev:
                worst = bound
            if p99 is None and total and cum >= 0.99 * total:
                p99 = bound
            prev = cum
        def ms(b: str | None) -> float | str | None:
            return b if b in (None, "+Inf") else round(float(b) * 1000, 2)
        def later(bound: str) -> float:
            return total - dict(diff).get(bound, 0.0)
        return {"ticks": int(total), "worst_le_ms": ms(worst), "p99_le_ms": ms(p99),
                "ticks_over_5ms": int(later("0.005")), "ticks_over_20ms": int(later("0.02"))}


async def _api_figures(http: RawHttp, quick: bool, lag: LoopLagScrape,
                       pids: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    r, w = await http.connect()
    lat = []
    for i in range(50 if quick else 300):
        t0 = time.perf_counter()
        status, body = await http.roundtrip(r, w, http.request("GET", "/xce/v1/jobs?limit=100"))
        if i >= 5:
            lat.append((time.perf_counter() - t0) * 1000)
        assert status == 200, body[:200]
    lat2 = []
    cursor = json.loads(body)["next"]
    for _ in range(50 if quick else 300):  # a page from the middle of the listing
        t0 = time.perf_counter()
        status, body = await http.roundtrip(
            r, w, http.request("GET", "/xce/v1/jobs?limit=100&user=" + BULK_USER + "&state=PEND"
                               + (f"&cursor={cursor}" if cursor else "")))
        lat2.append((time.perf_counter() - t0) * 1000)
    w.close()
    out["get_jobs_limit100_ms"] = stats(lat)
    out["get_jobs_limit100_filtered_ms"] = stats(lat2)
    n = 2_000 if quick else 8_000
    rates, p50s = [], []
    cpu0 = {k: _cpu_seconds(p) for k, p in pids.items()}
    own0 = time.process_time()
    posted = 0
    for _ in range(1 if quick else 3):
        lat3: list[float] = []
        took = await _posts(http, n, 16, lat3)
        posted += len(lat3)
        rates.append(len(lat3) / took)
        p50s.append(statistics.median(lat3) * 1000)
    own = time.process_time() - own0
    out["post_jobs_16_in_flight_per_s"] = stats(rates, 0)
    out["post_jobs_16_in_flight_p50_ms"] = stats(p50s)
    # CPU per POST of the API server and of the primary (and of one standby, which follows),
    # and of this process, the load generator (RawHttp), which must cost far less
    for k, p in pids.items():
        out[f"{k}_cpu_ms_per_post"] = round((_cpu_seconds(p) - cpu0[k]) * 1000 / posted, 3)
    out["loadgen_cpu_ms_per_post"] = round(own * 1000 / posted, 3)
    # One client posting alone, then the same while another pages through every job.
    posts = 400 if quick else 1000
    alone: list[float] = []
    before = lag.scrape()
    await _posts(http, posts, 1, alone)
    out["loop_lag_posting_alone"] = lag.window(before, lag.scrape())
    stop, pages = asyncio.Event(), []
    pager = asyncio.create_task(_pager(http, stop, pages))
    await asyncio.sleep(0.5)
    busy: list[float] = []
    before = lag.scrape()
    t0 = time.perf_counter()
    await _posts(http, posts, 1, busy)
    took = time.perf_counter() - t0
    out["loop_lag_while_paging"] = lag.window(before, lag.scrape())
    stop.set()
    await pager
    a, b = statistics.median(alone) * 1000, statistics.median(busy) * 1000
    out["post_jobs_p50_alone_ms"] = round(a, 3)
    out["post_jobs_p50_while_paging_ms"] = round(b, 3)
    out["post_jobs_p99_alone_ms"] = round(percentile(alone, 99) * 1000, 3)
    out["post_jobs_p99_while_paging_ms"] = round(percentile(busy, 99) * 1000, 3)
    out["while_paging_ratio"] = round(b / a, 2)
    out["pages_read_meanwhile"] = len(pages)
    out["jobs_paged_per_s_meanwhile"] = round(sum(pages) / (took + 0.5))
    return out


def _run_cheap(main: Any) -> Any:
    """Run ``main`` on uvloop when it is installed (the load generator's CPU per request is
    about half asyncio's), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@measurement
def apiserver(args: argparse.Namespace) -> dict[str, Any]:
    """A real API server with N jobs (0: an empty cluster): page latency, POST throughput
    and CPU per POST, POST while paging, the event loop's stalls meanwhile."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-api-{size}-"))
        if size:
            bench = loaded_cluster(size, root)
        else:  # the same cluster with nothing in state
            bench = BenchCluster(root, candidates=3, api=True, hash_iterations=1000,
                                 controller=SHARED_MACHINE)
            bench.cluster.start(600)
        try:
            mport = _free_port()
            bench.roles["apiserver"] = bench.cluster.start_role(
                "apiserver", f"metrics.ports={{apiserver={mport}}}")
            url = bench.api_url(120)
            import httpx

            deadline = time.monotonic() + 600
            while httpx.get(f"{url}/readyz", timeout=10).status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("the API server was not ready in 600 s")
                time.sleep(0.2)
            port = int(url.split(":")[2].split("/")[0])
            http = RawHttp("127.0.0.1", port, logon(url))
            pids = {"apiserver": bench.roles["apiserver"].pid,
                    "primary": bench.cluster.candidates[0].pid,
                    "standby": bench.cluster.candidates[1].pid}
            out[str(size)] = _run_cheap(_api_figures(http, args.quick, LoopLagScrape(mport), pids))
            out[str(size)]["rss_mib"] = _rss_mib(bench.roles["apiserver"].pid)
            log(PART, f"apiserver, {size:,} jobs: {json.dumps(out[str(size)])[:600]}")
        finally:
            if os.environ.get("XCE_PROFILE_DIR"):  # profiled: stopped by SIGTERM, so they write it
                for proc in reversed(bench.cluster.procs):
                    proc.stop(60)
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


# ------------------------------------------------------------------------------ cli_jobs
def _first_page_wall(config: Path, *args: str, whole: bool = True) -> tuple[float, float]:
    """(seconds to the first page's last line, seconds to exit) of ``xce jobs ARGS`` run as
    this benchmark's user; ``whole=False`` stops it (SIGKILL, by pid) after the first page."""
    # As on a user's machine: bytecode is cached (this workplace sets PYTHONDONTWRITEBYTECODE,
    # and compiling the CLI's modules from source cost 130 ms of each run here).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "xcecore", "--config", str(config), "jobs", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    first = None
    for lines, _ in enumerate(proc.stdout, 1):
        if lines == 101 and first is None:  # the header and the first page of 100
            first = time.perf_counter() - t0
            if not whole:
                proc.kill()
                proc.wait(60)
                return first, first
    proc.wait(600)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"xce jobs failed: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    return (first if first is not None else total), total


@measurement
def cli_jobs(args: argparse.Namespace) -> dict[str, Any]:
    """``xce jobs`` with N jobs in state: the caller's unfinished jobs."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-cli-{size}-"))
        bench = loaded_cluster(size, root, api=False)
        try:
            config = bench.cluster.config_path
            # Steady state: the standbys have loaded too (a client may ask one first), and
            # one run wrote the bytecode cache.
            _wait_standbys_loaded(bench, bench.cluster.wait_primary(60.0), {})
            _first_page_wall(config, "-u", SMALL_USER)
            small, big = [], []
            for _ in range(args.trials):
                small.append(_first_page_wall(config, "-u", SMALL_USER)[1] * 1000)
                big.append(_first_page_wall(config, whole=False)[0] * 1000)
            out[str(size)] = {"own_few_jobs_total_ms": stats(small),
                              "own_many_jobs_first_page_ms": stats(big), "target_ms": 150.0}
            log(PART, f"xce jobs, {size:,} jobs: {stats(big)['p50']} ms first page")
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------ controller
def _proc_of(bench: BenchCluster, index: int) -> Any:
    return bench.cluster.candidates[index]


def _wait_standbys_loaded(bench: BenchCluster, primary: int, marks: dict[int, int],
                          timeout: float = 600) -> None:
    """Until every standby has logged more "standby: loaded" lines than ``marks`` says (its
    count when it was started: the logs are appended to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.text().count("standby: loaded") > marks.get(i, 0)
               for i, p in bench.cluster.candidates.items() if i != primary and p.alive()):
            return
        time.sleep(0.05)
    raise RuntimeError("the standbys did not load the state in time")


async def _first_write_after(client: Any, name: str) -> float:
    """Submit one job (retried by the client library across the failover); epoch of its ack."""
    await client.call("jobsubmit", {"command": "true", "queue": PARKED_QUEUE,
                                    "name": name})
    return time.time()


async def _kill_trials(bench: BenchCluster, cfg: Any, trials: int,
                       size: int) -> tuple[list[float], list[dict[str, Any]]]:
    """``trials`` SIGKILLs of the primary, each once its standbys are hot; (first write ms,
    the new primary's ``promotion``) of each."""
    from xcecore.client import Client

    firsts: list[float] = []
    promotions: list[dict[str, Any]] = []
    marks: dict[int, int] = {}
    async with Client(cfg, role="cli") as client:
        await client.connect()
        for trial in range(trials):
            old = await anyio.to_thread.run_sync(bench.cluster.wait_primary, 60.0)
            await anyio.to_thread.run_sync(_wait_standbys_loaded, bench, old, marks)
            await _first_write_after(client, f"steady-{trial}")
            await anyio.sleep(0.3)
            victim = _proc_of(bench, old)
            t_kill = time.time()
            victim.kill()
            acked = await _first_write_after(client, f"after-{trial}")
            firsts.append((acked - t_kill) * 1000)
            st = await client.call("status")
            promotion = st.get("promotion", {})
            phases = _failover_phases(bench, old, t_kill, acked)
            if "first_keyed_commit_ms" in promotion and "promoted_to_ack_ms" in phases:
                # Of promoted -> ack: the new primary's commit of the write (as it saw it).
                phases["promoted_to_commit_ms"] = float(promotion["first_keyed_commit_ms"])
            promotions.append({**promotion, "phases": phases})
            log(PART, f"failover, {size:,} jobs: first write {firsts[-1]:.1f} ms, "
                      f"promotion {json.dumps(st.get('promotion', {}))}")
            marks[old] = victim.text().count("standby: loaded")
            bench.cluster.start_candidate(old)
            await anyio.to_thread.run_sync(bench.cluster.wait_state, old, "standby", 120.0)
    return firsts, promotions


PROMOTED = "acquired the state-dir lock; promoted to primary"


def _promoted_at(text: str, after: float, near: float) -> tuple[float, float] | None:
    """(lock acquired, promoted) epochs of the first promotion line after ``after``: the line
    is logged once promoted and says how long the promotion took ("in X ms")."""
    for line in text.splitlines():
        if PROMOTED not in line:
            continue
        times = log_times(line, PROMOTED, near)
        if not times or times[0] < after - 0.002:  # (the log's millisecond resolution)
            continue
        took = float(line.rsplit(" in ", 1)[1].split(" ms")[0])
        return times[0] - took / 1000, times[0]
    return None


def _failover_phases(bench: BenchCluster, old: int, t_kill: float, acked: float) -> dict[str, float]:
    """Where a failover's time went, from the new primary's log: SIGKILL -> it acquired the
    lock (the kernel's teardown of the old primary, then the standby's wake-up), the
    promotion itself, promoted -> the client's write acknowledged (its reconnection, the
    resent write's commit)."""
    for i, proc in bench.cluster.candidates.items():
        if i == old:
            continue
        got = _promoted_at(proc.text(), t_kill, t_kill)
        if got is not None:
            lock, promoted = got
            return {"kill_to_lock_ms": (lock - t_kill) * 1000,
                    "promotion_ms": (promoted - lock) * 1000,
                    "promoted_to_ack_ms": (acked - promoted) * 1000}
    return {}


def _heap() -> str:
    """The candidates' heap, as ``--huge-pages`` / ``--pymalloc`` / neither chose it."""
    return {"1": "huge pages", "0": "pymalloc"}.get(os.environ.get("XCE_CONTROLLER_HUGEPAGES", ""),
                                                   "default (huge pages from a 64 MiB store)")


def _phase_stats(rows: list[dict[str, float]]) -> dict[str, Any]:
    """``stats`` of each phase over the trials that logged it."""
    names = sorted({k for r in rows for k in r})
    return {k: stats(r[k] for r in rows if k in r) for k in names}


@measurement
def ctl_failover(args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL of a primary with N jobs -> the first acknowledged write issued after it."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-fo-{size}-"))
        bench = loaded_cluster(size, root, api=False)
        try:
            cfg = bench.client_config("cli@bench-failover")
            primary = bench.cluster.wait_primary(60.0)
            _wait_standbys_loaded(bench, primary, {})
            # The price of the heap's kind: every candidate's RSS with the state loaded.
            rss = [_rss_mib(p.pid) for p in bench.cluster.candidates.values() if p.alive()]
            firsts, promotions = anyio.run(_kill_trials, bench, cfg, args.trials * 4, size)
            out[str(size)] = {
                "first_write_ms": stats(firsts),
                "promotion_ms": stats(float(p.get("ms", 0)) for p in promotions),
                "promotion_how": sorted({str(p.get("how")) for p in promotions}),
                "changes_caught_up_max": max(int(p.get("changes", 0)) for p in promotions),
                "phases_ms": _phase_stats([p["phases"] for p in promotions]),
                "targets_ms": {"p50": 100.0, "p99": 300.0},
                "huge_pages": os.environ.get("XCE_CONTROLLER_HUGEPAGES") == "1",
                "heap": _heap(),
                "rss_per_job_loaded_b": round(statistics.median(rss) * 1024 * 1024 / size),
            }
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


def _ack_after_start(bench: BenchCluster, cfg: Any, started: float,
                     promotion: dict[str, Any] | None = None) -> float:
    """Seconds from ``started`` to the first acknowledged submission (retried until then);
    ``promotion``: filled with the primary's ``status`` ``promotion`` after it."""
    from xcecore.client import SyncClient

    with SyncClient.open(cfg, role="cli") as cli:
        cli.call("jobsubmit", {"command": "true", "queue": PARKED_QUEUE,
                               "name": "after-restart"})
        took = time.time() - started
        if promotion is not None:
            promotion.update(cli.call("status").get("promotion", {}))
    return took


def _restart_phases(text: str, started: float, acked: float) -> dict[str, float]:
    """Where a lone restart's time went, from the candidate's log (lines after ``started``):
    the interpreter's start and imports up to its decision to execute itself again onto huge
    pages (if it did), the second start up to the role's start, the role's imports and set-up
    up to listening, waiting for and taking the lock, the promotion (cold: the head), and
    promoted -> the client's write acknowledged (its connection back-off, the first commit)."""
    def first(needle: str, after: float) -> float | None:
        return next((t for t in log_times(text, needle, started) if t >= after - 0.002), None)

    out: dict[str, float] = {}
    at = started
    reexec = first("re-executing itself", started)
    if reexec is not None:
        out["start_to_reexec_ms"] = (reexec - started) * 1000
        at = reexec
    role = first("starting role", at)
    cand = first("candidate started", role or at)
    got = _promoted_at(text, cand or at, started)
    if role is None or cand is None or got is None:
        return out
    lock, promoted = got
    out["to_role_start_ms"] = (role - at) * 1000
    out["role_start_to_listening_ms"] = (cand - role) * 1000
    out["listening_to_lock_ms"] = (lock - cand) * 1000
    out["promotion_ms"] = (promoted - lock) * 1000
    out["promoted_to_ack_ms"] = (acked - promoted) * 1000
    return out


@measurement
def ctl_restart(args: argparse.Namespace) -> dict[str, Any]:
    """A lone controller with N jobs: restart -> first acknowledged write, and -> all loaded."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-restart-{size}-"))
        bench = loaded_cluster(size, root, api=False, candidates=1)
        firsts: list[float] = []
        loads: list[float] = []
        teardowns: list[float] = []
        phases: list[dict[str, float]] = []
        try:
            cfg = bench.client_config("cli@bench-restart")
            for _ in range(args.trials):
                proc = _proc_of(bench, 0)
                t_kill = time.time()
                proc.kill()
                # A restart (an operator's, systemd's) starts the new process once the old
                # one is gone: the kernel's teardown of a killed process's memory (it holds
                # the lock until then: ctl_failover's matter) is reported on its own.
                proc.popen.wait(120)
                teardowns.append((time.time() - t_kill) * 1000)
                seen = proc.text().count("idempotency keys in")
                started = time.time()
                bench.cluster.start_candidate(0)
                promotion: dict[str, Any] = {}
                firsts.append(_ack_after_start(bench, cfg, started, promotion) * 1000)
                proc = _proc_of(bench, 0)
                phases.append(_restart_phases(proc.text(), started, started + firsts[-1] / 1000))
                if "first_keyed_commit_ms" in promotion and "promoted_to_ack_ms" in phases[-1]:
                    # Of promoted -> ack: the primary's commit of the write (as it saw it);
                    # the rest is the client's connection back-off and round trips.
                    phases[-1]["promoted_to_commit_ms"] = float(promotion["first_keyed_commit_ms"])
                deadline = time.monotonic() + 600
                while proc.text().count("idempotency keys in") <= seen and time.monotonic() < deadline:
                    time.sleep(0.02)
                loads.append((time.time() - started) * 1000)
                log(PART, f"restart, {size:,} jobs: first write {firsts[-1]:.0f} ms, loaded by "
                          f"{loads[-1]:.0f} ms")
            out[str(size)] = {"first_write_ms": stats(firsts), "all_loaded_ms_upper_bound": stats(loads),
                              "kill_to_reaped_ms": stats(teardowns),
                              "phases_ms": _phase_stats(phases),
                              "target_ms": 3000.0,
                              "huge_pages": os.environ.get("XCE_CONTROLLER_HUGEPAGES") == "1",
                              "heap": _heap()}
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


def _pings_through_load(bench: BenchCluster, cfg: Any, started: float) -> dict[str, Any]:
    """``status`` round trips back to back from the lone candidate's start until it has
    loaded every job, one write after the first answer; the gaps between answers."""
    from xcecore.client import SyncClient

    gaps: list[float] = []
    first_write = None
    with SyncClient.open(cfg, role="cli") as cli:
        last = time.monotonic()
        while True:
            st = cli.call("status")
            now = time.monotonic()
            gaps.append((now - last) * 1000)
            if first_write is None:
                cli.call("jobsubmit", {"command": "true", "queue": PARKED_QUEUE, "name": "w"})
                first_write = (time.time() - started) * 1000
                now = time.monotonic()
            last = now
            if not st.get("loading"):
                break
    return {"gaps": gaps[1:], "first_write_ms": first_write,
            "loaded_ms": (time.time() - started) * 1000}


@measurement
def ctl_load_stall(args: argparse.Namespace) -> dict[str, Any]:
    """A lone candidate's cold load of N jobs: the longest time its loop did not answer
    (``status`` back to back from another process, all through the load)."""
    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-stall-{size}-"))
        bench = loaded_cluster(size, root, api=False, candidates=1)
        longest: list[float] = []
        p99: list[float] = []
        firsts: list[float] = []
        loads: list[float] = []
        pings = 0
        try:
            cfg = bench.client_config("cli@bench-stall")
            for _ in range(args.trials):
                proc = _proc_of(bench, 0)
                proc.kill()
                started = time.time()
                bench.cluster.start_candidate(0)
                got = _pings_through_load(bench, cfg, started)
                gaps = sorted(got["gaps"]) or [0.0]
                longest.append(gaps[-1])
                p99.append(stats(gaps)["p99"])
                firsts.append(got["first_write_ms"])
                loads.append(got["loaded_ms"])
                pings += len(gaps)
                log(PART, f"load stall, {size:,} jobs: longest {gaps[-1]:.0f} ms over {len(gaps)} "
                          f"answers, first write {firsts[-1]:.0f} ms, loaded by {loads[-1]:.0f} ms")
            out[str(size)] = {"longest_gap_ms": stats(longest), "gap_p99_ms": stats(p99),
                              "first_write_ms": stats(firsts), "loaded_ms": stats(loads),
                              "answers": pings, "aim_ms": 1500.0}
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


@measurement
def ctl_memory(args: argparse.Namespace) -> dict[str, Any]:
    """The primary's RSS per job in state, and its growth per write."""
    from xcecore.client import SyncClient

    out: dict[str, Any] = {}
    for size in args.sizes:
        filled = fill_figures(size)  # the RSS of the candidate that took the submissions
        base, after_submit = filled["rss_empty_mib"], filled["rss_after_submissions_mib"]
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-mem-{size}-"))
        bench = loaded_cluster(size, root, api=False, candidates=1)
        try:
            cfg = bench.client_config("cli@bench-mem")
            with SyncClient.open(cfg, role="cli") as cli:
                deadline = time.monotonic() + 600
                while cli.call("status").get("loading") and time.monotonic() < deadline:
                    time.sleep(0.1)
            time.sleep(1.0)
            loaded = _rss_mib(_proc_of(bench, 0).pid)
            more = 20_000
            fill(bench, more)
            grown = _rss_mib(_proc_of(bench, 0).pid)
            out[str(size)] = {
                "rss_empty_mib": base, "rss_after_submissions_mib": after_submit,
                "rss_after_restart_mib": loaded,
                "bytes_per_job_submitted": round((after_submit - base) * 1048576 / size),
                "bytes_per_job_loaded": round((loaded - base) * 1048576 / size),
                "growth_bytes_per_write": round((grown - loaded) * 1048576 / more),
                "note": "growth per write includes the job each write adds (a job record and its indexes)",
                "target_bytes_per_job": 1536,
            }
            log(PART, f"memory, {size:,} jobs: {json.dumps(out[str(size)])}")
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


@measurement
def ctl_queries(args: argparse.Namespace) -> dict[str, Any]:
    """Round trips of paged ``jobinfo`` at N jobs: nothing matching, a page of own jobs."""
    from xcecore.client import SyncClient
    from xcecore.protocol import UNFINISHED

    out: dict[str, Any] = {}
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"xce-scale-q-{size}-"))
        bench = loaded_cluster(size, root, api=False, candidates=1)
        try:
            cfg = bench.client_config("cli@bench-q")
            figures: dict[str, list[float]] = {"nothing_matching_ms": [], "own_unfinished_page_ms": [],
                                               "few_own_jobs_ms": [], "status_ms": []}
            queries: dict[str, dict[str, Any]] = {
                "nothing_matching_ms": {"owner": "nobody-at-all"},
                "own_unfinished_page_ms": {"owner": BULK_USER, "states": list(UNFINISHED), "limit": 100},
                "few_own_jobs_ms": {"owner": SMALL_USER, "states": list(UNFINISHED), "limit": 100},
            }
            with SyncClient.open(cfg, role="cli") as cli:
                for _ in range(args.trials * 20):
                    for name, q in queries.items():
                        t0 = time.perf_counter()
                        page = cli.call("jobinfo", q)
                        figures[name].append((time.perf_counter() - t0) * 1000)
                        assert "jobs" in page
                    t0 = time.perf_counter()
                    cli.call("status", {"limit": 100})
                    figures["status_ms"].append((time.perf_counter() - t0) * 1000)
            out[str(size)] = {k: stats(v) for k, v in figures.items()}
            log(PART, f"queries, {size:,} jobs: " + ", ".join(f"{k} p50 {stats(v)['p50']}" for k, v in figures.items()))
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


class _GcWatch:
    """Counts the cyclic collector's collections (and their ms) until :meth:`stop`."""

    def __init__(self) -> None:
        self.count = 0
        self.ms = 0.0
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count += 1
            self.ms += (time.perf_counter() - self._t) * 1000

    def stop(self) -> dict[str, float]:
        gc.callbacks.remove(self._cb)
        return {"count": self.count, "ms": round(self.ms, 2)}


@measurement
def ctl_housekeeping(args: argparse.Namespace) -> dict[str, Any]:
    """In process: one cleaner pass and one host-expiry pass over a state of N finished jobs."""
    from xce_controller.settings import ClusterConf
    from xce_controller.state import ClusterState

    out: dict[str, Any] = {}
    queues = [{"name": "normal", "priority": 30}]
    for size in args.sizes:
        st = ClusterState(ClusterConf(queues=queues, host_timeout=30.0))
        t0 = 1_000_000.0
        for h in range(10_000):
            st.join_worker({"hname": f"h{h:05d}", "max_slots": 4}, t0)
        gc.disable()
        try:
            for i in range(size):
                jobid = int(st.submit({"command": "true", "user": BENCH_USER}, t0).result["jobid"])
                st.control(jobid, "kill", t0 + i * 1e-4)
        finally:
            gc.enable()
        # Without this, one pass in twenty paid for a full collection over every record
        # (121-150 ms at 100,000 jobs, 560 ms at 1,000,000): the collector, not the cleaner.
        # A controller freezes what it loaded (gc.freeze after its load and at a hot
        # promotion), so its passes do not traverse the jobs; this state is frozen the same way.
        gc.collect()
        gc.freeze()
        collections = _GcWatch()
        idle_clean, due_clean, expire = [], [], []
        for _ in range(args.trials * 10):
            t = time.perf_counter()
            st.clean_finished(t0 + 10.0, 3600.0, 1000)  # nothing is an hour old
            idle_clean.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            st.expire_hosts(t0 + 1.0)  # every host seen a second ago
            expire.append((time.perf_counter() - t) * 1e3)
        for trial in range(args.trials * 2):
            t = time.perf_counter()
            ch = st.clean_finished(t0 + 7200.0, 3600.0, 1000)
            due_clean.append((time.perf_counter() - t) * 1e3)
            assert len(ch.result) == min(1000, size - trial * 1000) or size < (trial + 1) * 1000
        out[str(size)] = {"cleaner_nothing_due_ms": stats(idle_clean),
                          "cleaner_1000_due_ms": stats(due_clean),
                          "host_expiry_10000_hosts_nothing_due_ms": stats(expire),
                          "gc_collections_during_passes": collections.stop()}
        gc.unfreeze()
        log(PART, f"housekeeping, {size:,} jobs: {json.dumps({k: v.get('p50', v) for k, v in out[str(size)].items()})}")
        del st
    return out


# ------------------------------------------------------------------------------ results
def write(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Merge this run's measurements into ``results/scale.json`` (others' kept)."""
    path = RESULTS / f"{PART}.json"
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    merged = dict(old.get("results", {}))
    runs = dict(old.get("runs", {}))
    for name, value in results.items():
        before = merged.get(name)
        # Keyed by size: a run replaces the sizes it measured and keeps the others.
        merged[name] = {**before, **value} if isinstance(before, dict) else value
        runs[name] = meta()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta(), "runs": runs, "results": merged}, indent=2) + "\n")
    log(PART, f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen measurements and merge them into the results file."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="jobs in state, comma-separated")
    ap.add_argument("--only", default="", help=f"some of: {', '.join(MEASUREMENTS)}")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, few trials")
    ap.add_argument("--in-state", type=int, default=0,
                    help="scheduler_dispatch: with this many parked jobs in state (a copy of the fill)")
    ap.add_argument("--sim-nice", type=int, default=0,
                    help="scheduler_dispatch: run the simulated hosts at this nice value (they "
                         "stand for other machines: niced, they take the cores only when the "
                         "controller and scheduler leave them; default 0)")
    heap = ap.add_mutually_exclusive_group()
    heap.add_argument("--huge-pages", action="store_true",
                      help="controller candidates with XCE_CONTROLLER_HUGEPAGES=1 (docs/operator.md)")
    heap.add_argument("--pymalloc", action="store_true",
                      help="controller candidates with XCE_CONTROLLER_HUGEPAGES=0 (a large store "
                           "has its heap on huge pages by default)")
    args = ap.parse_args(argv)
    # Every process as on a site: with its bytecode cached (this workplace sets
    # PYTHONDONTWRITEBYTECODE; compiling the controller's modules cost ~0.5 s of CPU a start).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.huge_pages or args.pymalloc:  # every process inherits it; only candidates use it
        os.environ["XCE_CONTROLLER_HUGEPAGES"] = "1" if args.huge_pages else "0"
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        args.sizes, args.trials = [s for s in args.sizes if s <= 10_000] or [10_000], 2
    chosen = [n for n in args.only.split(",") if n] or list(MEASUREMENTS)
    unknown = [n for n in chosen if n not in MEASUREMENTS]
    if unknown:
        ap.error(f"unknown measurement(s) {', '.join(unknown)}; choose from {', '.join(MEASUREMENTS)}")
    quiet_logs()
    for name in chosen:  # each measurement's figures are written as soon as it is done
        log(PART, f"{name} at {', '.join(f'{s:,}' for s in args.sizes)}")
        # Each heap's figures are kept: NAME_hugepages, NAME_pymalloc, NAME (the default:
        # huge pages for a large store, pymalloc for a small one).
        suffix = "_hugepages" if args.huge_pages else "_pymalloc" if args.pymalloc else ""
        results = {name + suffix: MEASUREMENTS[name](args)}
        write(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
