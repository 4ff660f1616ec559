"""Join storm, steady state and re-join storm with 1,000 and 10,000 simulated workers.

Run from the repository root::

    python benchmarks/bench_storm.py [--sizes 1000,10000] [--quick]

Per size: three controller candidates (real processes); simulated workers in separate
processes (``simworkers.py``: real ``Client``s, one TCP connection each, joined as
``worker`` with realistic attributes, 1 s heartbeat, all started at once). Measured:

- join storm: start of the worker processes -> every worker joined;
- steady state (after a few seconds of settling): the primary's CPU (psutil, averaged over
  10 s, in cores) and RSS growth per connected worker; heartbeat round-trip time of random
  workers during that window (does the controller keep up with the heartbeats?);
- re-join storm: SIGKILL the primary; per worker, kill -> its join on the new primary (the
  host's ``joined_at`` in ``hostinfo``, the controller's own clock), and the members count of
  ``status`` polled every 250 ms; plus the workers' own view (``REJOINED`` times).

Writes ``benchmarks/results/storm.json`` and ``benchmarks/results/storm.png``. Set
``XCE_BENCH_SIM_LOG=INFO`` to have the simulators log every client's connection events (to
``sim<first>.log`` beside the candidates' logs; with ``--keep``) when studying a storm.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import (
    RESULTS,
    BenchCluster,
    log,
    meta,
    quiet_logs,
    raise_fd_limit,
    stats,
    write_result,
)

PART = "storm"
HERE = Path(__file__).resolve().parent
HEARTBEAT = 1.0
LIVENESS = 4.0
# Tuning for a large cluster (the LocalCluster defaults, 0.5 s connect timeout and 0.5 s
# back-off cap, suit small test clusters). The connect timeout bounds TCP connect plus handshake;
# here it must also cover the simulators' own event loops: 2,500 clients reconnect at once in one
# process, so a client's handshake waits for its whole process's herd (a real worker has a host
# of its own). With 5 s, hundreds of clients abandoned handshakes the controller was about to
# serve and retried later; 15 s (Slurm's MessageTimeout is 10 s) avoids that waste.
CONNECT_TIMEOUT = 15.0
BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0
HOST_TIMEOUT = 10.0
JOIN_TIMEOUT = 120  # a size whose workers have not all joined by then is reported as failed


class SimProc:
    """One simworkers.py process and its line protocol."""

    def __init__(self, root: Path, config: Path, first: int, count: int, spread: float,
                 heartbeat: float = HEARTBEAT, join_timeout: float = JOIN_TIMEOUT) -> None:
        self.log = root / f"sim{first}.log"
        cmd = [sys.executable, str(HERE / "simworkers.py"), "--config", str(config),
               "--first", str(first), "--count", str(count), "--heartbeat", str(heartbeat),
               "--liveness", str(LIVENESS), "--connect-timeout", str(CONNECT_TIMEOUT),
               "--backoff-base", str(BACKOFF_BASE), "--backoff-cap", str(BACKOFF_CAP),
               "--spread", str(spread), "--join-timeout", str(join_timeout),
               "--log-level", os.environ.get("XCE_BENCH_SIM_LOG", "ERROR")]
        with self.log.open("ab") as err:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=err, text=True, start_new_session=True)
        self.count = count

    def readline(self, timeout: float) -> str:
        """The next stdout line ('' on timeout or exit)."""
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.popen.stdout.readline()),  # type: ignore[union-attr]
                             daemon=True)
        t.start()
        t.join(timeout)
        return box[0].strip() if box else ""

    def send(self, line: str) -> None:
        """Write one command line."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def kill(self) -> None:
        """SIGKILL it (by pid) and reap it."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)


def cpu_window(pids: dict[str, int], seconds: float) -> dict[str, Any]:
    """CPU (cores, averaged over ``seconds``) and RSS (MiB) of each named pid."""
    import psutil

    procs = {k: psutil.Process(p) for k, p in pids.items()}
    before = {k: p.cpu_times() for k, p in procs.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    out = {}
    for k, p in procs.items():
        after = p.cpu_times()
        used = (after.user - before[k].user) + (after.system - before[k].system)
        out[k] = {"cpu_cores": round(used / dt, 3), "rss_mib": round(p.memory_info().rss / 2**20, 1)}
    return out


def settle_after_restart(bc: BenchCluster) -> None:
    """Restart the candidate killed last, wait until it stands by, let the cluster settle."""
    down = [i for i, p in bc.cluster.candidates.items() if not p.alive()]
    for i in down:
        bc.cluster.start_candidate(i)
        bc.cluster.wait_state(i, "standby", 60)
    time.sleep(3.0)


def run_size(n: int, nprocs: int, root: Path, window: float, spread: float,
             kills: int = 1, event_loop: str = "auto", heartbeat: float = HEARTBEAT) -> dict[str, Any]:
    """One size: join storm, steady state, primary SIGKILL and re-join storm."""
    import psutil

    from xcecore.client import SyncClient

    bc = BenchCluster(root, host_timeout=HOST_TIMEOUT, cluster=f'event_loop = "{event_loop}"\n')
    sims: list[SimProc] = []
    res: dict[str, Any] = {"workers": n, "processes": nprocs, "start_spread_s": spread}
    try:
        bc.start()
        ctl = bc.cluster.candidates[0]
        time.sleep(1.0)
        first = psutil.Process(ctl.pid)
        rss0 = first.memory_info().rss
        cpu0 = sum(first.cpu_times()[:2])
        per = math.ceil(n / nprocs)
        t0 = time.time()
        for k in range(nprocs):
            count = min(per, n - k * per)
            sims.append(SimProc(root, bc.cluster.config_path, k * per, count, spread, heartbeat))
        ready = [s.readline(JOIN_TIMEOUT + 60) for s in sims]
        # The first primary's CPU for the join storm, per joined worker (None: it died in it)
        ctl_cpu_join = sum(first.cpu_times()[:2]) - cpu0 if ctl.alive() else None
        joined = sum(int(r.split()[1]) for r in ready if r.startswith("ready"))
        cpu = sum(float(r.split()[3]) for r in ready if r.startswith("ready") and len(r.split()) > 3)
        res["join_storm"] = {"joined": joined, "seconds_to_all_joined": round(time.time() - t0, 2),
                             "per_process_ready": ready,
                             # CPU the worker processes spent (start-up, connect, join, heartbeats)
                             # until ready, per worker: what simulating one joining worker costs.
                             "sim_cpu_ms_per_worker": round(cpu / n * 1e3, 2),
                             "controller_cpu_ms_per_worker": (
                                 round(ctl_cpu_join / joined * 1e3, 2)
                                 if ctl_cpu_join is not None and joined else None)}
        log(PART, f"{n}: {joined} joined in {res['join_storm']['seconds_to_all_joined']} s ({ready})")
        if joined < n:
            res["error"] = f"only {joined} of {n} workers joined"
            return res
        with SyncClient.open(bc.client_config("cli@bench-storm"), role="cli") as cli:
            time.sleep(3.0)  # settle: the join storm's commits and pushes drain
            for s in sims:
                s.send(f"probe {window}")
            pids = {"controller": ctl.pid, **{f"sim{i}": s.popen.pid for i, s in enumerate(sims)}}
            usage = cpu_window(pids, window)
            rtts = [x for s in sims for x in json.loads(s.readline(60).partition(" ")[2] or "[]")]
            st = cli.call("status")
            if not ctl.alive():  # its CPU would read 0: not a figure of anything
                res["error"] = ("the first primary died during the join storm or the steady "
                                "window (fenced by a standby: see primaries_fenced); no steady or "
                                "re-join figures")
                log(PART, f"{n}: {res['error']}")
                return res
            ctl_cpu = usage["controller"]["cpu_cores"]
            sim_cpu = sum(v["cpu_cores"] for k, v in usage.items() if k != "controller")
            rss = usage["controller"]["rss_mib"] * 2**20
            res["steady"] = {
                "window_s": window, "members": st["members"],
                "controller_cpu_cores": ctl_cpu,
                "controller_rss_mib": usage["controller"]["rss_mib"],
                "controller_rss_per_worker_kib": round((rss - rss0) / n / 1024, 2),
                "heartbeats_per_s_expected": round(n / heartbeat),
                "controller_cpu_us_per_heartbeat": round(ctl_cpu / (n / heartbeat) * 1e6, 1),
                "heartbeat_rtt_ms": stats(rtts, 2),
                "sim_processes": {k: v for k, v in usage.items() if k != "controller"},
                "sim_cpu_cores_total": round(sim_cpu, 2),
                "sim_cpu_us_per_heartbeat": round(sim_cpu / (n / heartbeat) * 1e6, 1),
                "keeps_up_on_one_core": bool(ctl_cpu < 1.0 and st["members"] == n),
            }
            log(PART, f"{n}: steady controller CPU {ctl_cpu} cores, "
                      f"{res['steady']['controller_rss_per_worker_kib']} KiB/worker, heartbeat RTT "
                      f"p50 {res['steady']['heartbeat_rtt_ms'].get('p50')} ms")
            rounds = []
            for k in range(kills):
                if k:
                    settle_after_restart(bc)
                rounds.append(failover(bc, cli, sims, n, root))
                if not rounds[-1]["all_rejoined"]:
                    break
            res["rejoin"] = rounds[-1]  # the distributions and the plot: the last round
            alls = [r["seconds_to_all_rejoined"] for r in rounds]
            res["rejoin_rounds"] = {
                "kills": len(rounds),
                "seconds_to_all_rejoined": alls,
                "median_seconds_to_all_rejoined": (
                    round(statistics.median(alls), 3) if None not in alls else None),
                "new_primary_cpu_s": [r["new_primary_cpu_s"] for r in rounds],
                "per_worker_p50_s": [r["rejoin_s"].get("p50") for r in rounds],
            }
    finally:
        res["handshakes_abandoned"] = _abandoned_handshakes(bc)
        res["primaries_fenced"] = _fences(bc)
        bc.close()  # the controller side closes first (its TIME_WAITs, not the clients' ports)
        for s in sims:
            try:
                s.send("quit")
            except (BrokenPipeError, OSError):
                pass
        grace = time.monotonic() + 10
        for s in sims:
            try:
                s.popen.wait(max(0.1, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.kill()
    return res


def _abandoned_handshakes(bc: BenchCluster) -> dict[str, int]:
    """Handshakes the candidates logged as abandoned by the client or timed out, per candidate.

    Many of them mean the clients gave up (``connect_timeout``) on connections the controller
    had not served yet, or the clients' own event loops lagged past it.
    """
    out = {}
    for i, proc in bc.cluster.candidates.items():
        text = proc.text()
        reported = sum(int(m) for m in re.findall(r"(\d+) client\(s\) closed the connection before", text))
        out[f"candidate{i}"] = reported + text.count("bad handshake from") + text.count("timed out; closing")
    return out


def _fences(bc: BenchCluster) -> list[str]:
    """Every "fenced the primary" line the candidates logged (the benchmark kills a primary
    itself only with SIGKILL, never by fencing): a standby took a primary whose event loop did
    not beat for ``hung_timeout`` for hung. On a machine the simulators saturate, that is
    how a storm fails: the busy primary is fenced, the next one gets the same storm."""
    out = []
    for i, proc in bc.cluster.candidates.items():
        out += [f"candidate{i}: " + line.partition("| ")[2][:200]
                for line in proc.text().splitlines() if "fenced the primary" in line]
    return out


def failover(bc: BenchCluster, cli: Any, sims: list[SimProc], n: int, root: Path) -> dict[str, Any]:
    """SIGKILL the primary; time every worker's re-join to the new primary."""
    import psutil

    procs = {i: psutil.Process(p.pid) for i, p in bc.cluster.candidates.items() if p.alive()}
    cpu0 = {i: sum(p.cpu_times()[:2]) for i, p in procs.items()}
    t_kill = time.time()
    old, new = bc.cluster.kill_primary(30)  # returns once a standby answers as primary
    promoted = time.time() - t_kill
    curve: list[tuple[float, int]] = []
    deadline = time.monotonic() + 180
    members = 0
    while time.monotonic() < deadline:
        try:
            members = cli.call("status", deadline=2.0)["members"]
        except Exception:  # the poller's own reconnect is not what is measured
            members = -1
        curve.append((round(time.time() - t_kill, 3), members))
        if members >= n:
            break
        time.sleep(0.25)  # status carries a member_list (about 100 bytes a member): do not flood
    # What the re-join storm cost the new primary itself (the figure that matters when every
    # worker has a host of its own; here the simulators take most of the machine).
    primary_cpu = sum(procs[new].cpu_times()[:2]) - cpu0[new]
    hosts = cli.call("hostinfo", deadline=30.0)["hosts"]
    rejoins = sorted(h["joined_at"] - t_kill for h in hosts if h["joined_at"] >= t_kill)
    client_view: list[float] = []
    for i, s in enumerate(sims):
        path = root / f"dump{i}.json"
        s.send(f"dump {path}")
        if s.readline(60) == "ok":
            rep = json.loads(path.read_text())
            client_view += [min(t for t in ts if t >= t_kill) - t_kill
                            for ts in rep["rejoined"] if any(t >= t_kill for t in ts)]
    out: dict[str, Any] = {
        "killed_candidate": old, "new_primary": new, "promotion_seen_by_probe_s": round(promoted, 3),
        "new_primary_cpu_s": round(primary_cpu, 3),
        "rejoined": len(rejoins), "all_rejoined": len(rejoins) >= n,
        "seconds_to_all_rejoined": round(rejoins[-1], 3) if len(rejoins) >= n else None,
        "rejoin_s": stats(rejoins, 3),
        "client_view_rejoin_s": stats(client_view, 3),
        "members_curve": curve,
        "rejoin_times_s": [round(x, 4) for x in rejoins],
    }
    log(PART, f"{n}: {len(rejoins)} re-joined; all by {out['seconds_to_all_rejoined']} s; "
              f"p50 {out['rejoin_s'].get('p50')} s")
    return out


def plot(sizes: dict[str, Any], path: Path) -> bool:
    """Re-join curves (workers re-joined vs seconds after the kill); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = [(k, v) for k, v in sizes.items() if v.get("rejoin")]
    if not runs:
        return False
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), squeeze=False)
    for ax, (k, v) in zip(axes[0], runs, strict=True):
        xs = v["rejoin"]["rejoin_times_s"]
        ax.step(xs, range(1, len(xs) + 1), where="post", label="joined_at on the new primary")
        curve = v["rejoin"]["members_curve"]
        ax.plot([c[0] for c in curve], [max(0, c[1]) for c in curve], ".", ms=3,
                label="status.members (polled 4/s)")
        ax.axhline(int(k), color="grey", ls="--", lw=0.8)
        ax.set_title(f"{int(k):,} simulated workers: re-join after SIGKILL of the primary")
        ax.set_xlabel("seconds after the kill")
        ax.set_ylabel("workers re-joined")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the storm benchmark for each size."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,2500,5000,10000", help="comma-separated worker counts")
    ap.add_argument("--procs", type=int, default=4, help="simulated-worker processes (large sizes)")
    ap.add_argument("--window", type=float, default=10.0, help="steady-state CPU window (s)")
    ap.add_argument("--quick", action="store_true", help="sizes 200 and 1000, 5 s window")
    ap.add_argument("--spread", type=float, default=1.0,
                    help="the workers start evenly over this many seconds (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed directory)")
    ap.add_argument("--event-loop", default="auto", choices=("auto", "asyncio"),
                    help="[cluster] event_loop of every process; 'asyncio' writes storm-asyncio.*")
    ap.add_argument("--kills", type=int, default=3,
                    help="primary SIGKILLs per size (the killed one restarts between them)")
    ap.add_argument("--heartbeat", type=float, default=HEARTBEAT,
                    help=f"the workers' heartbeat interval (default {HEARTBEAT:g} s, the shape the "
                         "targets were set with; 2 is the product's default [client] "
                         "heartbeat_interval, written to storm-hb2.json)")
    args = ap.parse_args(argv)
    quiet_logs()
    sizes = [200, 1000] if args.quick else [int(x) for x in args.sizes.split(",")]
    window = 5.0 if args.quick else args.window
    limit = raise_fd_limit()
    result: dict[str, Any] = {**meta(), "heartbeat_s": args.heartbeat, "liveness_timeout_s": LIVENESS,
                              "connect_timeout_s": CONNECT_TIMEOUT,
                              "backoff_base_s": BACKOFF_BASE, "backoff_cap_s": BACKOFF_CAP,
                              "host_timeout_s": HOST_TIMEOUT,
                              "fd_limit": limit, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="xce-bench-storm-") as tmp_dir:
        tmp = tempfile.mkdtemp(prefix="xce-bench-storm-") if args.keep else tmp_dir
        log(PART, f"logs in {tmp}")
        for n in sizes:
            nprocs = max(1, min(args.procs, math.ceil(n / 500)))
            try:
                result["sizes"][str(n)] = run_size(n, nprocs, Path(tmp) / f"n{n}", window, args.spread,
                                                   1 if args.quick else args.kills, args.event_loop,
                                                   args.heartbeat)
            except Exception as exc:  # report what failed and go on with the next size
                log(PART, f"{n}: failed: {type(exc).__name__}: {exc}")
                result["sizes"][str(n)] = {"workers": n, "error": f"{type(exc).__name__}: {exc}"}
            time.sleep(2.0)
    part = PART if args.event_loop == "auto" else f"{PART}-{args.event_loop}"
    if args.heartbeat != HEARTBEAT:
        part += f"-hb{args.heartbeat:g}"
    result["event_loop"] = args.event_loop
    result["plot"] = f"{part}.png" if plot(result["sizes"], RESULTS / f"{part}.png") else None
    ok = [int(k) for k, v in result["sizes"].items() if v.get("rejoin", {}).get("all_rejoined")]
    result["largest_size_fully_rejoined"] = max(ok) if ok else None
    result["targets"] = {"seconds_to_all_rejoined_10000": "<= 10", "controller_cpu_cores": "< 1"}
    write_result(part, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
