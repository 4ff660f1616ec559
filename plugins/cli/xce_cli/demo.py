"""The failover demo: a stream of jobs, a SIGKILLed primary mid-stream, and the proof.

Every job appends its own sequence number to one file, so "ran exactly once" is checked
against what really ran, not against what the controller says.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from xcecore.protocol import FINISHED

if TYPE_CHECKING:
    from rich.console import Console

    from xce_cli.embedded import Embedded



def run_demo(emb: Embedded, njobs: int, console: Console, job_timeout: float = 120.0) -> bool:
    """Run the scenario; print a summary; True when every check passed."""
    from rich.table import Table

    ran = emb.root / "ran.log"
    ran.write_text("")
    kill_at = max(1, njobs // 3)
    submitted: dict[int, int] = {}  # sequence number -> job id
    kill_time = 0.0
    first_write_after_kill = 0.0
    old = new = -1
    for seq in range(njobs):
        if seq == kill_at:
            console.print(f"submitted {seq} jobs; [bold red]SIGKILL[/] the primary controller now")
            kill_time = time.time()
            old = emb.cluster.wait_primary(5)
            emb.cluster.candidates[old].kill()
        cmd = f"echo {seq} >> {ran}; sleep 0.05"
        t0 = time.time()
        res = emb.call("jobsubmit", {"command": cmd, "name": f"demo-{seq}", "cwd": str(emb.root)}, timeout=60)
        submitted[seq] = res["jobid"]
        if seq == kill_at:
            first_write_after_kill = time.time() - kill_time
            new = emb.cluster.wait_primary(10, exclude=old)
            console.print(f"job {seq} (issued at the kill) acknowledged {first_write_after_kill * 1000:.0f} ms "
                          f"after it by candidate {new}; candidate {old} is dead"
                          f" (submit took {(time.time() - t0) * 1000:.0f} ms)")
    rejoined = emb.wait_members(emb.expected_members(), 30, since=kill_time) if kill_time else {}
    table = Table("role", "re-joined the new primary after", title="re-joins after the kill", box=None)
    for ident, at in sorted(rejoined.items()):
        table.add_row(ident, f"{(at - kill_time) * 1000:.0f} ms")
    console.print(table)
    console.print(f"restarting candidate {old} as a standby")
    emb.cluster.start_candidate(old)
    deadline = time.monotonic() + job_timeout
    jobs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        jobs = emb.call("jobinfo", {"jobids": list(submitted.values())})["jobs"]
        if len(jobs) == len(submitted) and all(j["state"] in FINISHED for j in jobs):
            break
        time.sleep(0.2)
    return _verdict(console, submitted, jobs, ran.read_text().split(), rejoined, first_write_after_kill)


def _verdict(console: Console, submitted: dict[int, int], jobs: list[dict[str, Any]], lines: list[str],
             rejoined: dict[str, float], first_write: float) -> bool:
    from collections import Counter

    runs = Counter(int(x) for x in lines if x.isdigit())
    done = sum(1 for j in jobs if j["state"] == "DONE")
    ids = [j["jobid"] for j in jobs]
    checks = {
        "every submission acknowledged once (distinct job ids)": len(set(submitted.values())) == len(submitted),
        "the controller knows every acknowledged job": sorted(ids) == sorted(submitted.values()),
        "every job finished DONE": done == len(submitted),
        "every job ran exactly once": all(runs.get(s) == 1 for s in submitted) and len(runs) == len(submitted),
        "every role re-joined the new primary": bool(rejoined),
    }
    for what, ok in checks.items():
        console.print(("[green]ok[/]   " if ok else "[red]FAIL[/] ") + what)
    console.print(f"{len(submitted)} jobs, {done} DONE; first write after the kill acknowledged in "
                  f"{first_write * 1000:.0f} ms")
    return all(checks.values())
