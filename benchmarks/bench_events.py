"""Cluster events at a large history: ``xce events`` and the ``events`` op with 100,000 events kept.

The history is made as the controller stores it: ``--events`` rows in the ``events`` table of
a fresh state directory (the SQLite store's own writer, one transaction), then one real
controller candidate starts on it and loads them (the figure of that load is read from its
log). Then, against that process over loopback:

- ``xce events`` (the newest 20), ``xce events --kind queue_state -n 100`` and
  ``xce events --since 1h --json`` (every event: 100 pages of 1,000) are each run ``--runs``
  times as fresh processes, beside ``xce queues`` (one call of another op: the floor of a
  command on the same machine at the same moment): wall ms;
- the ``events`` op through one client (a page of 100 from a cursor in the middle, a page of
  a rare kind): round-trip ms;
- the controller's own cost of one page, :meth:`EventLog.page` on a log of the same size in
  this process: µs (what the op costs the controller's loop besides framing).

Run: ``python benchmarks/bench_events.py [--events N] [--runs N]``. Writes
``benchmarks/results/events.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from benchkit import meta, stats, write_result
from xce_controller.events import EventLog, row_key
from xce_controller.store import SQLiteStore, Write

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing.cluster import LocalCluster, wait_for

KINDS = ("host_state", "member_join", "member_leave", "queue_state")


def make_log(n: int, t0: float) -> EventLog:
    """``n`` events as the controller records them (a rare kind every 1,000th)."""
    log = EventLog(retention=30 * 86400.0, cap=n + 1000)
    for i in range(n):
        if i % 1000 == 999:
            log.record("queue_state", t0 + i * 0.01, queue="normal", state="closed", by="root")
        else:
            log.record(KINDS[i % 3], t0 + i * 0.01, host=f"node{i % 5000:05d}", state="closed",
                       identity=f"worker@node{i % 5000:05d}", role="worker", candidate="ctl")
    return log


def seed(state_dir: Path, log: EventLog) -> None:
    """Store the log's events in a fresh state directory, as the controller writes them."""
    store = SQLiteStore(str(state_dir))
    store.open()
    try:
        rows = [("events", row_key(ev["seq"]), orjson.dumps(ev), None) for ev in log.take_unsaved()]
        store.commit_now([Write(rows)])
    finally:
        store.close()


def time_page(log: EventLog, runs: int) -> dict[str, dict[str, float]]:
    """µs of one page from the pure log (the controller's part of the op)."""
    mid = log.seq // 2
    cases = {"page100_from_middle": dict(since_seq=mid, limit=100),
             "newest20": dict(limit=20, last=True),
             "rare_kind_page100": dict(kind="queue_state", limit=100),
             "since_time_page1000": dict(since_time=float(log.page(since_seq=mid)["events"][0]["time"]),
                                         limit=1000)}
    out: dict[str, dict[str, float]] = {}
    for name, args in cases.items():
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            log.page(**args)  # type: ignore[arg-type]
            times.append((time.perf_counter() - t0) * 1e6)
        out[name] = stats(times, 1)
    return out


def main() -> None:
    """Seed, start, measure, write benchmarks/results/events.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20)
    opts = parser.parse_args()
    t0 = time.time() - opts.events * 0.01 - 60
    log = make_log(opts.events, t0)
    page_us = time_page(log, max(opts.runs, 200))
    root = Path(tempfile.mkdtemp(prefix="xce-bench-events-"))
    admin = os.environ.get("USER", "root")
    cluster = LocalCluster(root, 1, extra_config=f'[controller]\nadmins = ["{admin}"]\n'
                                                 f"events_max = {opts.events + 10_000}\n"
                                                 'events_retention = "30d"\n')
    seed(cluster.state_dir, log)
    result: dict[str, object] = {"meta": meta(), "events": opts.events, "runs": opts.runs,
                                 "page_us": page_us}
    try:
        cluster.start()
        _, cfg = load(cluster.config_path)
        with SyncClient.open(client_config(cfg, "cli@bench"), role="cli") as c:
            def loaded() -> bool:
                try:
                    return int(c.call("events", {"limit": 1, "last": True}, deadline=10)["newest"]) >= opts.events
                except Exception:
                    return False

            wait_for(loaded, 120, what="the events loaded")
            rtt: dict[str, list[float]] = {"op_page100_from_middle": [], "op_rare_kind_page100": []}
            for _ in range(max(opts.runs, 100)):
                for name, args in (("op_page100_from_middle", {"since_seq": opts.events // 2, "limit": 100}),
                                   ("op_rare_kind_page100", {"kind": "queue_state", "limit": 100})):
                    s = time.perf_counter()
                    c.call("events", args, deadline=10)
                    rtt[name].append((time.perf_counter() - s) * 1000)
            result["op_ms"] = {k: stats(v, 3) for k, v in rtt.items()}
        found = re.search(r"loaded (\d+) cluster events in (\d+) ms", cluster.logs())
        result["load_ms"] = float(found.group(2)) if found else None
        env = {**os.environ, "XCE_CONFIG": str(cluster.config_path)}
        commands = {"xce_events": ["events"], "xce_events_kind_n100": ["events", "--kind", "queue_state", "-n", "100"],
                    "xce_events_since_json": ["events", "--since", "1h", "--json"],
                    "xce_queues_reference": ["queues"]}  # one call of another op: the floor
        wall: dict[str, list[float]] = {k: [] for k in commands}
        for cmd in commands.values():  # warm-up (bytecode cached)
            subprocess.run([sys.executable, "-m", "xcecore", *cmd], env=env, capture_output=True, check=True)
        for _ in range(opts.runs):
            for name, cmd in commands.items():
                s = time.perf_counter()
                subprocess.run([sys.executable, "-m", "xcecore", *cmd], env=env, capture_output=True, check=True)
                wall[name].append((time.perf_counter() - s) * 1000)
        result["wall_ms"] = {k: stats(v, 1) for k, v in wall.items()}
        s = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        result["python_floor_ms"] = round((time.perf_counter() - s) * 1000, 1)
    finally:
        cluster.close()
    write_result("events", result)
    md = [f"# Cluster events at {opts.events:,} events (`bench_events.py`)", "",
          f"`{result['meta']['command']}` on {result['meta']['date']} "  # type: ignore[index]
          f"({result['meta']['cores']} cores, shared machine: pessimistic).", "",  # type: ignore[index]
          "| figure | p50 | p90 | max |", "|---|---|---|---|"]
    for group, unit in (("wall_ms", "ms"), ("op_ms", "ms"), ("page_us", "µs")):
        for name, st in result[group].items():  # type: ignore[attr-defined]
            md.append(f"| {name} ({unit}) | {st['p50']} | {st['p90']} | {st['max']} |")
    md += ["", f"Load of the stored events at promotion: {result.get('load_ms')} ms."]
    (Path(__file__).parent / "results" / "events.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
