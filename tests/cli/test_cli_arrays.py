"""Job arrays through a real cluster (controller, two workers, scheduler as processes, the
``xce`` command as a process): one submission, elements run with XCE_ARRAY_INDEX and %I,
``%limit`` respected, one listing line or the elements with -A, element and whole-array
control, a job script's #SBATCH --array."""

from __future__ import annotations

import getpass
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_cli_submit import PY, record, submit, xce

from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture
def cluster(xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> LocalCluster:
    c = xce_cluster(1, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n')
    for name in ("an1", "an2"):
        c.start_role("worker", f'worker.hname="{name}"', f'worker.state_dir="{tmp_path / name}"',
                     "worker.slots=3", "worker.monitor_interval=0.2", name=name)
    c.start_role("scheduler")
    return c


def elements(config: Path, array: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = orjson.loads(
        xce(config, "jobs", "--json", "-a", "-A", str(array)).stdout)
    return found


def array_done(config: Path, array: int) -> dict[str, Any]:
    def end() -> dict[str, Any] | None:
        rec = record(config, array)
        return rec if rec["state"] in ("DONE", "EXIT") else None
    result: dict[str, Any] = wait_for(end, 120, what=f"array {array} to end")
    return result


def test_array_of_ten_runs_each_index_once_within_its_limit(cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    cfg = cluster.config_path
    # Each element records when it ran; the %2 limit must hold across both hosts (6 slots).
    body = (f'{PY} -S -c "import time,os; a=time.time(); time.sleep(0.3); '
            f"print(os.environ['XCE_ARRAY_INDEX'], os.environ['XCE_ARRAY_JOBID'], a, time.time())\"")
    res = xce(cfg, "submit", "--json", "-J", "sim[1-10]%2", "-o", "out.%J.%I", "--", body,
              cwd=tmp_path)
    sub = orjson.loads(res.stdout)
    array = int(sub["jobid"])
    assert (sub["array"], sub["size"]) == ("1-10%2", 10)
    rec = array_done(cfg, array)
    assert rec["state"] == "DONE" and rec["array"]["counts"] == {"DONE": 10}, rec
    spans = []
    for index in range(1, 11):
        idx, of, start, end = (tmp_path / f"out.{array}.{index}").read_text().split()
        assert (int(idx), int(of)) == (index, array)
        spans.append((float(start), float(end)))
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2, f"{most} elements ran at once with %2: {spans}"
    els = elements(cfg, array)
    assert sorted(e["array"]["index"] for e in els) == list(range(1, 11))
    assert all(e["state"] == "DONE" and e["name"] == "sim" for e in els)
    assert len({e["jobid"] for e in els} | {array}) == 11  # each element is a job of its own
    listing = xce(cfg, "jobs", "-a").stdout
    lines = [ln for ln in listing.splitlines() if ln.split() and ln.split()[0].startswith(str(array))]
    assert len(lines) == 1 and "sim[1-10%2]" in lines[0] and "10 elements: 10 DONE" in lines[0], listing
    expanded = xce(cfg, "jobs", "-a", "-A", str(array)).stdout
    assert f"{array}[1] " in expanded and f"{array}[10] " in expanded, expanded


def test_kill_one_element_then_the_whole_array(cluster: LocalCluster, tmp_path: Path) -> None:
    cfg = cluster.config_path
    array = submit(cfg, "--array", "1-100000%3", "--", "sleep 60", cwd=tmp_path)

    def three_running() -> list[dict[str, Any]] | None:
        els = elements(cfg, array)
        return els if sum(e["state"] == "RUN" for e in els) == 3 else None
    els = wait_for(three_running, 60, what="3 elements running")
    first = min(e["array"]["index"] for e in els)
    out = xce(cfg, "job", "kill", f"{array}[{first}]").stdout
    assert f"Job <{array}[{first}]>: kill accepted" in out
    xce(cfg, "job", "kill", f"{array}[50000]")  # a pending index: an EXIT element at once
    killed = [e for e in elements(cfg, array) if e["array"]["index"] == 50000]
    assert killed and killed[0]["state"] == "EXIT" and killed[0]["reason"].startswith("killed by owner")
    bad = xce(cfg, "job", "kill", f"{array}[200000]", ok=False)
    assert bad.returncode == 1 and "no such array element" in bad.stderr
    rec = record(cfg, array)
    assert rec["state"] == "PEND" and rec["array"]["left"] < 100000 - 3

    def replaced() -> bool:  # the killed element's slot of the limit goes to the next index
        els = elements(cfg, array)
        return sum(e["state"] == "RUN" for e in els) == 3 and any(
            e["array"]["index"] == first and e["state"] == "EXIT" for e in els)
    wait_for(replaced, 60, what="the killed element replaced within the limit")
    xce(cfg, "job", "stop", str(array))
    assert record(cfg, array)["state"] == "PSUSP"
    xce(cfg, "job", "resume", str(array))
    xce(cfg, "job", "kill", str(array))
    rec = array_done(cfg, array)
    assert rec["state"] == "EXIT" and rec["array"]["left"] == 0
    assert rec["array"]["counts"] == {"EXIT": 100000}, rec["array"]


def test_sbatch_array_directive(cluster: LocalCluster, tmp_path: Path) -> None:
    cfg = cluster.config_path
    script = tmp_path / "arr.sh"
    script.write_text("#!/bin/sh\n#SBATCH --array=3-7:2 -o part.%A.%a\necho $XCE_ARRAY_INDEX\n")
    array = submit(cfg, str(script), cwd=tmp_path)
    assert array_done(cfg, array)["state"] == "DONE"
    assert [(tmp_path / f"part.{array}.{i}").read_text() for i in (3, 5, 7)] == ["3\n", "5\n", "7\n"]
    bad = xce(cfg, "submit", "-J", "x[1-3]", "--array", "1-2", "--", "true", ok=False)
    assert bad.returncode != 0 and "give one of them" in bad.stderr
    bad = xce(cfg, "submit", "--array", "5-1", "--", "true", ok=False)
    assert bad.returncode != 0 and "ends before it starts" in bad.stderr


@pytest.fixture
def killing(xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> LocalCluster:
    c = xce_cluster(1, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n'
                                    "kill_unsatisfiable = true\n")
    c.start_role("worker", 'worker.hname="dn1"', f'worker.state_dir="{tmp_path / "dn1"}"',
                 "worker.slots=3", "worker.monitor_interval=0.2", name="dn1")
    c.start_role("scheduler")
    return c


def test_dependency_chain_with_an_array_and_a_never_satisfiable_one(killing: LocalCluster,
                                                                   tmp_path: Path) -> None:
    cfg = killing.config_path
    # An array whose elements each leave a file; then B needs all of them, C needs B (Slurm's
    # form), D needs B to fail, which it will not: D ends with the reason.
    # The elements wait for a file the test makes once it has looked at the waiting jobs.
    arr = submit(cfg, "-J", "pre[1-3]", "--", "while [ ! -f go ]; do sleep 0.05; done; "
                 "echo $XCE_ARRAY_INDEX > a.$XCE_ARRAY_INDEX", cwd=tmp_path)
    b = submit(cfg, "-w", 'done("pre") && ended(' + str(arr) + "[2])", "--",
               "cat a.1 a.2 a.3 > b.txt", cwd=tmp_path)
    c = submit(cfg, f"--dependency=afterok:{b}", "--", "wc -l < b.txt > c.txt", cwd=tmp_path)
    d = submit(cfg, "-w", f"exit({b})", "--", "touch d.txt", cwd=tmp_path)
    early = record(cfg, c)
    assert early["state"] == "PEND" and early["waiting"] == f"dependency not satisfied: done({b})"
    listing = xce(cfg, "jobs").stdout
    assert f"dependency not satisfied: done({b})" in listing, listing
    (tmp_path / "go").touch()
    for jobid in (arr, b, c):
        assert array_done(cfg, jobid)["state"] == "DONE"
    assert (tmp_path / "b.txt").read_text() == "1\n2\n3\n"
    assert (tmp_path / "c.txt").read_text().strip() == "3"
    rb, rc = record(cfg, b), record(cfg, c)
    assert rc["start_time"] >= rb["end_time"]
    rd = array_done(cfg, d)
    assert rd["state"] == "EXIT" and rd["reason"] == f"dependency never satisfied: exit({b})", rd
    assert not (tmp_path / "d.txt").exists()
    bad = xce(cfg, "submit", "-w", "done(999999)", "--", "true", ok=False)
    assert bad.returncode == 1 and "no such job: 999999" in bad.stderr
    bad = xce(cfg, "submit", "-w", "done(1", "--", "true", ok=False)
    assert bad.returncode == 2 and "expected )" in bad.stderr


def test_array_runs_each_element_once_across_a_primary_sigkill(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    """Three candidates; the primary is SIGKILLed while an array dispatches: the new primary
    goes on from the committed record (pending runs and element records) and every index
    runs exactly once."""
    c = xce_cluster(3, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n')
    c.start_role("worker", 'worker.hname="hn1"', f'worker.state_dir="{tmp_path / "hn1"}"',
                 "worker.slots=3", name="hn1")
    c.start_role("scheduler")
    cfg = c.config_path
    array = submit(cfg, "--array", "1-24%3", "--", "sleep 0.2; echo $XCE_JOBID >> ran.$XCE_ARRAY_INDEX",
                   cwd=tmp_path)

    def some_done() -> bool:
        return record(cfg, array)["array"]["counts"].get("DONE", 0) >= 3
    wait_for(some_done, 60, what="a few elements done")
    c.kill_primary()
    rec = array_done(cfg, array)
    assert rec["state"] == "DONE" and rec["array"]["counts"] == {"DONE": 24}, rec["array"]
    for index in range(1, 25):
        lines = (tmp_path / f"ran.{index}").read_text().split()
        assert len(lines) == 1, f"element {index} ran {len(lines)} times: {lines}"
    els = elements(cfg, array)
    assert sorted(e["array"]["index"] for e in els) == list(range(1, 25))
