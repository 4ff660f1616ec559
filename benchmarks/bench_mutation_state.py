"""Mutation testing of the controller's state transitions (``xce_controller/state.py``).

Run from the repository root (needs ``pip install mutmut``; a few minutes on 2 cores)::

    python benchmarks/bench_mutation_state.py

mutmut rewrites ``state.py`` into every small variant it knows (a comparison flipped, a
constant changed, an argument dropped, ...) and runs the pure state tests
(``tests/controller/test_ctl_state.py``) against each; a mutant the tests do not notice
"survives". The run happens in a scratch copy (the package and that test file), so the
working tree is never touched. Writes the kill rate and every survivor to
``benchmarks/results/mutation-state.md``. Not part of CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugins" / "controller" / "xce_controller"
TESTS = [ROOT / "tests" / "controller" / "test_ctl_state.py"]
RESULT = ROOT / "benchmarks" / "results" / "mutation-state.md"
TARGET = 0.90

CONFIG = """[tool.mutmut]
source_paths = ["xce_controller/state.py"]
also_copy = ["xce_controller/"]
pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-p", "no:xce"]
pytest_add_cli_args_test_selection = ["tests/"]
"""


def _run(cmd: list[str], cwd: Path, log: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XCE_CONFIG"}
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env,
                              check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    mutmut = shutil.which("mutmut")
    if mutmut is None:
        print("mutmut is not installed: pip install mutmut", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="xce-mutation-"))
    log = scratch / "mutmut.log"
    try:
        shutil.copytree(PACKAGE, scratch / "xce_controller",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (scratch / "tests").mkdir()
        for test in TESTS:
            shutil.copy(test, scratch / "tests" / test.name)
        (scratch / "pyproject.toml").write_text(CONFIG)
        started = time.monotonic()
        run = _run([mutmut, "run"], scratch, log)
        seconds = time.monotonic() - started
        results = subprocess.run([mutmut, "results", "--all", "true"], cwd=scratch, capture_output=True,
                                 text=True, check=False)
        if run.returncode not in (0, 1) or results.returncode != 0:
            print(f"mutmut failed; see {log}", file=sys.stderr)
            args.keep = True
            return 1
        statuses: dict[str, str] = {}
        for line in results.stdout.splitlines():
            m = re.match(r"\s*(\S+): (\S.*)$", line)
            if m:
                statuses[m.group(1)] = m.group(2).strip()
        total = len(statuses)
        killed = sum(1 for s in statuses.values() if s == "killed")
        survivors = sorted(name for name, s in statuses.items() if s != "killed")
        diffs = []
        for name in survivors:
            shown = subprocess.run([mutmut, "show", name], cwd=scratch, capture_output=True, text=True,
                                   check=False).stdout
            changed = [ln for ln in shown.splitlines() if ln.startswith(("-", "+"))
                       and not ln.startswith(("---", "+++"))]
            diffs.append((name, statuses[name], changed[:4]))
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch kept in {scratch}", file=sys.stderr)
    rate = killed / total if total else 0.0
    lines = [
        "# Mutation testing: `xce_controller/state.py`", "",
        "Measured by `python benchmarks/bench_mutation_state.py` (mutmut "
        f"{_version(mutmut)}, tests: `tests/controller/test_ctl_state.py`, {seconds:.0f} s on a "
        "shared 2-core machine).", "",
        "| mutants | killed | survived | kill rate | target |", "|---|---|---|---|---|",
        f"| {total} | {killed} | {total - killed} | {rate:.1%} | {TARGET:.0%} |", "",
        "Survivors (what each changes); most change only an error message's text or a "
        "default nobody passes:", "",
    ]
    for name, status, changed in diffs:
        lines.append(f"- `{name}` ({status})")
        lines += [f"  `{c.strip()[:150]}`" for c in changed]
    RESULT.write_text("\n".join(lines) + "\n")
    print(f"state.py: {killed}/{total} mutants killed ({rate:.1%}); written to {RESULT}")
    return 0 if rate >= TARGET else 1


def _version(mutmut: str) -> str:
    out = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('mutmut'))"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return out or "?"


if __name__ == "__main__":
    sys.exit(main())
