"""Start-up cost of the command line, from a regular install and from the editable one.

Targets (issue #16): ``xce jobs`` and ``xce submit -- true`` median <= 60 ms on an empty
cluster, ``xce --help`` <= 80 ms, measured from a regular (non-editable) install. The
regular install is built here: a fresh venv with the core and every plugin installed from a
copy of this tree (``pip install``, not ``-e``); the editable figures are this venv's ``xce``.
Each command is a fresh process, run ``--runs`` times per install, the installs interleaved
(so both see the same load); wall time in ms, after one warm-up (bytecode cached, as after a
first run). Then ``xce jobs`` again with ``--jobs`` pending jobs.

Run: ``python benchmarks/bench_cli.py [--runs N] [--jobs N] [--venv DIR]`` (``--venv``: reuse
a regular install made by an earlier run). Writes ``benchmarks/results/cli.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import meta, stats, write_result

from xcecore.testing.cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [".", "plugins/controller", "plugins/worker", "plugins/scheduler", "plugins/apiserver",
            "plugins/cli", "plugins/accounting"]


def regular_install(venv: Path) -> Path:
    """A venv at ``venv`` with xce and its plugins installed from a copy of the tree; its ``xce``."""
    xce = venv / "bin" / "xce"
    if xce.exists():
        return xce
    src = Path(tempfile.mkdtemp(prefix="xce-bench-cli-src-"))
    try:
        ignore = shutil.ignore_patterns(".venv", "build", "*.egg-info", "__pycache__", ".git",
                                        "mutants", ".mypy_cache", ".ruff_cache")
        shutil.copytree(ROOT, src / "xce", ignore=ignore)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, *(str(src / "xce" / p) for p in PACKAGES)], check=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    return xce


def time_commands(commands: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    """Wall ms per run of each command (one warm-up each), runs interleaved across commands."""
    for cmd in commands.values():
        subprocess.run(cmd, env=env, capture_output=True, check=True)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: stats(t, 1) for name, t in times.items()}


def main() -> None:
    """Run the measurements and write benchmarks/results/cli.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--venv", type=Path, default=None, help="regular install to (re)use")
    opts = parser.parse_args()
    venv = opts.venv or Path(tempfile.mkdtemp(prefix="xce-bench-cli-venv-")) / "venv"
    installs = {"regular": regular_install(venv), "editable": Path(sys.executable).parent / "xce"}
    python = {"regular": venv / "bin" / "python", "editable": Path(sys.executable)}
    root = Path(tempfile.mkdtemp(prefix="xce-bench-cli-"))
    cluster = LocalCluster(root, 1, extra_config=f'[controller]\nadmins = ["{os.environ.get("USER", "root")}"]\n')
    results: dict[str, dict[str, dict[str, float]]] = {}
    load_start = os.getloadavg()[0]
    try:
        cluster.start()
        # As on a user's machine: bytecode is cached (this workplace sets PYTHONDONTWRITEBYTECODE,
        # which would make every run compile every module again).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["XCE_CONFIG"] = str(cluster.config_path)

        def each(suffix: str, *args: str) -> dict[str, list[str]]:
            return {f"{kind} | xce {' '.join(args)}{suffix}": [str(x), *args] for kind, x in installs.items()}

        floor = {f"{kind} | python -c pass (interpreter floor)": [str(p), "-c", "pass"]
                 for kind, p in python.items()}
        empty = {**each(" (empty cluster)", "jobs"), **each("", "--help"), **each("", "version"), **floor}
        results.update(time_commands(empty, env, opts.runs))
        results.update(time_commands(each("", "submit", "--", "true"), env, opts.runs))
        from xcecore.client import OneShotClient, client_config
        from xcecore.client.settings import read_sections

        _, cl, tuning = read_sections(str(cluster.config_path))
        with OneShotClient(client_config(cl, tuning, "cli@bench")) as c:
            for i in range(opts.jobs):
                c.call("jobsubmit", {"command": "true", "name": f"j{i}"})
        results.update(time_commands(each(f" ({opts.jobs} more pending jobs)", "jobs"), env, opts.runs))
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)  # the cluster's directory: every run made one
        if opts.venv is None:
            shutil.rmtree(venv.parent, ignore_errors=True)
    load = (round(load_start, 1), round(os.getloadavg()[0], 1))
    data = {**meta(), "unit": "ms wall per command", "runs": opts.runs, "load_average_1min": load,
            "results": results}
    write_result("cli", data)
    lines = ["# Command-line start-up", "",
             f"`{data['command']}` on {data['cores']} cores, {data['date']}; 1-minute load average "
             f"{load[0]} at the start, {load[1]} at the end"
             + (" (above the core count: a shared machine, pessimistic figures)."
                if max(load) > data["cores"] else " (a quiet machine)."),
             "Each command is a fresh process (bytecode cached, as after a first run); wall time in ms. "
             "`regular`: a venv with xce and its plugins installed from a copy of the tree (not editable); "
             "`editable`: the development venv (`pip install -e`, whose path hooks every start pays). "
             "Targets: `xce jobs` and `xce submit -- true` median <= 60 ms, `xce --help` <= 80 ms (regular).",
             "", "| install | command | median | p90 | min | max |", "|---|---|---|---|---|---|"]
    for name, s in sorted(results.items(), key=lambda kv: (kv[0].split(" | ")[1], kv[0])):
        kind, cmd = name.split(" | ")
        lines.append(f"| {kind} | `{cmd}` | {s['median']} | {s['p90']} | {s['min']} | {s['max']} |")
    (ROOT / "benchmarks" / "results" / "cli.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
