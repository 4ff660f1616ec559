"""Write ``benchmarks/RESULTS.md`` from the result files in ``benchmarks/results/``.

Run from the repository root (``run_all.py`` runs it last)::

    python benchmarks/report.py

Every figure comes from a results JSON written by the script named next to it (with its
command, date and core count); nothing is typed in by hand. Besides this suite's parts
(failover, storm, throughput, failfast, hotpaths, flood) it gathers the headline figures of the
other benchmarks that wrote ``results/<name>.json`` (connection, controller, resreq,
scheduler, apiserver) and links their own ``.md`` reports.
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import RESULTS, ROOT

OUT = ROOT / "benchmarks" / "RESULTS.md"
# Headline figures of the other engineers' benchmarks: (label, flattened-key glob, unit).
OTHERS: dict[str, list[tuple[str, str, str]]] = {
    "accounting": [
        ("recording, SQLite, finished jobs/s (median; aim >= 5,000)", "record.sqlite.median_jobs_per_s", "/s"),
        ("recording, PostgreSQL, finished jobs/s (median; aim >= 5,000)", "record.postgresql.median_jobs_per_s", "/s"),
        ("10M rows: `xce acct -u U --since 30d`, wall (median; aim <= 300)", "query.sqlite.cli_acct.median_ms", "ms"),
        ("10M rows: `xce hist ID`, wall (median; aim <= 100)", "query.sqlite.cli_hist.median_ms", "ms"),
        ("10M rows: `xce jobs`, wall, same install (median)", "query.sqlite.cli_jobs_baseline.median_ms", "ms"),
        ("10M rows: history.summary op, one user, 30 d (median)", "query.sqlite.acct_summary.median_ms", "ms"),
        ("10M rows: history.job op (median)", "query.sqlite.hist.median_ms", "ms"),
    ],
    "connection": [
        ("post-call check, no rejoin pending (net)", "post_call.net_ns.post_call_inline", "ns"),
        ("client calls/s, sequential (median)", "throughput.sequential_rps.median", "/s"),
        ("client calls/s, 64 in flight (median)", "throughput.pipelined_64_rps.median", "/s"),
        ("connect direct (median)", "redirect.direct_ms.median", "ms"),
        ("connect via a standby's redirect (median)", "redirect.via_standby_redirect_ms.median", "ms"),
        ("client's CPU per call on top of a bare wire client (median)",
         "throughput.client_adds_us_median.cpu", "us"),
        ("blocking SyncClient calls/s, 1 thread (median)", "blocking.one_thread_rps.median", "/s"),
        ("blocking SyncClient calls/s, 8 threads (median)", "blocking.eight_threads_rps.median", "/s"),
    ],
    "controller": [
        ("durable submits/s, sequential", "throughput.sequential_per_s", "/s"),
        ("durable submits/s, pipelined, 1 client", "throughput.pipelined_1_client_per_s", "/s"),
        ("durable submits/s, pipelined, 8 clients", "throughput.pipelined_8_clients_per_s", "/s"),
        ("SIGKILL -> first acked write (median)", "promotion.kill_to_first_acked_write_ms.median", "ms"),
        ("promotion inside the standby (median)", "promotion.promote_internal_ms.median", "ms"),
        ("state sync, 10k jobs + 1k hosts: join -> sync_end (median)",
         "full_state.join_to_state_received_ms.median", "ms"),
    ],
    "resreq": [
        ("compile, cold (median)", "results.compile_cold.median", "us"),
        ("compile, cache hit (median)", "results.compile_cache_hit.median", "us"),
        ("select over 10,000 hosts (median)", "results.select_10000.median", "ms"),
        ("select+order+rusage over 10,000 hosts (median)", "results.typical_10000.median", "ms"),
    ],
    "scheduler": [
        ("cycle, 10k jobs x 1k hosts, cold (median)", "results.cycle_cold.median", "ms"),
        ("cycle, warm (median)", "results.cycle_warm.median", "ms"),
        ("submit -> dispatch (median)", "results.submit_to_dispatch.median", "ms"),
    ],
    "scheduler_holds": [
        ("cycle, warm, 10k pending + 5k running jobs holding rusage / exclusive (median)",
         "results.cycle_running_warm.median", "ms"),
        ("cycle after 100 running ended and 100 started (median)",
         "results.cycle_running_churn.median", "ms"),
        ("first cycle, takes all 5k running jobs' holds (median)",
         "results.cycle_running_first.median", "ms"),
    ],
    "cli": [
        ("`xce jobs`, empty cluster, regular install, wall (p50; aim <= 60 ms)",
         "results.regular | xce jobs (empty cluster).p50", "ms"),
        ("`xce submit -- true`, regular install, wall (p50; aim <= 60 ms)",
         "results.regular | xce submit -- true.p50", "ms"),
        ("`xce --help`, regular install, wall (p50; aim <= 80 ms)", "results.regular | xce --help.p50", "ms"),
        ("`xce jobs`, empty cluster, editable install, wall (p50)",
         "results.editable | xce jobs (empty cluster).p50", "ms"),
        ("`xce submit -- true`, editable install, wall (p50)",
         "results.editable | xce submit -- true.p50", "ms"),
        ("`xce --help`, editable install, wall (p50)", "results.editable | xce --help.p50", "ms"),
        ("`python -c pass` floor, regular install (p50)",
         "results.regular | python -c pass (interpreter floor).p50", "ms"),
    ],
    "apiserver": [
        ("POST /jobs in-process ASGI (p50)", "in_process_asgi.post_jobs.p50_ms", "ms"),
        ("POST /jobs 503 while degraded, in-process (p50)", "in_process_asgi.post_jobs_503_degraded.p50_ms", "ms"),
        ("POST /jobs real HTTP, sequential", "real_http_loopback.post_jobs_sequential.rps", "/s"),
        ("POST /jobs real HTTP, 8 in flight", "real_http_loopback.post_jobs_8_in_flight.rps", "/s"),
        ("GET /jobs real HTTP (p50)", "real_http_loopback.get_jobs_*.p50_ms", "ms"),
    ],
}
MINE = ("failover", "storm", "throughput", "failfast", "hotpaths", "flood", "restfuzz",
        "failover-stop", "failover-stop-liveness3", "chaos", "scale", "auth", "failover-munge",
        "failover-key-sameload", "tls", "failover-tls", "failover-sameload-tls",
        "failover-stop-baseline", "failover-stop-liveness3-baseline", "arrays",
        "failover-etcd", "failover-stop-etcd", "etcd", "chaos-etcd",
        "failover-stop-liveness1-etcd", "failover-poweroff-etcd", "failover-freeze-etcd",
        "stream", "events", "tasks", "revoke", "metrics")
SHOWN_IN_MINE = ("storm-asyncio", "storm-hb2")  # read by storm_section, not listed again


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys -> leaf values (lists are leaves)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def load(name: str) -> dict[str, Any] | None:
    """``results/<name>.json`` or None."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def fmt(v: Any, digits: int = 1) -> str:
    """A number for a table cell."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    return str(v)


def provenance(d: dict[str, Any]) -> str:
    """'`command` — date, N cores' from a result file's metadata."""
    flat = flatten(d)
    def first(*keys: str) -> Any:
        return next((flat[k] for k in keys if k in flat), "?")
    return (f"`{first('command', 'meta.command')}` — {first('date', 'meta.date')}, "
            f"{first('cores', 'cpu_count', 'meta.cores')} cores")


def dist_row(label: str, s: dict[str, Any], aim: str = "", digits: int = 1) -> str:
    """A table row of a distribution (min/p50/p90/p99/max, n)."""
    cells = [fmt(s.get(k), digits) for k in ("p50", "p90", "p99", "max", "min")]
    return f"| {label} | " + " | ".join(cells) + f" | {s.get('n', 0)} | {aim} |"


DIST_HEAD = "| measure | p50 | p90 | p99 | max | min | n | aim |\n|---|---|---|---|---|---|---|---|"


def load_note(d: dict[str, Any]) -> str:
    """The machine's load during a run that recorded it ("" for one that did not)."""
    if "loadavg_1min_at_start" not in d:
        return ""
    return (f"; 1-minute load average {fmt(d['loadavg_1min_at_start'])} at the start, "
            f"{fmt(d.get('loadavg_1min_at_end'))} at the end (2 cores shared with other engineers' "
            "tests: pessimistic)")


def failover_section(d: dict[str, Any] | None) -> list[str]:
    """Failover latency section."""
    lines = ["## 1. Failover latency (`bench_failover.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/failover.json`).", ""]
    s = d["summary"]
    logs = s.get("role_rejoin_pooled_from_logs_ms", {})
    lines += [f"Source: {provenance(d)}{load_note(d)}. {d['kills']} SIGKILLs of the primary; three candidates, "
              "two workers, the scheduler and the API server as real processes; one client writing "
              f"sequentially (`jobsubmit`, {fmt(d.get('write_gap_ms'))} ms apart). Milliseconds after "
              "the SIGKILL. The kill lands while a write is outstanding (sent, not yet answered) at a random "
              "moment 0.5-1.5 s into steady writing; the writer being sequential, its first write issued "
              "after the kill goes out once that one is acknowledged.", "", DIST_HEAD,
              dist_row("standby promoted (`status.since`)", s["promotion_ms"]),
              dist_row("write in flight at the kill acknowledged", s["inflight_ack_ms"]),
              dist_row("first write issued after the kill acknowledged", s["first_write_ms"],
                       "median ≤ 100, p99 ≤ 300"),
              dist_row("every role re-joined (last of 4)", s["all_rejoined_ms"], "p50 ≤ 300, p99 ≤ 1000"),
              dist_row("a role re-joined (all roles pooled)", s["role_rejoin_pooled_ms"], "median ≤ 200")]
    for name, rs in s["role_rejoin_ms"].items():
        lines.append(dist_row(f"&nbsp;&nbsp;{name} re-joined", rs))
    lines += ["", f"Re-joins not seen within 30 s: {s.get('missing_rejoins', 0)}. Jobs in the state at "
              f"the end: {fmt(d.get('jobs_in_state_at_end'))}. Re-connect and re-join are the core's own "
              f"(client settings: {d.get('client_settings')}). Re-join times come from: "
              f"{', '.join(s.get('rejoin_source', []))}; cross-check from the roles' 're-joined as' log "
              f"lines (ms timestamps), all roles pooled: p50 {fmt(logs.get('p50'))} ms, "
              f"p99 {fmt(logs.get('p99'))} ms.", ""]
    growth = s.get("state_growth")
    if growth:
        f, last = growth["first_tenth"], growth["last_tenth"]
        lines += [f"The state grows during the run (the writer's jobs): over the first {f['kills']} kills "
                  f"({fmt(int(f['jobs_median'] or 0))} jobs) promotion took {fmt(f['promotion_ms_median'])} ms and the "
                  f"first write {fmt(f['first_write_ms_median'])} ms (medians); over the last {last['kills']} "
                  f"({fmt(int(last['jobs_median'] or 0))} jobs) {fmt(last['promotion_ms_median'])} ms and "
                  f"{fmt(last['first_write_ms_median'])} ms: a promoting standby loads the whole state.", ""]
    if d.get("plot"):
        lines += ["![failover latency](results/failover.png)", ""]
    fw = s["first_write_ms"]
    lines += ["Compared with the peers in `/work/shared/BENCHMARKS.md` (kill -> first acknowledged "
              "write issued after the kill; peers measured on the same kind of machine):", "",
              "| system | median | min-max |", "|---|---|---|",
              f"| **xce** (this run, n={fw.get('n')}) | {fmt(fw.get('p50'))} ms | "
              f"{fmt(fw.get('min'))}-{fmt(fw.get('max'))} ms |"]
    for name, med, lo, hi in d.get("peers_first_write_s", []):
        lines.append(f"| {name} | {med * 1000:,.0f} ms | {lo * 1000:,.0f}-{hi * 1000:,.0f} ms |")
    return [*lines, ""]


def storm_section(d: dict[str, Any] | None) -> list[str]:
    """Join storm / steady state / re-join storm section."""
    lines = ["## 2. Join storm, steady state and re-join storm (`bench_storm.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/storm.json`).", ""]
    lines += [f"Source: {provenance(d)}. Simulated workers: real `Client`s (one TCP connection each) "
              f"in separate processes, heartbeat {d['heartbeat_s']} s, liveness {d['liveness_timeout_s']} s, "
              f"connect timeout {d['connect_timeout_s']} s, back-off base {d.get('backoff_base_s')} s / cap "
              f"{d.get('backoff_cap_s')} s; controller `host_timeout` {d['host_timeout_s']} s. A size whose "
              "workers have not all joined within 120 s is reported as failed (the rest of its row is empty). "
              "The controller, the standbys and the worker processes share the machine's cores.", "",
              "| measure | " + " | ".join(f"{int(k):,} workers" for k in d["sizes"]) + " |",
              "|---|" + "---|" * len(d["sizes"])]
    rows: list[tuple[str, Any]] = [
        ("worker processes", lambda v: v.get("processes")),
        ("workers started evenly over (s)", lambda v: v.get("start_spread_s")),
        ("join storm: workers joined", lambda v: v.get("join_storm", {}).get("joined")),
        ("join storm: all joined (s; or when the 120 s limit was hit)",
         lambda v: v.get("join_storm", {}).get("seconds_to_all_joined")),
        ("join storm: worker processes' CPU per worker until ready (ms)",
         lambda v: v.get("join_storm", {}).get("sim_cpu_ms_per_worker")),
        ("join storm: the first primary's CPU per joined worker (ms)",
         lambda v: v.get("join_storm", {}).get("controller_cpu_ms_per_worker")),
        ("join storm: primaries fenced by a standby (a busy primary taken for hung)",
         lambda v: len(v["primaries_fenced"]) if "primaries_fenced" in v else None),
        ("steady: controller CPU (cores, 1 = one core)", lambda v: v.get("steady", {}).get("controller_cpu_cores")),
        ("steady: controller CPU per heartbeat (µs)",
         lambda v: v.get("steady", {}).get("controller_cpu_us_per_heartbeat")),
        ("steady: controller RSS (MiB)", lambda v: v.get("steady", {}).get("controller_rss_mib")),
        ("steady: controller RSS per connected worker (KiB)",
         lambda v: v.get("steady", {}).get("controller_rss_per_worker_kib")),
        ("steady: heartbeat RTT p50 / p99 (ms)", lambda v: _pair(v.get("steady", {}).get("heartbeat_rtt_ms"))),
        ("steady: worker processes' CPU (cores, total)", lambda v: v.get("steady", {}).get("sim_cpu_cores_total")),
        ("steady: worker processes' CPU per heartbeat (µs)",
         lambda v: v.get("steady", {}).get("sim_cpu_us_per_heartbeat")),
        ("controller keeps up on one core (CPU < 1 and all members joined)",
         lambda v: v.get("steady", {}).get("keeps_up_on_one_core")),
        ("after SIGKILL: workers re-joined (last kill)", lambda v: v.get("rejoin", {}).get("rejoined")),
        ("after SIGKILL: all re-joined after (s), median of the kills — target ≤ 10 s at 10,000",
         lambda v: v.get("rejoin_rounds", {}).get("median_seconds_to_all_rejoined",
                                                  v.get("rejoin", {}).get("seconds_to_all_rejoined"))),
        ("after SIGKILL: all re-joined after (s), each kill",
         lambda v: ", ".join(fmt(x, 2) for x in v["rejoin_rounds"]["seconds_to_all_rejoined"])
         if v.get("rejoin_rounds") else None),
        ("after SIGKILL: the new primary's CPU for the whole re-join (s), each kill",
         lambda v: ", ".join(fmt(x, 2) for x in v["rejoin_rounds"]["new_primary_cpu_s"])
         if v.get("rejoin_rounds") else None),
        ("per-worker re-join p50 / p90 / p99 (s), last kill",
         lambda v: _triple(v.get("rejoin", {}).get("rejoin_s"))),
        ("per-worker re-join, workers' own view p50 / p99 (s)",
         lambda v: _pair(v.get("rejoin", {}).get("client_view_rejoin_s"))),
        ("handshakes abandoned or timed out (all candidates, whole run)",
         lambda v: sum(v.get("handshakes_abandoned", {}).values()) if v.get("handshakes_abandoned") else None),
        ("error", lambda v: v.get("error")),
    ]
    for label, get in rows:
        vals = [get(v) for v in d["sizes"].values()]
        if all(x is None for x in vals):
            continue
        lines.append(f"| {label} | " + " | ".join(fmt(x, 2) for x in vals) + " |")
    lines += ["", f"Largest size whose workers all re-joined: {fmt(d.get('largest_size_fully_rejoined'))}.", ""]
    lines += _loop_comparison(d)
    lines += _default_heartbeat(d)
    if d.get("plot"):
        lines += ["![re-join curve](results/storm.png)", ""]
    return lines


def _loop_comparison(d: dict[str, Any]) -> list[str]:
    """One line per size also run on the standard asyncio loop (``results/storm-asyncio.json``)."""
    path = RESULTS / "storm-asyncio.json"
    if not path.exists():
        return []
    other = json.loads(path.read_text())
    out = []
    for size, v in other.get("sizes", {}).items():
        mine = d["sizes"].get(size, {})
        if not v.get("rejoin_rounds") or not mine.get("rejoin_rounds"):
            if v.get("join_storm") and mine.get("join_storm"):  # a join storm that did not finish
                a, b = v["join_storm"], mine["join_storm"]
                out.append(
                    f"- {int(size):,} workers on the standard asyncio event loop instead of uvloop "
                    f"(`[cluster] event_loop = \"asyncio\"`; {provenance(other)}): "
                    f"{fmt(a.get('joined'))} joined in {fmt(a.get('seconds_to_all_joined'), 2)} s, "
                    f"the first primary's CPU {fmt(a.get('controller_cpu_ms_per_worker'), 2)} ms per "
                    f"joined worker, against {fmt(b.get('joined'))} in "
                    f"{fmt(b.get('seconds_to_all_joined'), 2)} s and "
                    f"{fmt(b.get('controller_cpu_ms_per_worker'), 2)} ms above.")
            continue
        out.append(
            f"- {int(size):,} workers on the standard asyncio event loop instead of uvloop "
            f"(`[cluster] event_loop = \"asyncio\"`; {provenance(other)}): all re-joined after "
            f"{fmt(v['rejoin_rounds']['median_seconds_to_all_rejoined'], 2)} s (median of "
            f"{v['rejoin_rounds']['kills']} kills) against "
            f"{fmt(mine['rejoin_rounds']['median_seconds_to_all_rejoined'], 2)} s above; controller "
            f"{fmt(v['steady']['controller_cpu_us_per_heartbeat'], 1)} µs per heartbeat against "
            f"{fmt(mine['steady']['controller_cpu_us_per_heartbeat'], 1)} µs.")
    return [*out, ""] if out else []


def _default_heartbeat(d: dict[str, Any]) -> list[str]:
    """One line per size also run at the product's default 2 s heartbeat
    (``results/storm-hb2.json``, ``bench_storm.py --heartbeat 2``)."""
    path = RESULTS / "storm-hb2.json"
    if not path.exists():
        return []
    other = json.loads(path.read_text())
    out = []
    for size, v in other.get("sizes", {}).items():
        join, steady = v.get("join_storm", {}), v.get("steady", {})
        rounds = v.get("rejoin_rounds", {})
        out.append(
            f"- {int(size):,} workers at the product's default heartbeat of "
            f"{other.get('heartbeat_s')} s (`[client] heartbeat_interval`; {provenance(other)}): "
            f"{fmt(join.get('joined'))} joined in {fmt(join.get('seconds_to_all_joined'), 2)} s; "
            f"steady controller CPU {fmt(steady.get('controller_cpu_cores'), 2)} cores, "
            f"{fmt(steady.get('controller_cpu_us_per_heartbeat'), 1)} µs per heartbeat; all "
            f"re-joined after {fmt(rounds.get('median_seconds_to_all_rejoined'), 2)} s"
            + (f"; {v['error']}" if v.get("error") else "") + ".")
    return [*out, ""] if out else []


def _pair(s: dict[str, Any] | None) -> str | None:
    return None if not s or not s.get("n") else f"{fmt(s['p50'], 2)} / {fmt(s['p99'], 2)}"


def _triple(s: dict[str, Any] | None) -> str | None:
    return None if not s or not s.get("n") else f"{fmt(s['p50'], 2)} / {fmt(s['p90'], 2)} / {fmt(s['p99'], 2)}"


def throughput_section(d: dict[str, Any] | None) -> list[str]:
    """Throughput section."""
    lines = ["## 3. Throughput (`bench_throughput.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/throughput.json`).", ""]
    lines += [f"Source: {provenance(d)}. Every submission is acknowledged after its durable commit. "
              "Rates are per run; the table gives the median and range over the runs.", "",
              "| measure | median | min-max | runs | aim / peer |", "|---|---|---|---|---|"]
    aims = {"sequential_1_client": "≥ 1,000/s (Slurm CLI 101-105/s)",
            "pipelined_1_client_256_inflight": "≥ 10,000/s",
            "pipelined_8_clients_32_inflight": "≥ 10,000/s"}
    for name, v in d.get("library", {}).items():
        s = v["jobs_per_s"]
        lines.append(f"| library: {name.replace('_', ' ')} (jobs/s) | {fmt(s['p50'])} | "
                     f"{fmt(s['min'])}-{fmt(s['max'])} | {v['runs']} | {aims.get(name, '')} |")
    for name, v in d.get("rest", {}).items():
        s = v["jobs_per_s"]
        lines.append(f"| REST `POST /jobs`: {name.replace('_', ' ')} (jobs/s) | {fmt(s['p50'])} | "
                     f"{fmt(s['min'])}-{fmt(s['max'])} | {v['runs']} | |")
    disp = d.get("dispatch")
    if disp:
        lines += ["", "Dispatch end to end (2 workers x 4 slots, the scheduler; trivial `true` jobs; the "
                  "bursts run with the throughput runs' jobs parked in an inactive queue):", "",
                  DIST_HEAD,
                  dist_row("submit -> RUN push seen (ms)", disp["submit_to_run_ms"], "≤ 50 median (Slurm 1.72 s)"),
                  dist_row("submit -> started on the worker (ms, controller clock)", disp["submit_to_started_ms"]),
                  dist_row("submit -> DONE push seen (ms)", disp["submit_to_done_ms"]),
                  dist_row(f"bursts of {disp['burst_jobs']}: jobs completed per second", disp["completed_per_s"],
                           "≥ 100 (Slurm 0.6-2.1 at 2 slots)"),
                  "", f"Burst jobs that did not end DONE: {disp.get('burst_jobs_not_done')}."]
    completed = d.get("completed") or {}
    if completed:
        lines += ["", "Trivial jobs completed per second on a fresh cluster (bursts submitted at once; "
                  "details in [throughput.md](results/throughput.md)):", "", DIST_HEAD]
        for key, aim in (("2_slots", "≥ 100 (Slurm 0.6, tuned 2.1)"), ("8_slots", "")):
            c = completed.get(key)
            if c:
                lines.append(dist_row(f"{c['slots']} slots, bursts of {c['burst_jobs']}: jobs/s", c["jobs_per_s"], aim))
        rest = d.get("rest", {}).get("sequential_1_http_client", {}).get("latency_ms")
        if rest:
            lines += ["", DIST_HEAD, dist_row("REST `POST /jobs` latency, sequential (ms)", rest)]
    return [*lines, ""]


def failfast_section(d: dict[str, Any] | None) -> list[str]:
    """Fail-fast section."""
    lines = ["## 4. Fail-fast while degraded (`bench_failfast.py`)", ""]
    if d is None or "first_write_after_kill_ms" not in d:
        return [*lines, "Not run yet (no current `results/failfast.json`).", ""]
    rec = d["recovery"]
    return [*lines, f"Source: {provenance(d)}. Every candidate SIGKILLed, {d['trials']} times; the "
            f"API server's breaker (grace {fmt(d['grace_s'], 2)} s) follows its client's link, which "
            "the heartbeats keep probing. Each request is timed from a keep-alive HTTP client "
            "(client overhead included).", "", DIST_HEAD,
            dist_row("first `POST /jobs` right after the kills -> 503 (ms)", d["first_write_after_kill_ms"],
                     "no first slow write (was 1,400-2,300)", 1),
            dist_row("kill -> `/readyz` 503, no write sent (ms)", d["kill_to_readyz_503_ms"], "", 1),
            dist_row(f"`POST /jobs` -> 503 while degraded (ms), {d['window_s']:g} s back to back",
                     d["latency_503_ms"], "p99 ≤ 5", 3),
            dist_row("candidate restarted -> `/readyz` 200 (s)", rec["readyz_200_after_primary_s"], "", 3),
            dist_row("candidate restarted -> first write accepted (s)", rec["first_write_ok_after_primary_s"], "", 3),
            "", f"Writes over 50 ms in the window: {d['slow_over_50ms']} (the old degraded window "
            f"made one write every ~6.5 s take 1.4-2.3 s); first-write answers: "
            f"{d['first_write_status']}; non-503 answers in the window: {d['non_503_answers'] or 'none'}.", ""]


def hotpaths_section(d: dict[str, Any] | None) -> list[str]:
    """Hot paths section."""
    lines = ["## 5. Hot paths (`bench_hotpaths.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/hotpaths.json`).", ""]
    pc, hk, rq = d["post_call"], d["hook_call"], d["resreq_select_10000"]
    return [*lines, f"Source: {provenance(d)}.", "", DIST_HEAD,
            dist_row("post-call check, no rejoin pending, inline (ns, net of empty loop)",
                     pc["inline_check"]["ns_net"]),
            dist_row("`Client.rejoin_due(op)` method (ns, net)", pc["rejoin_due_method"]["ns_net"]),
            dist_row(f"pluggy hook call, {hk['implementations']} implementation (µs)", hk["pluggy_hook_us"],
                     "~4 µs reference", 3),
            dist_row("same through the PluginManager facade (µs)", hk["plugin_manager_facade_us"], "", 3),
            dist_row(f"resreq select over {rq['hosts']:,} hosts, select only (ms; "
                     f"{rq['select_only']['matched']} match)", rq["select_only"]["ms"], "3-5 ms generated code", 3),
            dist_row("resreq select + order + rusage over 10,000 hosts (ms)", rq["select_order_rusage"]["ms"], "", 3),
            *([dist_row(f"controller edge: `parse_request` + `check_call`, {op} (µs)", v["us"], "", 3)
               for op, v in d.get("controller_edge", {}).items()]),
            "", f"Evaluator: `{rq['evaluator']}`. The controller edge is the whole per-request "
            "validation (envelope, generic bound, role, join, the op's typed schema); a heartbeat "
            "costs about 25-30 µs of controller CPU in all (section 2).", ""]


def restfuzz_section(d: dict[str, Any] | None) -> list[str]:
    """REST conformance section."""
    lines = ["## 7. REST conformance under schemathesis (`bench_restfuzz.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/restfuzz.json`).", ""]
    sc = d["status_classes"]
    return [*lines, f"Source: {provenance(d)}. The schemathesis CLI (every check, coverage and "
            "fuzzing phases, valid and invalid data) against a real API server and three real "
            f"candidates over HTTP, {d['examples_per_operation']} examples per operation and phase, "
            f"{d['operations_tested']} operations.", "",
            "| measure | value | aim |", "|---|---|---|",
            f"| cases generated | {fmt(d['cases'])} | |",
            f"| responses | {fmt(d['responses'])} (2xx {fmt(sc['2xx'])}, 4xx {fmt(sc['4xx'])}) | |",
            f"| responses with status 5xx | {fmt(d['responses_5xx'])} | 0 (was ~550 in ~60,000) |",
            f"| cases with a failed check (schema violations among them) | {fmt(d['cases_with_failures'])} "
            f"| 0 (was 11 operations violating their response schema) |",
            f"| API server lost its controller connection | {fmt(d['apiserver_lost_controller_connection'])} "
            "| 0 (a 17 MiB body caused 10 reconnects; now 413 at the edge) |",
            "", f"Statuses: {d['statuses']}; failures by check: {d['failures_by_check'] or 'none'}; "
            f"{fmt(d['seconds'])} s.", ""]


def flood_section(d: dict[str, Any] | None) -> list[str]:
    """Memory under clients that never read (bench_flood.py)."""
    lines = ["## 6. Memory under clients that never read (`bench_flood.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/flood.json`).", ""]
    sc = d["scenarios"]
    first = next(iter(sc.values()))["runs"][0]
    lines += [f"Source: {provenance(d)}. A controller process holding {first['jobs']:,} jobs of ~2 KB "
              f"(one `jobinfo` reply: {first['jobinfo_reply_mb']} MB); {first['clients']} connections "
              "flood it and never read: `jobinfo` requests, `join`s as an API server (each answered "
              "with the full state), or joined members that never read their pushes (64 KB each). "
              "*Bounded*: the default `[controller]` bounds (`max_unsent_bytes` 32 MiB: reading "
              "stops at half, a member is dropped past it; `stall_timeout` 30 s). *Bounds off*: only "
              "the count bounds the controller had before (4,096 replies, 10,000 pushes), stopped "
              "when the controller's RSS passes the cap. Meanwhile another client calls `hello` and "
              "`jobinfo` (limit 3) in a loop (a call that takes 5 s counts as a failure).", "",
              "| scenario | controller RSS peak, MB (median) | growth, MB | stopped at the cap | "
              "flood ran, s (median) | other client p50 / p99, ms (median) | other client failures | runs |",
              "|---|---|---|---|---|---|---|---|"]
    for name, v in sc.items():
        secs = sorted(r["seconds"] for r in v["runs"])
        lines.append(
            f"| {name} | {fmt(v['rss_peak_mb'].get('median'))} | {fmt(v['rss_growth_mb'].get('median'))} | "
            f"{v['stopped_at_rss_cap']} of {len(v['runs'])} | {fmt(secs[len(secs) // 2])} | "
            f"{fmt(v['other_client_p50_ms'].get('median'), 2)} / "
            f"{fmt(v['other_client_p99_ms'].get('median'), 2)} | {v['other_client_failures']} | {len(v['runs'])} |")
    return [*lines, "", "Bounded, each flooding connection holds at most about `max_unsent_bytes` "
            "(plus what the kernel's socket buffers take, up to `net.ipv4.tcp_wmem`'s maximum), "
            "whatever it sends; it is logged once when its requests stop being read and once when "
            "it is dropped.", ""]


def hung_section(runs: list[tuple[str, dict[str, Any] | None]],
                 baselines: dict[str, dict[str, Any] | None] | None = None) -> list[str]:
    """SIGSTOP of the primary on the file backend (``bench_failover.py --fault stop``);
    ``baselines``: the same runs of the code before a change, by run name, if measured."""
    baselines = baselines or {}
    lines = ["## 9. Failover of a hung primary (`bench_failover.py --fault stop`)", ""]
    present = [(name, d) for name, d in runs if d is not None]
    if not present:
        return [*lines, "Not run yet (no `results/failover-stop*.json`).", ""]
    lines += ["The same cluster and writer as section 1, but the primary is SIGSTOPped (it keeps the "
              "state-directory lock): a standby fences it after `[controller] hung_timeout` without a "
              "heartbeat (SIGKILL of the verified lock holder) and takes over. Milliseconds after the "
              "SIGSTOP; aim: first write p50 ≤ hung_timeout + 300 ms, p99 ≤ hung_timeout + 1 s.", "",
              "A standby that has seen no beat for half of hung_timeout (and can fence the primary) "
              "stops naming it in its handshake and says when it expects to take over (`takeover_ms`, "
              "issue 19's follow-up); a client whose liveness timeout fired waits that long against that "
              "standby instead of dialing the hung primary and backing off. Before that, the standbys "
              "redirected to the hung primary, whose handshake timed out, and a writer whose liveness "
              "timeout (1.5 s) fired before the fence backed off past the promotion (runs of "
              "2026-12-01T12:13 and 12:26, the same commands: first write p50 2,302 ms and 2,124 ms).", ""]
    base = [(name, d, baselines.get(name)) for name, d in present if baselines.get(name)]
    if base:
        lines += ["The code before the takeover promise (its parent commit), run back to back with this "
                  "code on the same shared machine (same commands and seed), first write issued after the "
                  "stop acknowledged, ms:", "",
                  "| run | code | p50 | p90 | p99 | max | promoted p50 | every role re-joined p50 "
                  "| load (1 min) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, d, b in base:
            for label, r in (("before (baseline)", b), ("with the takeover promise", d)):
                fw, pr = r["summary"]["first_write_ms"], r["summary"]["promotion_ms"]
                rj = r["summary"]["all_rejoined_ms"]
                lines.append(f"| {name} | {label} | {fmt(fw.get('p50'))} | {fmt(fw.get('p90'))} | "
                             f"{fmt(fw.get('p99'))} | {fmt(fw.get('max'))} | {fmt(pr.get('p50'))} | "
                             f"{fmt(rj.get('p50'))} | "
                             f"{fmt(r.get('loadavg_1min_at_start'))}-{fmt(r.get('loadavg_1min_at_end'))} |")
        lines += ["", "The roles re-join sooner too: their heartbeats' reconnect passes wait for the "
                  "promising standby instead of dialing the hung primary. The baselines' load is a "
                  "5-second sampling of `/proc/loadavg` during their runs (their benchmark code did not "
                  "record it).", ""]
    for name, d in present:
        s = d["summary"]
        hung = float(d.get("hung_timeout", 2.0)) * 1e3
        live = d.get("client_settings", {}).get("writer_liveness_timeout")
        chk = d.get("checker", {})
        lines += [f"**{name}**: source {provenance(d)}; {d['kills']} SIGSTOPs, hung_timeout "
                  f"{hung / 1e3:g} s, the writer's liveness_timeout {fmt(live)} s (the roles' "
                  f"1.5 s){load_note(d)}.", "",
                  DIST_HEAD,
                  dist_row("standby promoted (`status.since`)", s["promotion_ms"]),
                  dist_row("write in flight at the stop acknowledged", s["inflight_ack_ms"]),
                  dist_row("first write issued after the stop acknowledged", s["first_write_ms"],
                           f"p50 ≤ {hung + 300:,.0f}, p99 ≤ {hung + 1000:,.0f}"),
                  dist_row("every role re-joined (last of 4)", s["all_rejoined_ms"]),
                  "",
                  f"Fenced (the stopped primary ended by SIGKILL): {s.get('fenced')} of {d['kills']}; first "
                  f"write acknowledged by the stopped primary: {s.get('first_write_from_old_primary')}. "
                  f"Checker over every write: {'OK' if chk.get('ok') else 'VIOLATIONS ' + str(chk.get('violations'))} "
                  f"({chk.get('counts')}).", ""]
        if d.get("plot"):
            lines += [f"![{name}](results/{d['plot']})", ""]
    lines += ["Peers for a hung leader (BENCHMARKS.md): Slurm's backup takes over after "
              "`SlurmctldTimeout` (120 s default, 6.5 s measured at 5 s); Kubernetes' lease-based "
              "election defaults to a 15 s lease. Before this change, a SIGSTOPped xce primary was an "
              "outage for as long as it stayed stopped.", ""]
    return lines


def chaos_section(d: dict[str, Any] | None) -> list[str]:
    """Seeded random faults on the fault test bed (``bench_chaos.py``)."""
    lines = ["## 10. Chaos: seeded random faults on the fault test bed (`bench_chaos.py`)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/chaos.json`; needs root).", ""]
    s = d["summary"]
    lines += [f"Source: {provenance(d)}. {s['runs']} run(s) of {d['faults_per_run']} faults (seeds from "
              f"{d['first_seed']}), each on a fresh bed: three candidates on host `ctl` (file backend, "
              "hung_timeout " f"{d.get('hung_timeout')} s), workers on `n1`, `n2`, scheduler and API server "
              f"on `svc`, {d['writers']} recorded sequential writers and an observer on `cli`. Outage: "
              "injection -> first acknowledged write issued after it (ms); a fault is survived when "
              "writes were acknowledged again after it was healed.", "",
              f"**{s['faults_survived']} of {s['faults']} faults survived; checker: "
              f"{'OK' if s['verdict_ok'] else 'VIOLATIONS'}** (violations: "
              f"{ {k: v for k, v in s['violations'].items() if v} or 'none'}; operations: "
              f"{s['operations']}); jobs left unfinished at the end: {s['unfinished_jobs']}.", "",
              "| fault kind | applied | survived | outage p50 | p99 | max | held p50 (s) | writes refused |",
              "|---|---|---|---|---|---|---|---|"]
    for kind, k in s["by_kind"].items():
        o = k["outage_ms"]
        lines.append(f"| {kind} | {k['applied']} | {k['recovered']} | {fmt(o.get('p50'))} | "
                     f"{fmt(o.get('p99'))} | {fmt(o.get('max'))} | {fmt(k['held_s'].get('p50'), 2)} | "
                     f"{k.get('refused_writes', 0)} |")
    lines += ["", "How to read the outages: faults that cut the clients or the controllers off last as "
              "long as they are held (partition-clients, blackhole-primary, freeze-controllers: nothing "
              "can fail over, the candidates share one host), plus a restart for power-off-controllers; "
              "stop-primary is hung_timeout plus the fence and reconnect; faults away from the write "
              "path (workers, the scheduler's host) cost the writers nothing. A full controller disk "
              "is not an outage but refusals: the primary stays up and answers writes `STORAGE` "
              "(counted as refused: not applied) until space returns; a write may still commit "
              "into WAL space SQLite already holds, hence the short first-acknowledgement times. "
              "Jobs left unfinished come from `full-disk-worker`: a job that finishes while its "
              "worker's journal disk is full loses its finish report and stays RUN (a worker "
              "defect, reported, not fixed here).", ""]
    return lines


# The scale figures (bench_scale.py, issue #17): (measurement, key under a size, label, aim).
SCALE_DISTS: list[tuple[str, str, str, str]] = [
    ("ctl_failover", "first_write_ms", "SIGKILL -> first acknowledged write (ms)", "p50 ≤ 100, p99 ≤ 300 at 1M"),
    ("ctl_failover_hugepages", "first_write_ms",
     "SIGKILL -> first acknowledged write (ms)", "p50 ≤ 100, p99 ≤ 300 at 1M"),
    ("ctl_failover_pymalloc", "first_write_ms",
     "SIGKILL -> first acknowledged write (ms)", "p50 ≤ 100, p99 ≤ 300 at 1M"),
    ("ctl_failover", "promotion_ms", "standby promotion itself (ms, hot)", ""),
    ("ctl_failover_hugepages", "promotion_ms", "standby promotion itself (ms, hot)", ""),
    ("ctl_restart", "first_write_ms", "lone restart: process start -> first acknowledged write (ms)", "≤ 3,000 at 1M"),
    ("ctl_restart", "all_loaded_ms_upper_bound", "lone restart: process start -> every job loaded (ms)", ""),
    ("ctl_restart", "kill_to_reaped_ms", "lone restart: SIGKILL -> the old process reaped (ms, before the start)", ""),
    ("ctl_restart_pymalloc", "first_write_ms",
     "lone restart: process start -> first acknowledged write (ms)", "≤ 3,000 at 1M"),
    ("ctl_restart_pymalloc", "all_loaded_ms_upper_bound", "lone restart: process start -> every job loaded (ms)", ""),
    ("ctl_restart_pymalloc", "kill_to_reaped_ms",
     "lone restart: SIGKILL -> the old process reaped (ms, before the start)", ""),
    ("ctl_restart_hugepages", "first_write_ms",
     "lone restart: process start -> first acknowledged write (ms)", "≤ 3,000 at 1M"),
    ("ctl_restart_hugepages", "kill_to_reaped_ms",
     "lone restart: SIGKILL -> the old process reaped (ms, before the start)", ""),
    ("ctl_load_stall", "longest_gap_ms", "cold load: longest wait for a `status` answer (ms)",
     "< 1,500 (a client's liveness timeout)"),
    ("ctl_load_stall", "gap_p99_ms", "cold load: p99 wait for a `status` answer (ms)", ""),
    ("ctl_load_stall", "first_write_ms", "cold load: process start -> first acknowledged write (ms)", ""),
    ("ctl_load_stall", "loaded_ms",
     "cold load: process start -> every job loaded, `status` pinged back to back (ms)", ""),
    ("ctl_queries", "nothing_matching_ms", "`jobinfo` matching nothing, round trip (ms)", "cheap at 1M"),
    ("ctl_queries", "own_unfinished_page_ms", "`jobinfo` a page (100) of the caller's unfinished jobs (ms)", ""),
    ("ctl_queries", "status_ms", "`status` (a page of members) (ms)", ""),
    ("ctl_housekeeping", "cleaner_nothing_due_ms", "cleaner pass, nothing due (ms, in process)", "no scan"),
    ("ctl_housekeeping", "cleaner_1000_due_ms", "cleaner pass removing 1,000 (ms, in process)", ""),
    ("ctl_housekeeping", "host_expiry_10000_hosts_nothing_due_ms", "host-expiry pass, 10,000 hosts, none due (ms)",
     "no scan"),
]
SCALE_VALUES: list[tuple[str, str, str, str]] = [
    ("ctl_memory", "bytes_per_job_submitted", "controller RSS per job, after pipelined submissions (B)", "≤ 1,536"),
    ("ctl_memory", "bytes_per_job_loaded", "controller RSS per job, after a restart's load (B)", "≤ 1,536"),
    ("ctl_memory", "growth_bytes_per_write", "RSS growth per further write, its new job included (B)", ""),
    ("ctl_failover", "changes_caught_up_max", "changes a promotion caught up (most)", "the tail only"),
    ("ctl_failover", "rss_per_job_loaded_b",
     "candidate RSS per job, state loaded, the default heap (B, median of 3)", "≤ 1,536"),
    ("ctl_failover_pymalloc", "rss_per_job_loaded_b",
     "candidate RSS per job, state loaded, pymalloc heap (B, median of 3)", "≤ 1,536"),
    ("ctl_failover_hugepages", "rss_per_job_loaded_b",
     "candidate RSS per job, state loaded, glibc heap on huge pages (B, median of 3)", "≤ 1,536"),
]


API_ROWS: list[tuple[str, str, str, int]] = [
    ("get_jobs_limit100_ms", "`GET /jobs?limit=100` p50 (ms)", "≤ 10 at 1M", 2),
    ("get_jobs_limit100_filtered_ms", "`GET /jobs?limit=100&user=..&state=PEND` mid-listing p50 (ms)", "", 2),
    ("post_jobs_16_in_flight_per_s", "`POST /jobs` per second, 16 in flight", "≥ 2,000", 0),
    ("post_jobs_16_in_flight_p50_ms", "`POST /jobs` p50 with 16 in flight (ms)", "", 2),
    ("apiserver_cpu_ms_per_post", "API server CPU per POST (ms)", "", 3),
    ("primary_cpu_ms_per_post", "primary controller CPU per POST (ms)", "", 3),
    ("standby_cpu_ms_per_post", "one hot standby's CPU per POST (ms)", "", 3),
    ("loadgen_cpu_ms_per_post", "the load generator's CPU per POST (ms; `RawHttp`)", "far below the servers'", 3),
    ("post_jobs_p50_alone_ms", "`POST /jobs` p50, one client alone (ms)", "", 2),
    ("post_jobs_p50_while_paging_ms", "`POST /jobs` p50 while another client pages (ms)", "", 2),
    ("while_paging_ratio", "while paging / alone (p50)", "≤ 1.2", 2),
    ("post_jobs_p99_while_paging_ms", "`POST /jobs` p99 while another client pages (ms)", "", 2),
    ("loop_lag_posting_alone", "loop lag posting alone: worst bucket (≤ ms)", "", 1),
    ("loop_lag_while_paging", "loop lag while paging: worst bucket (≤ ms)", "small", 1),
    ("jobs_paged_per_s_meanwhile", "jobs the pager read per second meanwhile", "", 0),
    ("rss_mib", "API server RSS (MiB)", "", 0),
]
"""The ``apiserver`` measurement's rows: key, label, aim, digits (a distribution: its p50)."""


HEAPS = {"hugepages": ", candidates with XCE_CONTROLLER_HUGEPAGES=1 (heap on huge pages)",
         "pymalloc": ", candidates with XCE_CONTROLLER_HUGEPAGES=0 (pymalloc heap)",
         "default": ", the default heap (huge pages: the store holds 64 MiB or more)"}
"""The label of a measurement run with ``--huge-pages`` / ``--pymalloc`` (NAME_hugepages...)."""


PHASES = {
    "kill_to_lock_ms": "SIGKILL -> a standby holds the lock (the old primary's teardown, its wake-up)",
    "start_to_reexec_ms": "process start -> re-executing onto huge pages (1st interpreter)",
    "to_role_start_ms": "interpreter start (the 2nd, if re-executed) -> the role starts",
    "role_start_to_listening_ms": "role start -> listening (the controller's imports, set-up)",
    "listening_to_lock_ms": "listening -> holds the lock",
    "promotion_ms": "the promotion (lock -> primary)",
    "promoted_to_commit_ms": "promoted -> the client's write committed (as the primary saw it)",
    "promoted_to_ack_ms": "promoted -> the client's write acknowledged",
}
"""The phases of ctl_failover / ctl_restart (``phases_ms``, from the candidates' logs)."""


def scale_phases(res: dict[str, Any]) -> list[str]:
    """Where a failover's and a restart's time goes, phase by phase (``phases_ms``)."""
    rows = []
    for name in sorted(res):
        if not name.startswith(("ctl_failover", "ctl_restart")):
            continue
        for size, v in sorted(res[name].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            phases = v.get("phases_ms") if isinstance(v, dict) else None
            for key, label in PHASES.items():
                st = (phases or {}).get(key)
                if isinstance(st, dict) and st.get("n"):
                    rows.append(f"| {name} | {int(size):,} | {label} | {fmt(st.get('p50'), 1)} | "
                                f"{fmt(st.get('max'), 1)} | {st['n']} |")
    if not rows:
        return []
    return ["", "Where the time goes (`phases_ms`: timestamps of the candidates' log lines and of "
            "the client; the promotion's own figure from its log line):", "",
            "| measurement | size | phase | p50 (ms) | max (ms) | n |", "|---|---|---|---|---|---|",
            *rows]


def scale_section(d: dict[str, Any] | None) -> list[str]:
    """The state at scale (``bench_scale.py``): controller and member figures by size."""
    lines = ["## 11. State at scale (`bench_scale.py`, issue #17)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/scale.json`).", ""]
    res, runs = d.get("results", {}), d.get("runs", {})
    lines += ["Jobs parked in an inactive queue, filled by pipelined durable submissions; real "
              "processes on loopback, real SIGKILL. The machine was shared with other helpers' "
              "test suites while these ran: the figures are pessimistic. Each measurement's "
              "command and date:", ""]
    for name in sorted(res):
        lines.append(f"- `{name}`: {provenance(runs.get(name, d.get('meta', {})))}")
    lines += ["", "Controller:", "", "| size | measure | p50 | p90 | p99 | max | min | n | aim |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, key, label, aim in SCALE_DISTS:
        for size, v in sorted(res.get(name, {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            st = v.get(key) if isinstance(v, dict) else None
            if isinstance(st, dict):
                cells = [fmt(st.get(k), 2) for k in ("p50", "p90", "p99", "max", "min")]
                how = HEAPS.get(name.rsplit("_", 1)[-1], "")
                if not how and v.get("huge_pages"):
                    how = HEAPS["hugepages"]
                if not how and str(v.get("heap", "")).startswith("default") and int(size) >= 1_000_000:
                    how = HEAPS["default"]
                lines.append(f"| {int(size):,} | {label}{how} | " + " | ".join(cells)
                             + f" | {st.get('n', 0)} | {aim} |")
    lines += ["", "| size | measure | value | aim |", "|---|---|---|---|"]
    for name, key, label, aim in SCALE_VALUES:
        for size, v in sorted(res.get(name, {}).items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            if isinstance(v, dict) and key in v:
                lines.append(f"| {int(size):,} | {label} | {fmt(v[key], 0)} | {aim} |")
    lines += scale_phases(res)
    api = res.get("apiserver") or {}
    if api:
        lines += ["", "API server (`--only apiserver`; size 0: an empty cluster; medians of the "
                  "repeated runs; loop lag: the API server's 2 ms ticker, how late it woke):", "",
                  "| size | measure | value | aim |", "|---|---|---|---|"]
        for size, v in sorted(api.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            for key, label, aim, digits in API_ROWS:
                got = v.get(key) if isinstance(v, dict) else None
                if isinstance(got, dict):
                    got = got.get("p50", got.get("worst_le_ms"))
                if got is not None:
                    lines.append(f"| {int(size):,} | {label} | {fmt(got, digits)} | {aim} |")
    lines += scale_member_rows(res)
    members = {k: v for k, v in res.items()
               if not k.startswith("ctl_") and k != "apiserver" and k not in OWN_ROWS}
    if members:
        lines += ["", "Members (medians; every figure of `results/scale.json`):", "",
                  "| measurement | figure | value |", "|---|---|---|"]
        for name, v in members.items():
            flat = flatten(v)
            picks = [k for k in flat if k.endswith((".p50", "_s", "_ms", ".mode", ".rejoins"))
                     and not isinstance(flat[k], list | dict)][:24]
            lines += [f"| {name} | {k} | {fmt(flat[k], 3)} |" for k in picks]
    return [*lines, ""]


OWN_ROWS = frozenset({"scheduler_dispatch", "member_join"})
"""Member measurements with rows of their own (:func:`scale_member_rows`)."""


def scale_member_rows(res: dict[str, Any]) -> list[str]:
    """The scheduler's dispatch and the members' joins, one row per figure and size."""
    lines: list[str] = []
    sd = res.get("scheduler_dispatch")
    if isinstance(sd, dict):
        lines += ["", "Scheduler dispatch (`--only scheduler_dispatch [--in-state N]`): 10,000 pending jobs "
                  "onto 1,000 simulated hosts (`simworkers.py`), a real controller and scheduler; "
                  "activation of their queue -> the last job RUN. CPU: each process's over that "
                  "window (on a shared machine the wall time also waits for other work); per job: "
                  "all three's CPU over the jobs, and the controller's plus the scheduler's alone "
                  "(what the cluster spends on their hosts: the simulated hosts stand for 1,000 "
                  "other machines); calls: the scheduler's `jobdispatch_many` batches (runs "
                  "measured before batching: one `jobdispatch` per job); nice: the simulated "
                  "hosts' (`--sim-nice`).", "",
                  "| jobs in state besides | activation -> last RUN (s, p50) | runs | CPU controller / "
                  "scheduler / simulated hosts (s, last run) | CPU per job (ms) | controller + "
                  "scheduler CPU per job (ms, p50) | dispatch calls | nice | aim |",
                  "|---|---|---|---|---|---|---|---|---|"]
        parts = [("0", sd)] + [(k.removeprefix("in_state_"), v) for k, v in sd.items()
                                if k.startswith("in_state_") and isinstance(v, dict)]
        parts += [("0", v) for k, v in sd.items() if k.startswith("sim_nice_") and isinstance(v, dict)]
        for size, v in parts:
            runs = v.get("runs") or []
            if not runs:
                continue
            cpu = runs[-1].get("cpu_during_dispatch_s") or {}
            cells = " / ".join(fmt(cpu.get(k), 2) for k in ("controller", "scheduler", "simworkers"))
            last = runs[-1]
            per_job = (fmt(sum(cpu.values()) * 1000 / last["jobs"], 3)
                       if cpu and last.get("jobs") else "—")
            calls = last.get("dispatch_calls")
            own = sorted(r["cpu_ctl_sched_per_job_ms"] for r in runs if "cpu_ctl_sched_per_job_ms" in r)
            own_p50 = fmt(own[len(own) // 2], 3) if own else "—"
            lines.append(f"| {int(size):,} | {fmt(v['activate_to_last_run_s'].get('p50'), 2)} | "
                         f"{len(runs)} | {cells if cpu else 'not measured'} | {per_job} | "
                         f"{own_p50} | {fmt(calls, 0) if calls is not None else '—'} | "
                         f"{last.get('sim_nice', 0)} | ≤ 2 s |")
    mj = res.get("member_join")
    if isinstance(mj, dict):
        lines += ["", "Member join (`--only member_join`): each role's join -> its replica's sync "
                  "complete, then SIGKILL of the primary -> re-join -> sync complete (its mode), "
                  "and how many times it re-joined (once is right). CPU: the role process's from its "
                  "start to the sync seen complete.", "",
                  "| size | role | join -> complete (s) | CPU (s) | re-join -> complete (s) | mode | "
                  "re-joins |", "|---|---|---|---|---|---|---|"]
        for size, v in sorted(mj.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            if not isinstance(v, dict):
                continue
            first, again = v.get("join") or {}, v.get("rejoin_after_sigkill") or {}
            for role in sorted(first):
                j, r = first[role], again.get(role) or {}
                lines.append(f"| {int(size):,} | {role} | {fmt(j.get('join_to_complete_s'), 3)} | "
                             f"{fmt(j.get('cpu_s_start_to_complete'), 2)} | "
                             f"{fmt(r.get('join_to_complete_s'), 3)} | {r.get('mode', '')} | "
                             f"{r.get('rejoins', '')} |")
    return lines


ETCD_ALONE = (
    ("sequential_gateway", "etcd alone: sequential puts, 1 client, JSON gateway"),
    ("sequential_grpc", "etcd alone: sequential puts, 1 client, gRPC"),
    ("concurrent_gateway", "etcd alone: puts from 8 concurrent clients, JSON gateway"),
    ("concurrent_grpc", "etcd alone: puts from 8 concurrent clients, gRPC"),
    ("batched_gateway", "etcd alone: puts in sequential 64-put transactions, JSON gateway"),
    ("batched_grpc", "etcd alone: puts in sequential 64-put transactions, gRPC"),
    ("puts_1_clients", "etcd alone: sequential puts, 1 client (JSON gateway)"),
    ("puts_8_clients", "etcd alone: sequential puts, 8 clients"),
)
"""bench_etcd's etcd-alone figures (the last two: results files from before the gRPC ones)."""


def etcd_cpu_rows(cpu: dict[str, Any] | None) -> list[str]:
    """bench_etcd's CPU split: CPU per submission by process, and etcd's counters."""
    if not cpu:
        return []
    shapes = list(cpu)
    procs = list(cpu[shapes[0]]["cpu_us_per_submission"])
    lines = ["Where the CPU goes (the same benchmark, data on disk, gRPC: one more run of each "
             "shape with every process's CPU time counted over it, per submission; what a shared "
             "machine distorts least):", "",
             "| CPU µs per submission | " + " | ".join(k.replace("_", " ") for k in shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for proc in [*procs, "total"]:
        cells = [fmt(cpu[k]["cpu_us_total"] if proc == "total" else cpu[k]["cpu_us_per_submission"][proc], 0)
                 for k in shapes]
        lines.append(f"| {'**total**' if proc == 'total' else proc} | " + " | ".join(cells) + " |")
    for label, key in (("submissions/s in this run", "per_s"), ("load average", "load"),
                       ("etcd raft proposals (write transactions)", "etcd_proposals"),
                       ("submissions per write transaction", "submissions_per_proposal"),
                       ("etcd puts per submission", "etcd_puts_per_submission"),
                       ("WAL fsync mean (ms)", "wal_fsync_ms_mean")):
        lines.append(f"| {label} | " + " | ".join(fmt(cpu[k].get(key), 1 if key != "per_s" else 0)
                                                  for k in shapes) + " |")
    return [*lines, ""]


def etcd_section(fo: dict[str, Any] | None, stop: dict[str, Any] | None, tp: dict[str, Any] | None,
                 chaos: dict[str, Any] | None, stop_live1: dict[str, Any] | None = None,
                 poweroff: dict[str, Any] | None = None, freeze: dict[str, Any] | None = None) -> list[str]:
    """The etcd backend (``--backend etcd`` of bench_failover and bench_chaos, bench_etcd)."""
    lines = ["## 15. The etcd backend (`--backend etcd`, `bench_etcd.py`)", "",
             "Three controller candidates on the etcd backend (`plugins/etcd`: lease election with a "
             "fencing token, state in etcd, lease TTL 1 s) over a real three-member etcd 3.4 started "
             "with `--heartbeat-interval=100 --election-timeout=600` (docs/operator.md). The peers' "
             "figures are BENCHMARKS.md's. Compare with sections 1, 3 and 10 (the file backend). "
             "The standbys are hot (an etcd watch; a promotion catches up to its campaign's "
             "revision, no reload). Measured on the shared 2-core machine while other engineers' "
             "tests ran (load average 8-17 during these runs): pessimistic figures, throughput most of "
             "all.", ""]
    fos = [(n, d) for n, d in (("SIGKILL", fo), ("SIGSTOP", stop),
                               ("SIGSTOP, the writer's liveness_timeout 1 s", stop_live1))
           if d is not None]
    if fos:
        lines += [DIST_HEAD]
        for name, d in fos:
            sm = d["summary"]
            lines.append(dist_row(f"{name} of the primary -> first acknowledged write issued after it (ms)",
                                  sm["first_write_ms"], "p50 <= 1,500, p99 <= 3,000"))
            lines.append(dist_row(f"{name}: every role (2 workers, scheduler, API) re-joined (ms)",
                                  sm["all_rejoined_ms"], "p50 <= 2,000"))
        lines += [""] + [f"Source ({name}): {provenance(d)}; {d['kills']} faults, checker: "
                         f"{'OK' if d['checker'].get('ok') else 'VIOLATIONS'} ({d['checker'].get('counts')})."
                         for name, d in fos] + [""]
        lines += ["Where the time goes: a SIGKILLed or stopped primary's lease expires at etcd one TTL "
                  "(1 s) after its last keep-alive (sent every 250 ms), etcd's lessor checks for expired "
                  "leases every 500 ms, then a standby's next poll (a read every 20 ms in these runs; "
                  "a hot standby's watch now wakes its campaign when the key goes, with a poll every "
                  "0.2 s behind it) sees the key gone, its campaign wins and it catches up from its "
                  "watch (milliseconds). etcd's "
                  "lease TTL is whole seconds, and its shortest is 1.5 election timeouts: 1 s is the "
                  "shortest lease these raft settings allow, and the lessor's 500 ms check is not "
                  "configurable in etcd 3.4. A stopped primary is promoted away as fast as a killed "
                  "one (`promotion_ms` p50 in the results files: "
                  + ", ".join(f"{n} {fmt(d['summary']['promotion_ms']['p50'], 0)} ms" for n, d in fos)
                  + "); what the SIGSTOP rows add is the client's: its connections to a stopped "
                  "process say nothing, so it gives up on it after its `[client] liveness_timeout` "
                  "(the writer's: 1 s, the lease TTL, in the runs of --backend etcd since "
                  "2026-12-02; 1.5 s before). That alone did not help (the row with the writer's "
                  "1 s, measured before): the standbys still named the silent primary, and the "
                  "client timed out dialing it. Now a standby whose watch shows no commit and no "
                  "beat of the primary for 0.7 TTL answers \"taking over in T ms\" instead, so the "
                  "client waits for it (docs/operator.md). A host's fault "
                  "also takes its etcd member: when that member leads raft, the others elect a leader "
                  "first (0.6-1.2 s with these flags) and a new raft leader renews every lease by its "
                  "TTL plus an election timeout, so a dead primary's lease would live about 2.5 s past "
                  "the fault; the primary keeps the raft leader off its host for that reason (below). "
                  "A standby ending a silent primary's lease sooner is not safe with leases alone "
                  "(docs/operator.md, \"Why a standby does not end a silent primary's lease sooner\"). "
                  "A primary that gives the role up during an etcd election now keeps revoking its "
                  "lease until the new raft leader answers (before: one try, then the renewed lease "
                  "held the standbys off; the kill-etcd-leader p99 was 12.6 s in the previous "
                  "runs).", ""]
    else:
        lines += ["Failover: not run yet (`python benchmarks/bench_failover.py --backend etcd`).", ""]
    hosts = [(n, d) for n, d in (("power-off", poweroff), ("freeze", freeze)) if d is not None]
    if hosts:
        lines += ["The primary's whole host lost, on the fault test bed (`bench_failover.py --backend "
                  "etcd --fault poweroff|freeze`: hosts h1-h3 each an etcd member and a candidate, two "
                  "recorded writers on a fourth host; a power-off takes the host's links and every "
                  "process on it, its etcd member too; a freeze SIGSTOPs every process on it):", "",
                  DIST_HEAD]
        for name, d in hosts:
            sm = d["summary"]
            lines.append(dist_row(f"{name} of the primary's host -> first acknowledged write issued "
                                  "after it (ms)", sm["first_write_ms"], "p50 <= 1,500, p99 <= 3,000"))
            lines.append(dist_row(f"{name} of the primary's host -> a standby promoted (ms)",
                                  sm["promotion_ms"], ""))
        lines += [""] + [f"Source ({name}): {provenance(d)}; {d['kills']} faults, the etcd raft leader "
                         f"on the primary's host at {d['summary']['raft_leader_on_primary_host']} of "
                         f"them; checker: {'OK' if d['checker'].get('ok') else 'VIOLATIONS'} "
                         f"({d['checker'].get('counts')})." for name, d in hosts] + [""]
        lines += ["The primary keeps etcd's raft leader off its own host (`xce_etcd.placement`: at its "
                  "promotion and every 2 s it asks its host's member whether it leads raft, and if so "
                  "moves leadership to the most caught-up other member with etcd's MoveLeader), and "
                  "every candidate sends its etcd requests to its own host's member first. So losing "
                  "the primary's host no longer costs an etcd election plus the lease renewal a new "
                  "raft leader gives every lease (the chaos rows of earlier runs: power-off p50 3.3 s, "
                  "freeze 2.5 s): the promotion's median is a SIGKILL's. What the first write "
                  "adds over the promotion is the client's, as for SIGSTOP above: a host that is gone "
                  "or frozen says nothing, so the client gives up on its connection after its "
                  "`[client] liveness_timeout` (1.5 s). The benchmark waits before each fault until "
                  "every candidate is up again: a primary woken from a freeze gives its role up and "
                  "is restarted, which took 6 s at load average 12, and the first freeze runs, which "
                  "did not wait, had a p99 of 7 s from faults that found no standby up. Not "
                  "examined yet: the power-off tail (4 of 12 promotions took 2.2-3.9 s).", ""]
    if tp is not None:
        lines += [f"Throughput, source: {provenance(tp)}.", "",
                  "| measure | median /s | min-max | runs | aim |", "|---|---|---|---|---|"]
        aims = {"sequential_1_client": ">= 300", "pipelined_1_client_256_inflight": ">= 5,000"}
        places = [("disk", tp)] + ([("tmpfs", tp["tmpfs"])] if "tmpfs" in tp else [])
        for where, part in places:
            alone, lib = part["etcd_alone"], part["xce_on_etcd"]
            for key, label in ETCD_ALONE:
                if key not in alone:  # a results file from before the gRPC figures
                    continue
                st = alone[key]["puts_per_s"]
                lines.append(f"| etcd data on {where}: {label} | {fmt(st.get('p50'), 0)} | "
                             f"{fmt(st.get('min'), 0)}-{fmt(st.get('max'), 0)} | {alone[key]['runs']} | |")
            libs = [("", lib)] + ([(" (transactions through the JSON gateway)", part["xce_on_etcd_gateway"])]
                                  if "xce_on_etcd_gateway" in part else [])
            for how, shapes in libs:
                for key, v in shapes.items():
                    st = v["jobs_per_s"]
                    lines.append(f"| etcd data on {where}: xce {key.replace('_', ' ')} (durable submissions)"
                                 f"{how} | {fmt(st.get('p50'), 0)} | {fmt(st.get('min'), 0)}-"
                                 f"{fmt(st.get('max'), 0)} | {v['runs']} | {'' if how else aims.get(key, '')} |")
        lines += ["", "Every submission is acknowledged after the guarded etcd transaction that holds it "
                  "committed (one round trip; the lease check is local); concurrent submissions share "
                  "one transaction (group commit). A submission is one etcd operation (its job) and "
                  "each transaction three more (`meta/rev`, the chain key, one key holding every "
                  "idempotency key of the transaction and its result). The store sends its transactions "
                  "over etcd's gRPC API (`[etcd] transport`, default `grpc`; everything else goes "
                  "through the JSON gateway): the 'etcd alone' rows show what the gateway costs etcd "
                  "(JSON in and out, base64, a second internal gRPC hop). The write path (docs/"
                  "operator.md, \"The write path\"): the transaction is encoded straight from the "
                  "records' bytes; a round with nothing queued behind it is committed and reported "
                  "by the writer's one thread (the only hand-offs: the loop's to it and back), one "
                  "with writes queued behind it hands the next round to a helper before its "
                  "report; the transactions go to the member leading raft (etcd alone, sequential "
                  "guarded 4-put transactions: 1.56-1.94 ms at the leader against 1.61-2.87 ms at "
                  "a follower, and less etcd CPU). The rows \"through the JSON gateway\" are the "
                  "same cluster shapes run right after the gRPC ones with `[etcd] transport = "
                  "\"gateway\"`. The pipelined shapes are bound by CPU, and how much a submission "
                  "costs depends above all on how many share a transaction (etcd: ~1.3 ms of CPU "
                  "per transaction over its three members, ~46 µs per submission inside a large "
                  "one): see the CPU rows below. "
                  "The aims are not met here (docs/operator.md, \"Throughput, and what is not done "
                  "yet\").", ""]
        lines += etcd_cpu_rows(tp.get("cpu"))
    else:
        lines += ["Throughput: not run yet (`python benchmarks/bench_etcd.py`).", ""]
    if chaos is not None:
        s = chaos["summary"]
        lines += [f"Chaos, source: {provenance(chaos)}. {s['runs']} run(s) of {chaos['faults_per_run']} faults "
                  f"(seeds from {chaos['first_seed']}) on the etcd bed (`xce_etcd.chaos`: hosts h1-h3 each an "
                  f"etcd member and a candidate, {chaos['writers']} recorded writers on `cli`).", "",
                  f"**{s['faults_survived']} of {s['faults']} faults survived; checker: "
                  f"{'OK' if s['verdict_ok'] else 'VIOLATIONS'}** (violations: "
                  f"{ {k: v for k, v in s['violations'].items() if v} or 'none'}; operations: {s['operations']}).",
                  "", "| fault kind | applied | survived | outage p50 (ms) | p99 | max |", "|---|---|---|---|---|---|"]
        for kind, k in s["by_kind"].items():
            o = k["outage_ms"]
            lines.append(f"| {kind} | {k['applied']} | {k['recovered']} | {fmt(o.get('p50'))} | "
                         f"{fmt(o.get('p99'))} | {fmt(o.get('max'))} |")
        lines.append("")
    else:
        lines += ["Chaos: not run yet (`python benchmarks/bench_chaos.py --backend etcd`, as root).", ""]
    return lines


def events_section(d: dict[str, Any] | None) -> list[str]:
    """Cluster events at a large history (``bench_events.py``, issue #25)."""
    lines = ["## 17. Cluster events at a large history (`bench_events.py`, issue #25)", ""]
    if d is None:
        return [*lines, "Not run yet (`python benchmarks/bench_events.py`).", ""]
    lines += [f"{d.get('events', 0):,} events stored, loaded by a real controller at promotion (on a "
              f"thread: {fmt(d.get('load_ms'), 0)} ms), then queried over loopback. {provenance(d)}. "
              "The op's cost is the page's (bisection into the log), not the history's.", "",
              "| figure | p50 | p90 | max |", "|---|---|---|---|"]
    for group, unit in (("wall_ms", "ms, a fresh process"), ("op_ms", "ms, round trip"),
                        ("page_us", "µs, controller's EventLog.page")):
        for name, st in (d.get(group) or {}).items():
            lines.append(f"| `{name}` ({unit}) | {fmt(st.get('p50'), 1)} | {fmt(st.get('p90'), 1)} | "
                         f"{fmt(st.get('max'), 1)} |")
    return [*lines, ""]


def others_section() -> list[str]:
    """Headline figures of the other benchmarks, with links to their reports."""
    lines = ["## 8. Other benchmarks' figures (gathered from `results/*.json`)", "",
             "Written by the other engineers' scripts; see each linked report for method and details.", "",
             "| benchmark | figure | value | source |", "|---|---|---|---|"]
    names = sorted({p.stem for p in RESULTS.glob("*.json")} - set(MINE) - set(SHOWN_IN_MINE))
    for name in names:
        d = load(name)
        if d is None:
            continue
        flat = flatten(d)
        link = f"[{name}.md](results/{name}.md)" if (RESULTS / f"{name}.md").exists() else f"{name}.json"
        # Unknown files: their medians (p50), as many as fit in a short table.
        picks = OTHERS.get(name) or [(k.rsplit(".", 1)[0], k, "") for k in flat
                                     if k.endswith((".p50", ".median_ms", ".p50_ms"))
                                     and isinstance(flat[k], int | float)][:8]
        shown = 0
        for label, pattern, unit in picks:
            keys = [k for k in flat if fnmatch.fnmatchcase(k, pattern)]
            for k in keys[:1]:
                lines.append(f"| {link} | {label} | {fmt(flat[k], 2)} {unit} | {provenance(d)} |")
                shown += 1
        if not shown:
            lines.append(f"| {link} | (no headline figure recognised; see the report) | | {provenance(d)} |")
    return [*lines, ""]


def auth_section(d: dict[str, Any] | None, munge: dict[str, Any] | None,
                 key: dict[str, Any] | None) -> list[str]:
    """What authentication costs (``bench_auth.py``) and failover with MUNGE on."""
    lines = ["## 12. Authentication: the HMAC key against MUNGE (`bench_auth.py`, "
             "`bench_failover.py --auth munge`)", ""]
    if d is None:
        lines += ["Not run yet (no `results/auth.json`).", ""]
    else:
        load = ""
        if "loadavg_1min_at_start" in d:
            load = (f" The machine's 1-minute load average was {fmt(d['loadavg_1min_at_start'])} at the "
                    f"start and {fmt(d.get('loadavg_1min_at_end'))} at the end (2 cores, shared): the "
                    "tails and the process start-up figures are the load's.")
        lines += [f"Source: {provenance(d)}.{load} A real munged with its own key (run by the benchmark); "
                  "one controller candidate per method. Microseconds per credential made and checked "
                  "in one process (the handshake's client and server steps):", "",
                  "| credential | p50 | p90 | p99 | max | min | n |", "|---|---|---|---|---|---|---|"]
        for name, st in d["credential_us"].items():
            lines.append(dist_row(name, st).rsplit(" |", 2)[0] + " |")
        lines += ["", "The ctypes binding of libmunge is the way xce reaches munged: the "
                  "`munge`/`unmunge` programs cost two fork+execs per credential (the last row).", "",
                  "Whole handshakes over loopback TCP to the primary (connect, hello, answer, verdict):", "",
                  "| method | sequential p50 ms | p90 | p99 | concurrent handshakes/s (p50 of 3) |",
                  "|---|---|---|---|---|"]
        for name, h in d["handshake"].items():
            seq = h["sequential_ms"]
            rate = next(v for k, v in h.items() if k.startswith("concurrent_"))
            lines.append(f"| {name} | {fmt(seq.get('p50'), 3)} | {fmt(seq.get('p90'), 3)} | "
                         f"{fmt(seq.get('p99'), 3)} | {fmt(rate.get('p50'), 0)} ({d.get('threads')} clients) |")
        ph = d.get("phases_ms", {})
        if ph:
            lines += ["", "Where a (re)connect's handshake goes, in phases (ms; the methods take turns round "
                      "by round, so they share the load alike): *connect + hello* until the server's first "
                      "message is in; *client credential* the client's credential step (for munge, minting "
                      "at munged); *server verdict* from sending the answer until the verdict is in (the "
                      "server's verify: for munge, its decode at munged, on one of its auth threads). "
                      "*N at once*: N clients start their handshakes at one instant, as a failover's writer "
                      "and four roles do:", "",
                      "| method | connect + hello p50 | p90 | client credential p50 | p90 | server verdict "
                      "p50 | p90 | whole p50 | p90 | n |", "|---|---|---|---|---|---|---|---|---|---|"]
            for name, phs in ph.items():
                cells = []
                for phase in ("connect + hello", "client credential (answer)", "server verdict (verify)", "whole"):
                    st = phs.get(phase, {})
                    cells += [fmt(st.get("p50"), 3), fmt(st.get("p90"), 3)]
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {phs.get('whole', {}).get('n')} |")
            herd = next((v for k, v in ph.items() if k.startswith("munge") and not k.endswith(" 1 at once")), None)
            if herd:
                mint = herd.get("client credential (answer)", {}).get("p50")
                check = herd.get("server verdict (verify)", {}).get("p50")
                whole = herd.get("whole", {}).get("p50")
                if mint is not None and check is not None and whole:
                    lines += ["", f"Minting is on a reconnect's critical path, but small: with MUNGE and "
                              f"five clients at once the client's credential step took {fmt(mint, 3)} ms "
                              f"(p50; {100 * mint / whole:.0f} % of the whole handshake), the server's "
                              f"verdict {fmt(check, 3)} ms ({100 * check / whole:.0f} %: the decode at "
                              "munged, which no client-side change removes). A credential minted ahead "
                              "cannot carry the server's challenge, which the payload binds so that a "
                              "credential is good for its one connection (issue 18); so the client mints "
                              "after the hello, as before."]
        cli = d.get("cli_xce_jobs_ms", {})
        if cli:
            lines += ["", "`xce jobs` wall time, editable install, a fresh process per run (ms): " +
                      "; ".join(f"{n}: p50 {fmt(st.get('p50'))}, p90 {fmt(st.get('p90'))}"
                                for n, st in cli.items()) +
                      " (`benchmarks/bench_cli.py` measures the regular install against the 60 ms aim)."]
        lines.append("")
    runs = [(n, r) for n, r in (("key (same load, run just before)", key), ("munge", munge)) if r]
    if runs:
        lines += ["Failover with each method (the section 1 method; every reconnect and re-join "
                  "authenticates afresh). Milliseconds after the SIGKILL:", "",
                  "| auth | source | first write p50 | p90 | p99 | every role re-joined p50 | p99 "
                  "| a role re-joined p50 | checker |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, r in runs:
            sm = r["summary"]
            fw, ar, pool = sm["first_write_ms"], sm["all_rejoined_ms"], sm["role_rejoin_pooled_ms"]
            ok = "OK" if r.get("checker", {}).get("ok") else "VIOLATIONS"
            load = (f", load {fmt(r['loadavg_1min_at_start'])}-{fmt(r.get('loadavg_1min_at_end'))}"
                    if "loadavg_1min_at_start" in r else "")
            lines.append(f"| {name} | {provenance(r)}, {r['kills']} kills{load} | {fmt(fw.get('p50'))} | "
                         f"{fmt(fw.get('p90'))} | {fmt(fw.get('p99'))} | {fmt(ar.get('p50'))} | "
                         f"{fmt(ar.get('p99'))} | {fmt(pool.get('p50'))} | {ok} |")
        lines += ["", "Aims (issue 18): first write after a SIGKILL ≤ 100 ms p50 and every role re-joined "
                  "≤ 200 ms p50 with MUNGE on. The two runs were made back to back on the shared 2-core "
                  "machine under other engineers' load, so compare them with each other rather than with "
                  "section 1.", ""]
    return lines


def tls_section(d: dict[str, Any] | None, tls: dict[str, Any] | None,
                plain: dict[str, Any] | None) -> list[str]:
    """What TLS costs on the wire (``bench_tls.py``) and failover with TLS on (issue 24)."""
    lines = ["## 13. TLS on the wire (`bench_tls.py`, `bench_failover.py --tls`)", ""]
    if d is None:
        lines += ["Not run yet (no `results/tls.json`).", ""]
    else:
        load = ""
        if "loadavg_1min_at_start" in d:
            load = (f" The machine's 1-minute load average was {fmt(d['loadavg_1min_at_start'])} at "
                    f"the start and {fmt(d.get('loadavg_1min_at_end'))} at the end (2 cores, shared "
                    "with other engineers' runs): every figure here is pessimistic, and the plain "
                    "and TLS rows were measured one after the other, so the load differs between them.")
        lines += [f"Source: {provenance(d)}.{load} One candidate per cluster, plain and TLS "
                  f"({d.get('tls_version')}, {d.get('cipher')}, an EC P-256 certificate from "
                  "`xcecore.tlscerts`, no client certificate). Milliseconds:", "",
                  DIST_HEAD,
                  dist_row("TLS handshake alone (TCP connect + TLS + close)", d["tls_only_ms"], "", 2),
                  dist_row("xce handshake, plain (connect, hello, answer, verdict)",
                           d["plain"]["handshake_ms"], "", 2),
                  dist_row("xce handshake, TLS", d["tls"]["handshake_ms"], "", 2), "",
                  f"Durable `jobsubmit` through the event-loop client, jobs/s ({d.get('reps')} runs "
                  f"of {d.get('jobs_per_run')} jobs each):", "",
                  "| wire | sequential p50 | min | max | 64 in flight p50 | min | max |",
                  "|---|---|---|---|---|---|---|"]
        for name in ("plain", "tls"):
            tp = d[name]["throughput"]
            sq, pp = tp["sequential"]["jobs_per_s"], tp["pipelined_64"]["jobs_per_s"]
            lines.append(f"| {name} | {fmt(sq.get('p50'), 0)} | {fmt(sq.get('min'), 0)} | "
                         f"{fmt(sq.get('max'), 0)} | {fmt(pp.get('p50'), 0)} | "
                         f"{fmt(pp.get('min'), 0)} | {fmt(pp.get('max'), 0)} |")
        lines.append("")
    runs = [(n, r) for n, r in (("plain (same load, run just after)", plain), ("TLS", tls)) if r]
    if runs:
        lines += ["Failover with TLS on every connection (the section 1 method; every reconnect and "
                  "re-join makes a TLS handshake). Milliseconds after the SIGKILL:", "",
                  "| wire | source | first write p50 | p90 | p99 | every role re-joined p50 | p99 "
                  "| checker |", "|---|---|---|---|---|---|---|---|"]
        for name, r in runs:
            sm = r["summary"]
            fw, ar = sm["first_write_ms"], sm["all_rejoined_ms"]
            ok = "OK" if r.get("checker", {}).get("ok") else "VIOLATIONS"
            lines.append(f"| {name} | {provenance(r)}, {r['kills']} kills | {fmt(fw.get('p50'))} | "
                         f"{fmt(fw.get('p90'))} | {fmt(fw.get('p99'))} | {fmt(ar.get('p50'))} | "
                         f"{fmt(ar.get('p99'))} | {ok} |")
        lines += ["", "Aim (issue 24): first write after a SIGKILL ≤ 100 ms p50 with TLS on. The runs "
                  "were made back to back on the shared 2-core machine under other engineers' load; "
                  "compare them with each other, not with section 1.", ""]
    return lines


def revoke_part(d: dict[str, Any] | None) -> list[str]:
    """Section 13 goes on: token revocation through the controller (``bench_revoke.py``)."""
    lines = ["### Token revocation (`bench_revoke.py`, issue 24)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/revoke.json`).", ""]
    c, r = d["check"], d["rest"]
    lines += [f"Source: {provenance(d)}{load_note(d)}. The check every request makes, in one "
              f"process (microseconds; the list held {c['listed']:,} records in the second "
              "case):", "", DIST_HEAD,
              dist_row("token check (signature, claims, list), empty list", c["check_empty_us"], "", 2),
              dist_row(f"token check, {c['listed']:,} records listed", c["check_listed_us"],
                       "no measurable difference", 2),
              dist_row("the list's lookup alone, empty", c["lookup_empty_us"], "", 3),
              dist_row(f"the list's lookup alone, {c['listed']:,} records", c["lookup_listed_us"], "", 3),
              "", f"Two API server processes on a one-candidate cluster ({r['runs']} logouts; "
              "milliseconds):", "", DIST_HEAD,
              dist_row("`POST /auth/logout` (answered after the controller's commit)", r["logout_ms"]),
              dist_row("from its answer until the other API server refuses the token "
                       "(one probe's resolution)", r["refused_elsewhere_ms"]),
              dist_row("`GET /jobs?limit=1`, live token, before the logouts", r["get_before_ms"]),
              dist_row(f"`GET /jobs?limit=1`, live token, {r['listed_after']} revocations listed",
                       r["get_after_ms"]), "",
              "The list's lookup costs the same whatever its length (the in-process rows); the two "
              "`GET` rows were measured a few seconds apart on the shared machine, so what differs "
              "between them is its load, not the list.", ""]
    return lines


def arrays_section(d: dict[str, Any] | None) -> list[str]:
    """Job arrays (``bench_arrays.py``, issue #22): submit, memory, dispatch."""
    lines = ["## 14. Job arrays (`bench_arrays.py`, issue #22)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/arrays.json`).", ""]
    res = d["results"]
    mem, disp = res["memory"], res["dispatch"]
    lines += [f"Source: {provenance(d)}. One controller candidate (SQLite, durable commits), real "
              "loopback TCP; the dispatch part adds the real scheduler and hosts joined by real "
              "clients that never finish their jobs. The machine was shared with other helpers' "
              "test suites: the figures are pessimistic.", "",
              "| measure | p50 | p90 | p99 | max | min | n | aim |", "|---|---|---|---|---|---|---|---|",
              dist_row(f"`jobsubmit` of a {res['size']:,}-element array, acknowledged (ms)",
                       res["submit_ms"], "<= 1000"),
              dist_row(f"array of {disp['elements']:,} onto {disp['hosts']} hosts: elements "
                       "RUN per second", disp["elements_per_s"]),
              "", f"Controller RSS with {mem['arrays']} arrays ({mem['pending_elements']:,} pending "
              f"elements) held: {fmt(mem['bytes_per_pending_element'], 3)} bytes per pending element "
              f"(RSS {mem['rss_before_bytes'] / 2**20:.1f} -> {mem['rss_after_bytes'] / 2**20:.1f} MiB; "
              "aim <= 200 B). An array is one record whatever its size: its pending indexes are "
              "index runs, an element becomes a record when it is dispatched.", ""]
    return lines


def stream_section(d: dict[str, Any] | None) -> list[str]:
    """The dashboard's event stream: POST /jobs latency and API server CPU with N SSE clients."""
    lines = ["## 16. The dashboard's event stream (`bench_stream.py`, issue #25)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/stream.json`).", ""]
    lines += [f"{provenance(d)}. One candidate, the API server as a real process, no workers; each "
              "part opens that many `GET /xce/v1/stream` clients (one reader process) and submits "
              "jobs one `POST /jobs` at a time at the given rate. CPU: the API server's utime+stime "
              "over the part. Delivery: from a POST's answer to the job's first `jobs` event at "
              "client 0 (negative: the push came before the answer).", "",
              "| SSE clients | jobs | achieved rate | POST p50 / p90 / p99 ms | API server CPU ms/job "
              "| CPU % | events received | delivery p50 / p99 ms |", "|---|---|---|---|---|---|---|---|"]
    for p in d.get("parts", []):
        post = p["post_ms"]
        deliv = p.get("delivery_ms")
        lines.append(f"| {p['clients']} | {p['jobs']} | {fmt(p.get('achieved_rate'))}/s "
                     f"| {fmt(post['p50'])} / {fmt(post['p90'])} / {fmt(post['p99'])} "
                     f"| {fmt(p.get('apiserver_cpu_ms_per_job'), 2)} | {fmt(p['apiserver_cpu_percent'])} "
                     f"| {p.get('events_received', '-')} "
                     f"| {(fmt(deliv['p50']) + ' / ' + fmt(deliv['p99'])) if deliv else '-'} |")
    return [*lines, ""]


def tasks_section(d: dict[str, Any] | None) -> list[str]:
    """Parallel jobs' tasks (``bench_tasks.py``, issue #22): launch latency, 3-host start."""
    lines = ["## 18. Parallel jobs' tasks (`bench_tasks.py`, issue #22)", ""]
    if d is None:
        return [*lines, "Not run yet (no `results/tasks.json`).", ""]
    res = d["results"]
    lines += [f"Source: {provenance(d)}{load_note(d)}. The fault test bed: one controller "
              "candidate (SQLite, durable commits) on a simulated host, a real worker on each of "
              "three more (network namespaces on one machine, so one clock), each task a real "
              "process in a cgroup of its job. The machine was shared with other helpers' test "
              "suites: the figures are pessimistic.", "", DIST_HEAD,
              dist_row("`task_launch` call -> the task's command running on n2 (ms)",
                       res["launch_ms"]),
              dist_row("`xce task launch n2 -- true` from inside the job, whole command (ms)",
                       res["cli_launch_ms"]),
              dist_row("3-host job: `jobsubmit` -> rank 0 running on n1 (ms, forced dispatch)",
                       res["job_rank0_ms"]),
              dist_row("3-host job: `jobsubmit` -> both tasks running on n2, n3 (ms; rank 0 "
                       "runs `xce task launch`)", res["job_all_tasks_ms"]),
              "", "The command's time is mostly its own start (a Python interpreter and its "
              "imports), then its poll of the job's record for the tasks' end (the poll's "
              "interval grows from 20 ms); the rank 0 -> tasks figure includes one such command.",
              ""]
    return lines


def metrics_section(d: dict[str, Any] | None) -> list[str]:
    """The controller's scrape cost at many hosts (``bench_metrics.py``, issue #25)."""
    lines = ["## 19. Prometheus scrape of the controller with many hosts joined "
             "(`bench_metrics.py`, issue #25)", ""]
    if d is None or "windows" not in d:
        return [*lines, "Not run yet (`python benchmarks/bench_metrics.py`).", ""]
    lines += [f"Source: {provenance(d)}. One controller candidate (real process, loopback) with "
              f"{d['hosts']:,} simulated workers joined (real clients, one TCP connection each, "
              f"in processes of 2,500 on the same 2 cores) and {d['jobs']:,} jobs; "
              f"{d['scrapes']} scrapes {d['pace_s'] * 1000:.0f} ms apart per heartbeat interval. "
              "The controller's own cost is measured inside it (`xce_metrics_last_scrape_seconds`): "
              "`build` is collecting every family and writing the text, `build_cpu` the CPU of its "
              "event-loop thread for that (`time.thread_time`: its own work, whatever else the "
              "machine runs), `served` the connection accepted -> the reply handed to the kernel. "
              "The wall time is the scraper's (a client process on the same machine). The aim: "
              "`build_cpu` < 5 ms.", ""]
    for w in d["windows"]:
        rtt = w.get("heartbeat_rtt_ms_after") or {}
        lines += [f"**Heartbeat every {fmt(w['heartbeat_interval_s'], 0)} s**: "
                  f"{w.get('hosts_joined', 0):,} hosts joined in {fmt(w.get('join_s'), 0)} s, "
                  f"{w.get('worker_connections', 0):,} connected during the scrapes; "
                  f"{fmt(w['heartbeats_per_s'], 0)} heartbeats/s counted by the controller; the "
                  f"controller used {fmt(w['controller_cores'], 2)} cores, the simulators "
                  f"{fmt(w['simulators_cores'], 2)}; 1-minute load average "
                  f"{fmt(w['loadavg_1min'], 1)}; {w['bytes']:,} bytes a scrape; a heartbeat's round "
                  f"trip after the window p50 {fmt(rtt.get('p50'), 1)} ms, p99 "
                  f"{fmt(rtt.get('p99'), 1)} ms.", "", DIST_HEAD,
                  dist_row("controller CPU per scrape, `build_cpu` (ms)", w["build_cpu_ms"],
                           "< 5", 2),
                  dist_row("building the reply, wall, `build` (ms)", w["build_ms"], "", 2),
                  dist_row("accepted -> sent inside the controller, `served` (ms)",
                           w["served_ms"], "", 2),
                  dist_row("`GET /metrics` wall, from the scraper (ms)", w["scrape_wall_ms"], "",
                           2), ""]
    lines += ["`build` above `build_cpu` is time the controller's thread did not run while it "
              "built the reply (other processes held the cores); the wall time beyond `served` "
              "is time the scrape waited before the controller "
              "took its connection (its event loop busy with heartbeats, or the controller not "
              "running at all while the simulators held both cores) and the scraper's own "
              "scheduling: it follows the heartbeat rate and the machine's load, not the "
              "scrape's work.", ""]
    return lines


def main() -> int:
    """Write RESULTS.md."""
    import datetime as dt
    import os

    mine = {name: load(name) for name in MINE}
    lines = ["# xce benchmark results", "",
             f"Written by `python benchmarks/report.py` on {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} "
             f"({os.cpu_count()} cores). Regenerate everything with `python benchmarks/run_all.py` "
             "(one part: `--only failover|storm|throughput|failfast|hotpaths|flood|restfuzz`; "
             "small counts: `--quick`).",
             "Real processes, real loopback TCP, real SIGKILL; no simulated time, no mocks. The machine is "
             "shared (other engineers' tests run on it): figures are medians and percentiles, and they vary "
             "from run to run. Each section names the command, date and core count of the run it comes from.",
             ""]
    reruns = [n for n in ("rerun.md", "rerun-same-machine.md") if (RESULTS / n).exists()]
    if reruns:
        lines += ["run_all's headline figures against an earlier revision (`benchmarks/compare.py`): "
                  + ", ".join(f"[{n}](results/{n})" for n in reruns)
                  + " (the second with that revision's benchmarks re-run on this machine).", ""]
    lines += failover_section(mine["failover"])
    lines += storm_section(mine["storm"])
    lines += throughput_section(mine["throughput"])
    lines += failfast_section(mine["failfast"])
    lines += hotpaths_section(mine["hotpaths"])
    lines += flood_section(mine["flood"])
    lines += restfuzz_section(mine["restfuzz"])
    lines += others_section()
    lines += hung_section([(n, mine[n]) for n in ("failover-stop", "failover-stop-liveness3")],
                          {n: mine[f"{n}-baseline"] for n in ("failover-stop", "failover-stop-liveness3")})
    lines += chaos_section(mine["chaos"])
    lines += scale_section(mine["scale"])
    lines += auth_section(mine["auth"], mine["failover-munge"], mine["failover-key-sameload"])
    lines += tls_section(mine["tls"], mine["failover-tls"], mine["failover-sameload-tls"])
    lines += revoke_part(mine["revoke"])
    lines += arrays_section(mine["arrays"])
    lines += etcd_section(mine["failover-etcd"], mine["failover-stop-etcd"], mine["etcd"], mine["chaos-etcd"],
                          mine["failover-stop-liveness1-etcd"], mine["failover-poweroff-etcd"],
                          mine["failover-freeze-etcd"])
    lines += stream_section(mine["stream"])
    lines += events_section(mine["events"])
    lines += tasks_section(mine["tasks"])
    lines += metrics_section(mine["metrics"])
    OUT.write_text("\n".join(lines))
    print(f"[report] wrote {OUT.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
