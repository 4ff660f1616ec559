"""Start-up cost of the command line: `xce version`, and `xce jobs` / `xce submit` against a
real controller holding 1,000 jobs (DESIGN.md "Start-up cost": stay under about 100 ms).

Each command is run as a fresh process many times; the figure is wall time per command.
Run: python benchmarks/bench_cli.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import meta, stats, write_result

from xcecore.testing.cluster import LocalCluster


def time_command(args: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Wall seconds per run of ``xce ARGS`` (after one warm-up run)."""
    xce = [sys.executable, "-m", "xcecore"]
    subprocess.run([*xce, *args], env=env, capture_output=True, check=True)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([*xce, *args], env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return stats(times, 1)


def main() -> None:
    """Run the measurements and write benchmarks/results/cli.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1000)
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="xce-bench-cli-"))
    cluster = LocalCluster(root, 1, extra_config="[controller]\nadmins = [\"bench\"]\n")
    results: dict[str, dict[str, float]] = {}
    try:
        cluster.start()
        # As on a user's machine: bytecode is cached (this workplace sets PYTHONDONTWRITEBYTECODE,
        # which would make every run compile every module of the project again).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["XCE_CONFIG"] = str(cluster.config_path)
        from xcecore.client import SyncClient
        from xcecore.runtime import client_config, load

        _, config = load(cluster.config_path)
        with SyncClient.open(client_config(config, "cli@bench"), role="cli") as c:
            for i in range(opts.jobs):
                c.call("jobsubmit", {"command": "true", "name": f"j{i}", "user": os.environ.get("USER", "root")})
        results["xce version"] = time_command(["version"], env, opts.runs)
        results[f"xce jobs ({opts.jobs} pending jobs)"] = time_command(["jobs"], env, opts.runs)
        results[f"xce jobs --json ({opts.jobs} jobs)"] = time_command(["jobs", "--json"], env, opts.runs)
        results["xce submit -- true"] = time_command(["submit", "--", "true"], env, opts.runs)
        results["python -c pass (interpreter floor)"] = stats(
            [_wall([sys.executable, "-c", "pass"]) for _ in range(opts.runs)], 1)
    finally:
        cluster.close()
    data = {**meta(), "unit": "ms wall per command", "runs": opts.runs, "results": results}
    write_result("cli", data)
    lines = ["# Command-line start-up", "", f"`{data['command']}` on {data['cores']} cores, {data['date']}.",
             "Each command is a fresh process (bytecode cached, as after a first run); wall time in ms.", "",
             "| command | median | p90 | min | max |", "|---|---|---|---|---|"]
    for name, s in results.items():
        lines.append(f"| `{name}` | {s['median']} | {s['p90']} | {s['min']} | {s['max']} |")
    (Path(__file__).parent / "results" / "cli.md").write_text("\n".join(lines) + "\n")


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return (time.perf_counter() - t0) * 1000


if __name__ == "__main__":
    main()
