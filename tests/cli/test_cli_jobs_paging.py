"""``xce jobs`` pages through the controller's ``jobinfo`` (``limit``, ``cursor``, ``next``):
a real ``xce`` process against a scripted controller on loopback, which answers in pages."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "connection"))
from fakectl import FakeController

pytestmark = [pytest.mark.timeout(120)]

OWNER = pwd.getpwuid(os.geteuid()).pw_name  # whom the key authenticates (the fake's owner)
JOBS = [{"jobid": i, "user": OWNER if i % 3 else "bob", "state": "PEND" if i % 2 else "DONE",
         "queue": "normal", "alloc": [] if i % 2 else [{"host": "n1", "ntasks": 2}],
         "name": "" if i % 5 else f"name{i}", "command": f"sleep {i}", "submit_time": 1.7e9 + i,
         "pend_reason": "not enough free slots on matching hosts" if i % 2 else None,
         "reason": None} for i in range(1, 2502)]


def jobinfo(args: dict[str, Any]) -> dict[str, Any]:
    """Pages in job id order; the cursor is the last id of the page before (opaque to xce)."""
    after = int(args.get("cursor") or 0)
    limit = args["limit"]
    found = [j for j in JOBS if j["jobid"] > after
             and (not args.get("states") or j["state"] in args["states"])
             and (not args.get("owner") or j["user"] == args["owner"])]
    page = found[:limit]
    more = len(found) > limit
    return {"jobs": page, "next": str(page[-1]["jobid"]) if more else None}


@pytest.fixture
def fake() -> Iterator[FakeController]:
    started, stop, box = threading.Event(), threading.Event(), {}

    async def main() -> None:
        async with FakeController("paged") as ctl:
            ctl.handlers["jobinfo"] = jobinfo
            box["ctl"] = ctl
            started.set()
            await anyio.to_thread.run_sync(stop.wait)

    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    thread.start()
    assert started.wait(10)
    yield box["ctl"]
    stop.set()
    thread.join(10)


def xce(ctl: FakeController, tmp_path: Path, *args: str, user: str = "alice") -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "xce.toml"
    cfg.write_text(f'[cluster]\npeers = "{ctl.address}"\n')
    env = {"PATH": "/usr/bin:/bin", "LOGNAME": user, "USER": user}
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "jobs", *args],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    return res


def test_all_jobs_come_page_by_page_each_once_in_order(fake: FakeController, tmp_path: Path) -> None:
    res = xce(fake, tmp_path, "-a", "-u", "all")
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["JOBID", "USER", "STAT", "QUEUE", "EXEC_HOST", "JOB_NAME",
                                "SUBMIT_TIME", "REASON"]
    assert [int(line.split()[0]) for line in lines[1:]] == [j["jobid"] for j in JOBS]
    calls = [r.args for r in fake.ops("jobinfo")]
    assert [c["limit"] for c in calls] == [100, 1000, 1000, 1000]
    assert [c.get("cursor") for c in calls] == [None, "100", "1100", "2100"]
    assert "owner" not in calls[0] and "states" not in calls[0]
    # Columns are set by the header and the first page: every line has the same layout.
    assert {line.index("normal") for line in lines[1:]} == {lines[0].index("QUEUE")}
    assert "2*n1" in lines[2] and "name5" in lines[5] and "not enough free slots" in lines[1]


def test_default_is_the_callers_unfinished_jobs_and_json_streams_one_array(
        fake: FakeController, tmp_path: Path) -> None:
    mine = [j for j in JOBS if j["user"] == OWNER and j["state"] == "PEND"]
    got = orjson.loads(xce(fake, tmp_path, "--json").stdout)
    assert got == mine
    first = fake.ops("jobinfo")[0].args
    assert first["owner"] == OWNER and first["states"] == ["PEND", "PSUSP", "RUN", "SSUSP", "UNKWN", "USUSP"]
    # A claimed login name changes nothing: the controller says whom it authenticated.
    assert orjson.loads(xce(fake, tmp_path, "--json", user="carol").stdout) == mine
    assert xce(fake, tmp_path, "-u", "carol").stdout == "No matching job found\n"
