"""Fail-fast: how quickly the API server answers 503 while the controller is gone.

Run from the repository root::

    python benchmarks/bench_failfast.py [--quick] [--window 15] [--trials 5]

Three candidates and the API server (default ``failover_grace``, 0.25 s) run as real
processes. Per trial, every candidate is SIGKILLed and:

- *first write of the outage*: one ``POST /xce/v1/jobs`` sent right after the kills (the
  breaker cannot know yet; it waits at most the grace), or
- *breaker opens without a write*: ``/readyz`` polled until it answers 503 (the heartbeats'
  failing reconnects open it), timed from the kill;

then (first trial) writes are sent back to back for ``--window`` seconds, longer than the old
degraded window (5 s) that made one write in every ~6.5 s slow, each one timed from a
keep-alive HTTP client (the figure includes the client's own HTTP overhead); finally one
candidate is restarted and the time until ``/readyz`` is 200 again (heartbeat recovery, no
write probing) and the first write succeeds is measured. Target: every write while degraded
p99 <= 5 ms and max well under the grace; no first slow write beyond the grace. Writes
``benchmarks/results/failfast.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BenchCluster, log, logon, meta, quiet_logs, stats, write_result

PART = "failfast"
BODY = {"command": "true", "queue": "parked"}


def _kill_all(bc: BenchCluster) -> float:
    for proc in bc.cluster.candidates.values():
        proc.kill()
    return time.perf_counter()


def _poll(http: Any, path: str, status: int, timeout: float, interval: float = 0.002) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if http.get(path).status_code == status:
            return time.perf_counter()
        time.sleep(interval)
    raise TimeoutError(f"{path} never answered {status} within {timeout} s")


def _restart(bc: BenchCluster, http: Any) -> dict[str, float]:
    """Start candidate 0 again: seconds until readyz 200 and until a write is accepted."""
    t0 = time.perf_counter()
    bc.cluster.start_candidate(0)
    bc.cluster.wait_primary(60)
    up = time.perf_counter()
    ready = _poll(http, "/readyz", 200, 60, 0.005)
    while http.post("/jobs", json=BODY).status_code != 200:
        time.sleep(0.005)
    write = time.perf_counter()
    for i in range(1, len(bc.cluster.ports)):  # the standbys, for the next trial's kill
        bc.cluster.start_candidate(i)
        bc.cluster.wait_state(i, "standby", 60)
    return {"primary_up_s": round(up - t0, 3), "readyz_200_after_primary_s": round(ready - up, 3),
            "first_write_ok_after_primary_s": round(write - up, 3)}


def _sustained(http: Any, window: float) -> dict[str, Any]:
    lat: list[float] = []
    others: dict[int, int] = {}
    end = time.perf_counter() + window
    while time.perf_counter() < end:
        t = time.perf_counter()
        r = http.post("/jobs", json=BODY)
        lat.append((time.perf_counter() - t) * 1e3)
        if r.status_code != 503:
            others[r.status_code] = others.get(r.status_code, 0) + 1
    return {"latency_503_ms": stats(lat, 3), "slow_over_50ms": sum(x > 50 for x in lat),
            "non_503_answers": others, "window_s": window}


def measure(bc: BenchCluster, url: str, token: str, trials: int, window: float) -> dict[str, Any]:
    """The trials: alternately a write right after the kills and readyz polling."""
    import httpx

    first: list[float] = []
    first_status: dict[int, int] = {}
    opened: list[float] = []
    recoveries: list[dict[str, float]] = []
    sustained: dict[str, Any] = {}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        for trial in range(trials):
            if http.post("/jobs", json=BODY).status_code != 200:
                raise RuntimeError("the cluster does not accept writes before the kill")
            killed = _kill_all(bc)
            if trial % 2 == 0:
                r = http.post("/jobs", json=BODY)
                first.append((time.perf_counter() - killed) * 1e3)
                first_status[r.status_code] = first_status.get(r.status_code, 0) + 1
                _poll(http, "/readyz", 503, 30)
            else:
                opened.append((_poll(http, "/readyz", 503, 30) - killed) * 1e3)
            if trial == 0:
                log(PART, f"breaker open; {window:g} s of back-to-back writes")
                sustained = _sustained(http, window)
            recoveries.append(_restart(bc, http))
            log(PART, f"trial {trial + 1}/{trials} done")
    return {"first_write_after_kill_ms": stats(first, 1), "first_write_status": first_status,
            "kill_to_readyz_503_ms": stats(opened, 1), **sustained,
            "recovery": {k: stats([r[k] for r in recoveries], 3) for k in recoveries[0]},
            "trials": trials}


def main(argv: list[str] | None = None) -> int:
    """Run the fail-fast benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 trials, 5 s window")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--window", type=float, default=15.0)
    args = ap.parse_args(argv)
    quiet_logs()
    trials, window = (2, 5.0) if args.quick else (args.trials, args.window)
    with tempfile.TemporaryDirectory(prefix="xce-bench-ff-") as tmp:
        bc = BenchCluster(Path(tmp), api=True)
        try:
            bc.start()
            bc.start_role("apiserver")
            bc.wait_logged("apiserver", "serving it", 60)
            url = bc.api_url()
            out = measure(bc, url, logon(url), trials, window)
        except BaseException:
            print(bc.cluster.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            bc.close()
    result = {**meta(), **out, "grace_s": 0.25, "target": "p99 <= 5 ms; first write <= grace"}
    write_result(PART, result)
    s = out["latency_503_ms"]
    log(PART, f"503 latency p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms over {s['n']} "
              f"writes ({out['slow_over_50ms']} over 50 ms); first write after the kill "
              f"{out['first_write_after_kill_ms'].get('p50')} ms; readyz 503 after "
              f"{out['kill_to_readyz_503_ms'].get('p50')} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
