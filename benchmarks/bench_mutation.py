"""Mutation testing of the client's pure modules: how many mutants their unit tests kill.

mutmut (PyPI) mutates candidate parsing (``xcecore/candidates.py`` and the ``host:port``
parser it uses, ``xcecore/protocol.py``), the client's state
machine (``xcecore/client/machine.py``), its dialer (``xcecore/client/dialer.py``) and the
back-off (``xcecore/client/backoff.py``), and runs only their pure unit tests against each
mutant -- no sockets, no processes: a mutant those tests miss is a decision nothing pins.
It works in a temporary copy of the tree (mutmut writes a ``mutants/`` directory), and
writes ``benchmarks/results/mutation.md`` and ``mutation.json``. Not part of CI (minutes).

Run: ``python benchmarks/bench_mutation.py`` (needs ``pip install mutmut``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODULES = ["xcecore/candidates.py", "xcecore/protocol.py", "xcecore/client/machine.py", "xcecore/client/dialer.py",
           "xcecore/client/backoff.py"]
TESTS = ["tests/connection/test_conn_machine.py", "tests/connection/test_conn_units.py",
         "tests/core/test_candidates.py", "tests/core/test_protocol.py"]


def run(workdir: Path) -> tuple[dict[str, dict[str, int]], list[str], float]:
    """Run mutmut in ``workdir``: per module counts by status, the survivors, seconds."""
    shutil.copytree(ROOT / "xcecore", workdir / "xcecore")
    shutil.copy(ROOT / "pyproject.toml", workdir / "pyproject.toml")
    (workdir / "tests").mkdir()
    for test in TESTS:
        shutil.copy(ROOT / test, workdir / "tests" / Path(test).name)
    (workdir / "setup.cfg").write_text(
        "[mutmut]\npaths_to_mutate =\n" + "".join(f"    {m}\n" for m in MODULES)
        + "also_copy =\n    xcecore\ntests_dir = tests\n")
    mutmut = [sys.executable, "-m", "mutmut"]
    started = time.monotonic()
    subprocess.run([*mutmut, "run"], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    took = time.monotonic() - started
    out = subprocess.run([*mutmut, "results", "--all", "true"], cwd=workdir, check=True,
                         capture_output=True, text=True).stdout
    counts: dict[str, dict[str, int]] = {}
    survivors: list[str] = []
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if not name:
            continue
        module = next(m for m in MODULES if name.startswith(m[:-3].replace("/", ".") + "."))
        counts.setdefault(module, {})
        counts[module][status] = counts[module].get(status, 0) + 1
        if status != "killed":
            survivors.append(f"{name}: {status}")
    return counts, survivors, took


def main() -> None:
    """Run, print and write the kill rates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    try:
        import mutmut  # noqa: F401
    except ImportError:
        sys.exit("bench_mutation needs mutmut: pip install mutmut")
    with tempfile.TemporaryDirectory(prefix="xce-mutation-") as tmp:
        counts, survivors, took = run(Path(tmp))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from benchkit import meta

    rows = []
    for module in MODULES:
        c = counts.get(module, {})
        total = sum(c.values())
        killed = c.get("killed", 0)
        rows.append({"module": module, "mutants": total, "killed": killed,
                     "survived": c.get("survived", 0), "no_tests": c.get("no tests", 0),
                     "timeout": c.get("timeout", 0),
                     "kill_rate": round(100 * killed / total, 1) if total else None})
    data = {**meta(), "tool": "mutmut", "tests": TESTS, "seconds": round(took, 1), "modules": rows,
            "survivors": survivors}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mutation.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = ["# Mutation testing of the client's pure modules", "",
             f"`{data['command']}` on {data['cores']} cores, {data['date']}: mutmut, {took:.0f} s.",
             "Each mutant is run against the pure unit tests only (" + ", ".join(f"`{t}`" for t in TESTS)
             + "): no sockets, no processes.", "",
             "| module | mutants | killed | survived | no test | timeout | kill rate |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['module']}` | {r['mutants']} | {r['killed']} | {r['survived']} | "
                     f"{r['no_tests']} | {r['timeout']} | {r['kill_rate']} % |")
    lines += ["", f"Surviving mutants: {len(survivors)} (listed in `mutation.json`; "
              "`mutmut show NAME` in a run's directory shows one)."]
    (RESULTS / "mutation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
