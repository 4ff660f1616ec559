"""Accounting: sustained recording rate, and history queries over a large store end to end.

1. **Recording** (``record``): finished jobs per second through the role's ingestion path --
   each job's life as the controller pushes it (submitted, dispatched, started, finished:
   four versions), through the tracker and the pure core, committed in batches of
   ``batch_max`` rows by one writer, as the role's writer thread does. SQLite (WAL,
   synchronous=NORMAL) and PostgreSQL (a real server started here, fsync on, synchronous
   commit on). Repeated runs; medians.
2. **Queries** (``query``): a store of ``--rows`` finished attempts (4 events each) built
   *directly* in the database (bulk inserts, not through the role: say so), then a real
   controller and the accounting role on that store, and the delegated calls timed end to
   end through the controller from a client: ``history.summary`` and ``history.jobs`` for one
   user over 30 days (what ``xce acct -u USER --since 30d`` sends), ``history.job`` (``xce
   hist ID``); and the ``xce acct`` / ``xce hist`` commands as processes (wall time).

    python benchmarks/bench_accounting.py record --jobs 20000 --runs 5
    python benchmarks/bench_accounting.py query --rows 1000000 --backend sqlite
    python benchmarks/bench_accounting.py query --rows 10000000 --backend sqlite --keep /var/tmp/acct10m
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from xce_accounting.pgserver import PgServer
from xce_accounting.record import ATTEMPT_COLUMNS, View
from xce_accounting.store import Batch, Store
from xce_accounting.timeline import Tracker

USERS = 1000
DAYS = 90


@contextmanager
def open_store(backend: str, root: Path, keep: Path | None = None) -> Iterator[tuple[Store, dict[str, str]]]:
    """A fresh store (SQLite: or the one kept in ``keep``) and the ``[accounting]`` overrides
    that open it."""
    if backend == "sqlite":
        path = (keep or root) / "acct.db"
        yield Store.sqlite(path), {"backend": '"sqlite"', "path": f'"{path}"'}
        return
    server = PgServer(durable=True).start()
    try:
        yield Store.postgresql(server.dsn), {"backend": '"postgresql"', "dsn": f'"{server.dsn}"'}
    finally:
        server.stop()


# ------------------------------------------------------------------------------ recording


def job_versions(first: int, n: int, now: float) -> Iterator[dict[str, Any]]:
    """The four versions the controller pushes for each of ``n`` jobs."""
    for jobid in range(first, first + n):
        user = f"u{jobid % USERS}"
        j = {"jobid": jobid, "user": user, "queue": "normal", "project": "default", "name": "",
             "ntasks": 1, "state": "PEND", "attempt": 0, "alloc": [], "submit_time": now,
             "start_time": None, "end_time": None, "pend_reason": None, "usage": {},
             "command": "true", "resreq": ""}
        yield dict(j)
        j.update(state="RUN", alloc=[{"host": f"n{jobid % 100}", "ntasks": 1}])
        yield dict(j)
        j.update(start_time=now + 1, pid=1000)
        yield dict(j)
        j.update(state="DONE", end_time=now + 2, exit_status=0, usage={"cputime": 0.5, "max_mem": 10.0})
        yield dict(j)


def record_once(store: Store, first: int, n: int, batch_max: int) -> float:
    """Finished jobs per second for ``n`` jobs through tracker + core + batched writes."""
    tracker = Tracker(store.marks())
    now = time.time()
    versions = list(job_versions(first, n, now))  # made beforehand: pushes arrive decoded
    t0 = time.perf_counter()
    pending = Batch()
    for job in versions:
        pending.extend(tracker.on_job(job, now, store.views))
        if len(pending) >= batch_max:
            store.write(pending)
            pending = Batch()
    if len(pending):
        store.write(pending)
    elapsed = time.perf_counter() - t0
    return n / elapsed


def bench_record(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp, open_store(backend, Path(tmp)) as (store, _):
            rates = [record_once(store, 1 + i * args.jobs, args.jobs, args.batch_max)
                     for i in range(args.runs)]
            count = store._exec("SELECT count(*) FROM attempts").fetchone()[0]
            assert count == args.jobs * args.runs, count
            out[backend] = {"jobs_per_run": args.jobs, "runs": args.runs, "batch_max": args.batch_max,
                            "median_jobs_per_s": round(statistics.median(rates)),
                            "min_jobs_per_s": round(min(rates)), "max_jobs_per_s": round(max(rates))}
            print(f"record {backend}: median {out[backend]['median_jobs_per_s']:,} finished jobs/s "
                  f"(min {out[backend]['min_jobs_per_s']:,}, max {out[backend]['max_jobs_per_s']:,}; "
                  f"{args.runs} runs of {args.jobs:,})", flush=True)
            store.close()
    return out


# -------------------------------------------------------------------------------- queries


def build(store: Store, rows: int, now: float, chunk: int = 50_000) -> float:
    """``rows`` finished attempts and 4 events each, inserted directly; seconds taken."""
    rng = random.Random(7)
    t0 = time.perf_counter()
    span = DAYS * 86400
    for start in range(1, rows + 1, chunk):
        batch = Batch()
        ids = range(start, min(rows, start + chunk - 1) + 1)
        attempt_rows, events = [], []
        for jobid in ids:
            end = now - rng.random() * span
            wait, wall = rng.random() * 600, rng.random() * 3600
            st = end - wall
            ok = rng.random() > 0.1
            host = f"n{jobid % 500}"
            attempt_rows.append((jobid, 0, None, "", f"u{jobid % USERS}", f"q{jobid % 5}", f"p{jobid % 20}",
                                 st - wait, st, end, f",{host},", 1, "", "DONE" if ok else "EXIT",
                                 0 if ok else 1, None if ok else "exit status 1", wall * 0.9, 100.0,
                                 wall, wait, None, None, "true"))
            for seq, (kind, t) in enumerate((("submitted", st - wait), ("dispatched", st),
                                             ("started", st), ("finished", end)), 1):
                events.append((jobid, seq, 0, kind, t, f"u{jobid % USERS}", "{}",
                               orjson.dumps(View(0, "DONE", None, (host,), st, seq).to_json()).decode()))
        del batch
        if store.dialect == "postgresql":
            cur = store.conn.cursor()
            cols = ", ".join('"user"' if c == "user" else c for c in ATTEMPT_COLUMNS)
            with cur.copy(f"COPY attempts ({cols}) FROM STDIN") as cp:
                for r in attempt_rows:
                    cp.write_row(r)
            with cur.copy('COPY events (jobid, seq, attempt, kind, time, "user", detail, view) FROM STDIN') as cp:
                for e in events:
                    cp.write_row(e)
        else:
            store._begin()
            store._many(f"INSERT INTO attempts VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})", attempt_rows)
            store._many("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", events)
            store._commit()
        print(f"  built {ids[-1]:,} / {rows:,} attempts", end="\r", flush=True)
    if store.dialect == "postgresql":
        store._exec("ANALYZE")
    else:
        store._exec("ANALYZE")
    print()
    return time.perf_counter() - t0


def timed(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    fn()  # warm
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 2),
            "p90_ms": round(samples[int(0.9 * (len(samples) - 1))], 2), "max_ms": round(samples[-1], 2)}


def bench_query(args: argparse.Namespace) -> dict[str, Any]:
    from xcecore.client import SyncClient
    from xcecore.runtime import client_config, load
    from xcecore.testing import LocalCluster, wait_for

    now = time.time()
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, open_store(args.backend, Path(tmp), keep) as (store, conf):
        have = store._exec("SELECT count(*) FROM attempts").fetchone()[0]
        if have == args.rows and keep is not None:
            print(f"query {args.backend}: reusing the {have:,} attempts kept in {keep}", flush=True)
            build_s = float(json.loads((keep / "built.json").read_text())["build_s"])
            now = float(json.loads((keep / "built.json").read_text())["now"])
        else:
            if have:
                raise SystemExit(f"{keep}: holds {have:,} attempts, not {args.rows:,}: remove it")
            print(f"query {args.backend}: building {args.rows:,} attempts directly in the store", flush=True)
            build_s = build(store, args.rows, now)
            if keep is not None:
                (keep / "built.json").write_text(json.dumps({"build_s": build_s, "now": now}))
        store.close()
        cl = LocalCluster(Path(tmp) / "cluster", 1, extra_config='[controller]\nadmins = ["ops"]\n')
        try:
            cl.start()
            acct = cl.start_role("accounting", *(f"accounting.{k}={v}" for k, v in conf.items()))
            _, cfg = load(cl.config_path)
            # A front end: the history ops below name the users they act for.
            front = client_config(cfg, f"apiserver@{socket.gethostname()}")
            with SyncClient.open(front, role="apiserver") as c:
                def serving() -> bool:
                    try:
                        c.call("history.events", {"user": "ops", "limit": 1}, deadline=10)
                        return True
                    except Exception:
                        return False

                wait_for(serving, 120, what="the accounting role serves history")
                user, since = "u42", now - 30 * 86400
                summary = c.call("history.summary", {"user": user, "since": since}, deadline=30)
                jobid = args.rows // 2
                res = {
                    "rows": args.rows, "build_s": round(build_s, 1),
                    "user_rows_30d": summary["jobs"],
                    "acct_summary": timed(lambda: c.call("history.summary", {"user": user, "since": since},
                                                         deadline=30), args.runs),
                    "acct_first_page": timed(lambda: c.call("history.jobs", {"user": user, "since": since,
                                                                             "limit": 100}, deadline=30), args.runs),
                    "hist": timed(lambda: c.call("history.job", {"jobid": jobid, "user": f"u{jobid % USERS}"},
                                                 deadline=30), args.runs),
                }
            env = {**os.environ, "USER": user, "LOGNAME": user}
            if args.regular_venv:  # the commands as users run them: a regular (not -e) install
                sys.path.insert(0, str(Path(__file__).parent))
                from bench_cli import regular_install

                xce = [str(regular_install(Path(args.regular_venv))), "--config", str(cl.config_path)]
            else:
                xce = [sys.executable, "-m", "xcecore", "--config", str(cl.config_path)]
            res["cli_install"] = "regular" if args.regular_venv else "editable (this venv)"

            def run(cmd: list[str], who: dict[str, str]) -> None:
                done = subprocess.run(cmd, env=who, capture_output=True, text=True, timeout=60)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr)

            res["cli_acct"] = timed(lambda: run([*xce, "acct", "-u", user, "--since", "30d"], env), 5)
            res["cli_jobs_baseline"] = timed(lambda: run([*xce, "jobs"], env), 5)  # a built-in command
            owner = f"u{jobid % USERS}"
            res["cli_hist"] = timed(lambda: run([*xce, "hist", str(jobid)],
                                                {**os.environ, "USER": owner, "LOGNAME": owner}), 5)
            assert acct.alive(), acct.text()[-2000:]
        finally:
            cl.close()
    print(f"query {args.backend} at {args.rows:,} rows (built directly in {res['build_s']} s; "
          f"{res['user_rows_30d']} rows for the user in 30 d):")
    for key in ("acct_summary", "acct_first_page", "hist", "cli_acct", "cli_hist", "cli_jobs_baseline"):
        print(f"  {key:16} median {res[key]['median_ms']:8.2f} ms  p90 {res[key]['p90_ms']:8.2f} ms")
    return {args.backend: res}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record")
    r.add_argument("--jobs", type=int, default=20000)
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--batch-max", type=int, default=5000)
    r.add_argument("--backends", default="sqlite,postgresql")
    q = sub.add_parser("query")
    q.add_argument("--rows", type=int, default=1_000_000)
    q.add_argument("--runs", type=int, default=50)
    q.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql"])
    q.add_argument("--regular-venv", default=None, help="time the xce commands from a regular "
                   "install in this venv (made on first use, as bench_cli.py does)")
    q.add_argument("--keep", default=None, help="SQLite: build the store in this directory once and "
                   "reuse it on later runs (a 10M-row build takes about an hour)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "accounting.json"))
    args = p.parse_args()
    res = bench_record(args) if args.what == "record" else bench_query(args)
    out = Path(args.out)
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.setdefault(args.what, {}).update(res)
    # Each part's command and date (the report shows them beside the figures).
    import datetime as dt

    runs = merged.setdefault("runs", {})
    runs[args.what] = {"command": "python " + " ".join(sys.argv),
                       "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    merged["meta"] = {"date": max(r["date"] for r in runs.values()), "cores": os.cpu_count(),
                      "command": "; ".join(f"{k}: {v['command']}" for k, v in sorted(runs.items()))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
