"""Fail-fast: how quickly the API server answers 503 while the controller is gone.

Run from the repository root::

    python benchmarks/bench_failfast.py [--quick]

Three candidates and the API server (``degraded_ttl`` 60 s so the window outlasts the
measurement) run as real processes. Every candidate is SIGKILLed; one ``POST /xce/v1/jobs``
then waits out the backend's retry budget and marks the backend degraded (its duration is
reported too); after that, batches of ``POST /jobs`` are timed from a keep-alive HTTP client
(the figure includes the client's own HTTP overhead). Target: p99 <= 5 ms. Writes
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


def measure(url: str, token: str, batches: int, per_batch: int) -> dict[str, Any]:
    """Degrade the API server's backend, then time batches of 503 answers."""
    import httpx

    body = {"command": "true", "queue": "parked"}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        return _degraded(http, body, batches, per_batch)


def _degraded(http: Any, body: dict[str, Any], batches: int, per_batch: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    first = http.post("/jobs", json=body)
    to_degraded = time.perf_counter() - t0
    if first.status_code != 503:
        raise RuntimeError(f"expected 503 once the controller is gone, got {first.status_code}")
    lat: list[float] = []
    medians: list[float] = []
    others: dict[int, int] = {}
    for _ in range(batches):
        batch = []
        for _ in range(per_batch):
            t = time.perf_counter()
            r = http.post("/jobs", json=body)
            batch.append((time.perf_counter() - t) * 1e3)
            if r.status_code != 503:
                others[r.status_code] = others.get(r.status_code, 0) + 1
        lat += batch
        medians.append(stats(batch)["p50"])
    retry_after = first.headers.get("retry-after")
    return {"first_request_to_503_s": round(to_degraded, 3), "retry_after_header": retry_after,
            "latency_503_ms": stats(lat, 3), "batch_medians_ms": medians,
            "non_503_answers": others, "requests": len(lat)}


def main(argv: list[str] | None = None) -> int:
    """Run the fail-fast benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts")
    args = ap.parse_args(argv)
    quiet_logs()
    batches, per_batch = (3, 200) if args.quick else (5, 1000)
    with tempfile.TemporaryDirectory(prefix="xce-bench-ff-") as tmp:
        bc = BenchCluster(Path(tmp), api=True, degraded_ttl=60.0)
        try:
            bc.start()
            bc.start_role("apiserver")
            bc.wait_logged("apiserver", "serving it", 60)
            url = bc.api_url()
            import httpx

            token = logon(url)
            r = httpx.post(f"{url}/jobs", json={"command": "true", "queue": "parked"},
                           headers={"authorization": f"Bearer {token}"}, timeout=30)
            r.raise_for_status()
            for proc in bc.cluster.candidates.values():
                proc.kill()
            log(PART, "every candidate SIGKILLed; degrading the API server's backend")
            out = measure(url, token, batches, per_batch)
        except BaseException:
            print(bc.cluster.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            bc.close()
    result = {**meta(), **out, "target": "p99 <= 5 ms"}
    write_result(PART, result)
    s = out["latency_503_ms"]
    log(PART, f"503 latency p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms; "
              f"first 503 after {out['first_request_to_503_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
