"""Run the scale benchmarks and write ``benchmarks/RESULTS.md``.

Run from the repository root::

    python benchmarks/run_all.py                  # everything (about 20 minutes)
    python benchmarks/run_all.py --quick          # small counts (a few minutes)
    python benchmarks/run_all.py --only failover  # one part (comma-separated for several)
    python benchmarks/run_all.py --only failover --kills 20

Parts: hotpaths, flood, throughput, failfast, restfuzz, failover, failover-stop and
failover-stop-liveness3 (a SIGSTOPped primary), chaos (seeded faults on the fault test bed;
needs root), storm (the headline figures), then connection, controller, resreq, scheduler,
apiserver, cli (each component's own). Each runs as its own process (its own
command line is what its results file records); a failing part is reported and the others
still run. The report is rewritten at the end from every results file present.
Optional dependencies: ``pip install -r benchmarks/requirements.txt`` (matplotlib, psutil).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS: dict[str, tuple[Any, ...]] = {  # name: (script, timeout in s, its arguments under
    # --quick[, its arguments always])
    "hotpaths": ("bench_hotpaths.py", 300, ["--quick"]),
    "flood": ("bench_flood.py", 900, ["--quick"]),
    "throughput": ("bench_throughput.py", 600, ["--quick"]),
    "failfast": ("bench_failfast.py", 300, ["--quick"]),
    "restfuzz": ("bench_restfuzz.py", 5400, ["--quick"]),
    "failover": ("bench_failover.py", 900, ["--quick"]),
    "failover-stop": ("bench_failover.py", 1200, ["--quick"], ["--fault", "stop", "--kills", "30"]),
    "failover-stop-liveness3": ("bench_failover.py", 1200, ["--quick"],
                                ["--fault", "stop", "--kills", "30", "--liveness", "3"]),
    "chaos": ("bench_chaos.py", 3600, ["--quick"]),  # needs root (the fault test bed)
    "storm": ("bench_storm.py", 1500, ["--quick"]),
    "connection": ("bench_connection.py", 600, ["--quick"]),
    "controller": ("bench_controller.py", 600, ["--quick"]),
    "resreq": ("bench_resreq.py", 600, ["--quick"]),
    "scheduler": ("bench_scheduler.py", 600, ["--quick"]),
    "apiserver": ("bench_apiserver.py", 600, ["--repeat", "2"]),
    "cli": ("bench_cli.py", 600, ["--runs", "5"]),
}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, then the report; non-zero exit if any part failed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma-separated parts: {', '.join(PARTS)}")
    ap.add_argument("--quick", action="store_true", help="small counts everywhere")
    ap.add_argument("--kills", type=int, default=None, help="failover: SIGKILLs (default 50)")
    ap.add_argument("--sizes", default=None, help="storm: worker counts (default 1000,10000)")
    args = ap.parse_args(argv)
    chosen = [p.strip() for p in args.only.split(",") if p.strip()] or list(PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    failed: list[str] = []
    t_all = time.monotonic()
    for part in chosen:
        script, timeout, quick, *always = PARTS[part]
        cmd = [sys.executable, str(Path("benchmarks") / script), *(always[0] if always else [])]
        if args.quick:
            cmd += quick
        if part == "failover" and args.kills is not None:
            cmd += ["--kills", str(args.kills)]
        if part == "storm" and args.sizes:
            cmd += ["--sizes", args.sizes]
        print(f"[run_all] {part}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the part's cleanup kills the cluster processes it started.
            print(f"[run_all] {part}: timed out after {timeout} s; stopping it", flush=True)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = -1
        print(f"[run_all] {part}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(part)
    subprocess.run([sys.executable, str(Path("benchmarks") / "report.py")], cwd=ROOT, check=False)
    print(f"[run_all] done in {time.monotonic() - t_all:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
