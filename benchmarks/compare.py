"""Compare the headline figures of ``run_all.py``'s parts with those of an earlier revision.

Run from the repository root, after ``python benchmarks/run_all.py``::

    python benchmarks/compare.py --before 8db5179          # writes benchmarks/results/rerun.md
    python benchmarks/compare.py --before 8db5179 --before-dir ../old/benchmarks/results \
        --out ab.md                                          # the old code re-run on this machine

Each part's "before" is its results file at ``--before`` (git), or, for a part that did not
exist yet there, the first version of it that git has; with ``--before-dir``, the file of that
name in that directory when there is one (a checkout of the old revision whose benchmarks were
run again on the same machine: the fair comparison when the machine changed). "After" is the
working tree's file.
Every figure is read from the two JSON files; nothing is typed in. A figure that a file lacks
is shown as "-". The change is after/before - 1, and the last column says whether it moved
the way that is better (lower latencies, higher rates).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import RESULTS, ROOT
from report import flatten, fmt

LOW, HIGH = "lower", "higher"
# part (results file): (label, flattened key, unit, which way is better)
FIGURES: dict[str, list[tuple[str, str, str, str]]] = {
    "failover": [
        ("SIGKILL -> first acknowledged write, p50", "summary.first_write_ms.p50", "ms", LOW),
        ("SIGKILL -> first acknowledged write, p99", "summary.first_write_ms.p99", "ms", LOW),
        ("every role re-joined, p50", "summary.all_rejoined_ms.p50", "ms", LOW),
    ],
    "failover-stop": [
        ("SIGSTOP -> first acknowledged write, p50", "summary.first_write_ms.p50", "ms", LOW),
        ("SIGSTOP -> first acknowledged write, p99", "summary.first_write_ms.p99", "ms", LOW),
    ],
    "failover-stop-liveness3": [
        ("SIGSTOP, liveness 3 s -> first write, p50", "summary.first_write_ms.p50", "ms", LOW),
    ],
    "throughput": [
        ("library, sequential, 1 client", "library.sequential_1_client.jobs_per_s.median", "/s", HIGH),
        ("library, pipelined, 1 client", "library.pipelined_1_client_256_inflight.jobs_per_s.median", "/s", HIGH),
        ("library, sequential, 8 clients", "library.sequential_8_clients.jobs_per_s.median", "/s", HIGH),
        ("library, pipelined, 8 clients", "library.pipelined_8_clients_32_inflight.jobs_per_s.median", "/s", HIGH),
        ("REST, sequential", "rest.sequential_1_http_client.jobs_per_s.median", "/s", HIGH),
        ("REST, 16 in flight", "rest.concurrent_16_inflight.jobs_per_s.median", "/s", HIGH),
        ("submit -> RUN", "dispatch.submit_to_run_ms.median", "ms", LOW),
    ],
    "failfast": [
        ("POST /jobs 503 while the primary is down, p50", "latency_503_ms.p50", "ms", LOW),
        ("first write after the kill, p50", "first_write_after_kill_ms.p50", "ms", LOW),
    ],
    "hotpaths": [
        ("client's post-call check (net)", "post_call.inline_check.ns_net.median", "ns", LOW),
        ("controller edge: heartbeat", "controller_edge.heartbeat.us.median", "us", LOW),
        ("controller edge: jobsubmit", "controller_edge.jobsubmit.us.median", "us", LOW),
    ],
    "flood": [
        ("jobinfo flood, bounded: RSS peak", "scenarios.jobinfo (bounded).rss_peak_mb.median", "MB", LOW),
        ("jobinfo flood, bounded: other client p50",
         "scenarios.jobinfo (bounded).other_client_p50_ms.median", "ms", LOW),
        ("deaf members, bounded: RSS peak", "scenarios.deaf members (bounded).rss_peak_mb.median", "MB", LOW),
    ],
    "restfuzz": [
        ("responses 5xx", "responses_5xx", "", LOW),
        ("cases with failures", "cases_with_failures", "", LOW),
    ],
    "chaos": [
        ("faults survived", "summary.faults_survived", "", HIGH),
        ("faults applied", "summary.faults", "", HIGH),
        ("kill-primary outage, p50", "summary.by_kind.kill-primary.outage_ms.p50", "ms", LOW),
    ],
    "storm": [
        ("10,000 workers: all joined", "sizes.10000.join_storm.seconds_to_all_joined", "s", LOW),
        ("10,000 workers: all re-joined a new primary (median)",
         "sizes.10000.rejoin_rounds.median_seconds_to_all_rejoined", "s", LOW),
        ("10,000 workers: controller CPU per heartbeat",
         "sizes.10000.steady.controller_cpu_us_per_heartbeat", "us", LOW),
    ],
    "connection": [
        ("client calls/s, sequential", "throughput.sequential_rps.median", "/s", HIGH),
        ("client calls/s, 64 in flight", "throughput.pipelined_64_rps.median", "/s", HIGH),
        ("connect via a standby's redirect", "redirect.via_standby_redirect_ms.median", "ms", LOW),
    ],
    "controller": [
        ("durable submits/s, sequential", "throughput.sequential_per_s", "/s", HIGH),
        ("durable submits/s, pipelined, 1 client", "throughput.pipelined_1_client_per_s", "/s", HIGH),
        ("SIGKILL -> first acked write", "promotion.kill_to_first_acked_write_ms.median", "ms", LOW),
    ],
    "resreq": [
        ("compile, cold", "results.compile_cold.median", "us", LOW),
        ("select over 10,000 hosts", "results.select_10000.median", "us", LOW),
    ],
    "scheduler": [
        ("cycle, 10k jobs x 1k hosts, warm", "results.cycle_warm.median", "ms", LOW),
        ("submit -> dispatch", "results.submit_to_dispatch.median", "ms", LOW),
    ],
    "apiserver": [
        ("POST /jobs in-process ASGI, p50", "in_process_asgi.post_jobs.p50_ms", "ms", LOW),
        ("POST /jobs real HTTP, sequential", "real_http_loopback.post_jobs_sequential.rps", "/s", HIGH),
        ("POST /jobs real HTTP, 8 in flight", "real_http_loopback.post_jobs_8_in_flight.rps", "/s", HIGH),
    ],
    "cli": [
        ("`xce jobs`, regular install, p50", "results.regular | xce jobs (empty cluster).p50", "ms", LOW),
        ("`xce submit -- true`, regular install, p50", "results.regular | xce submit -- true.p50", "ms", LOW),
        ("`xce --help`, regular install, p50", "results.regular | xce --help.p50", "ms", LOW),
    ],
}


def git_json(rev: str, path: str) -> dict[str, Any] | None:
    """The JSON file ``path`` at ``rev``, or None where git has no such file there."""
    proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def first_version(path: str) -> str | None:
    """The commit that first added ``path``."""
    proc = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h", "--", path], cwd=ROOT,
                          capture_output=True, text=True)
    revs = proc.stdout.split()
    return revs[-1] if revs else None


def when(d: dict[str, Any]) -> str:
    """The date a results file records (top level or under ``meta``)."""
    date = d.get("date") or (d.get("meta") or {}).get("date") or "?"
    return str(date)[:16].replace("T", " ")


def change(before: Any, after: Any, better: str) -> tuple[str, str]:
    """The relative change and whether it went the better way (or stayed within 10 %)."""
    if not isinstance(before, int | float) or not isinstance(after, int | float):
        return "", ""
    if before == after:
        return "0 %", "same"
    if before == 0:
        return "", "better" if (after < before) == (better == LOW) else "worse"
    rel = after / before - 1
    improved = (rel < 0) == (better == LOW)
    verdict = "better" if improved else ("within 10 %" if abs(rel) <= 0.10 else "worse")
    return f"{rel * 100:+.0f} %", verdict


def table(before_rev: str, before_dir: Path | None = None, command: str = "") -> list[str]:
    """The comparison as markdown lines."""
    out = [f"# `run_all.py` re-run against revision `{before_rev}`", "",
           f"Generated by `{command}` from the results files: before = "
           + (f"the file of revision {before_rev}'s checkout re-run on this machine, where "
              "there is one, else " if before_dir else "")
           + "the file at that revision (or its first version in git, for a part added "
           "later), after = the current file. Better = lower latencies, higher rates.", "",
           "| part | figure | before | after | change | |", "|---|---|---|---|---|---|"]
    for part, figures in FIGURES.items():
        path = f"benchmarks/results/{part}.json"
        rerun = before_dir / f"{part}.json" if before_dir else None
        old = json.loads(rerun.read_text()) if rerun and rerun.exists() else git_json(before_rev, path)
        old_rev = f"{before_rev} re-run" if rerun and rerun.exists() else before_rev
        if old is None:
            first = first_version(path)
            old, old_rev = (git_json(first, path), first) if first else (None, "-")
        new_file = RESULTS / f"{part}.json"
        new = json.loads(new_file.read_text()) if new_file.exists() else None
        fo, fn = flatten(old) if old else {}, flatten(new) if new else {}
        for i, (label, key, unit, better) in enumerate(figures):
            b, a = fo.get(key), fn.get(key)
            rel, verdict = change(b, a, better)
            head = f"{part} ({old_rev}, {when(old) if old else '-'} → {when(new) if new else '-'})" if i == 0 else ""
            out.append(f"| {head} | {label} | {fmt(b)} {unit if b is not None else ''} | "
                       f"{fmt(a)} {unit if a is not None else ''} | {rel} | {verdict} |")
    return out


def main(argv: list[str] | None = None) -> int:
    """Write ``benchmarks/results/rerun.md`` and print it."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git revision to compare with")
    ap.add_argument("--before-dir", type=Path, default=None,
                    help="results of that revision re-run on this machine (a checkout's benchmarks/results)")
    ap.add_argument("--out", default="rerun.md", help="file name under benchmarks/results/")
    args = ap.parse_args(argv)
    command = "python benchmarks/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(table(args.before, args.before_dir, command)) + "\n"
    (RESULTS / args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
