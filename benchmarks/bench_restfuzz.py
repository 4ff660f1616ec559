"""REST conformance under a long schemathesis run against a real cluster.

Run from the repository root::

    python benchmarks/bench_restfuzz.py [--examples 150] [--quick]

Three controller candidates and the API server run as real processes; the schemathesis CLI
(``schemathesis run --checks all --continue-on-failure``) fuzzes every operation of the API
server's own OpenAPI document over real HTTP, valid and invalid data alike (its coverage and
fuzzing phases), logged on as an administrator through ``benchmarks/restfuzz_hooks.py`` (which
also checks that every 4xx says why and every 422 names its field). Reported: the cases
generated, the responses by status class, the number of 5xx responses, and the failures by
check (response-schema violations among them), from schemathesis's JSON and HAR reports.
Aim: 0 responses with status 5xx and 0 failures. Writes ``benchmarks/results/restfuzz.json``.
The CI test ``tests/apiserver/test_api_conformance.py`` runs the same checks in-process with
a few examples per operation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BENCH_PASSWORD, BENCH_USER, BenchCluster, log, meta, quiet_logs, write_result

PART = "restfuzz"
HERE = Path(__file__).resolve().parent


def fuzz(url: str, examples: int, out: Path, timeout: float, phases: str = "") -> dict[str, Any]:
    """Run the schemathesis CLI against ``url``; the figures of its reports."""
    exe = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    report, har = out / "report.json", out / "cases.har"
    cmd = [exe, "--config-file", str(HERE / "restfuzz.toml"), "run", f"{url}/openapi.json",
           "--checks", "all", "--continue-on-failure", "--max-examples", str(examples),
           "--workers", "1", "--seed", "1", "--report", "json,har",
           "--report-json-path", str(report), "--report-har-path", str(har),
           *(["--phases", phases] if phases else [])]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "restfuzz_hooks",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "XCE_FUZZ_URL": url, "XCE_FUZZ_USER": BENCH_USER, "XCE_FUZZ_PASSWORD": BENCH_PASSWORD}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if not report.exists():
        raise RuntimeError(f"schemathesis wrote no report (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    statuses: Counter[int] = Counter()
    server_errors: list[dict[str, Any]] = []  # what a 5xx answered, for the post-mortem
    for entry in json.loads(har.read_text())["log"]["entries"]:
        status = int(entry["response"]["status"])
        statuses[status] += 1
        if status >= 500 and len(server_errors) < 10:
            req = entry["request"]
            server_errors.append({"method": req["method"], "url": req["url"][:500],
                                  "body": ((req.get("postData") or {}).get("text") or "")[:500],
                                  "status": status,
                                  "answer": ((entry["response"].get("content") or {}).get("text") or "")[:500]})
    by_check: Counter[str] = Counter()
    details: list[str] = []
    for failure in data.get("failures", []):
        by_check[str(failure.get("title") or failure.get("code") or failure)] += 1
        details.append(json.dumps(failure, default=str)[:1500])
    cases = data["test_cases"]
    return {
        "cases": cases["generated"], "cases_with_failures": cases["with_failures"],
        "unique_failures": cases["unique_failures"], "errored": cases["errored"],
        "responses": sum(statuses.values()),
        "responses_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "status_classes": {f"{c}xx": sum(n for s, n in statuses.items() if s // 100 == c)
                           for c in (2, 3, 4, 5)},
        "statuses": dict(sorted(statuses.items())),
        "failures_by_check": dict(by_check),
        "failures": details[:20],
        "operations_tested": data["operations"]["tested"],
        "errors": [str(e)[:300] for e in data.get("errors", [])][:10],
        "schemathesis_exit": proc.returncode, "seconds": round(took, 1),
        "examples_per_operation": examples, "server_errors": server_errors,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the REST fuzzing benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=150, help="max examples per operation and phase")
    ap.add_argument("--quick", action="store_true", help="10 examples per operation")
    ap.add_argument("--timeout", type=float, default=5400, help="seconds the fuzzing may take")
    ap.add_argument("--phases", default="", help="schemathesis phases (default: all of them)")
    args = ap.parse_args(argv)
    quiet_logs()
    examples = 10 if args.quick else args.examples
    with tempfile.TemporaryDirectory(prefix="xce-bench-rf-") as tmp:
        bc = BenchCluster(Path(tmp), api=True, hash_iterations=1000)
        try:
            bc.start()
            # The history routes are answered by the accounting role (503 without one): a real
            # one on SQLite, so they are fuzzed too.
            bc.start_role("accounting", f'accounting.path="{Path(tmp) / "acct.db"}"')
            bc.start_role("apiserver")
            bc.wait_logged("accounting", "joined as", 60)
            bc.wait_logged("apiserver", "serving it", 60)
            url = bc.api_url()
            log(PART, f"fuzzing {url} with schemathesis, {examples} examples per operation")
            out = fuzz(url, examples, Path(tmp), args.timeout, args.phases)
            api_alive = bc.roles["apiserver"].alive()
            api_log = bc.roles["apiserver"].text()
            reconnects = api_log.count("lost connection")
            out["apiserver_errors"] = [line[:400] for line in api_log.splitlines()
                                       if " ERROR " in line or "Traceback" in line][:10]
        except BaseException:
            print(bc.cluster.logs()[-6000:], file=sys.stderr)
            raise
        finally:
            bc.close()
    result = {**meta(), **out, "apiserver_alive_after": api_alive,
              "apiserver_lost_controller_connection": reconnects,
              "target": "0 responses 5xx, 0 failures"}
    write_result(PART, result)
    log(PART, f"{out['cases']:,} cases, {out['responses']:,} responses, {out['responses_5xx']} 5xx, "
              f"{out['cases_with_failures']} cases with failures {out['failures_by_check'] or ''}; "
              f"{out['seconds']} s")
    return 0 if out["responses_5xx"] == 0 and out["cases_with_failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
