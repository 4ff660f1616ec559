"""A third-party role run by ``xce run`` against a real controller: the core calls its object.

Real processes on loopback: one controller candidate, the probe role (tests/core/
role_probe_plugin.py) loaded by module name in its own process only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from xcecore.testing import LocalCluster, wait_for

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(90)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _probe(cluster: LocalCluster, name: str, out: Path, *sets: str) -> Any:
    env = {"PYTHONPATH": str(HERE), "XCE_PLUGIN_MODULES": "role_probe_plugin"}
    return cluster.start_role("probe", f'probe.out="{out}"', f'probe.hname="{name}"', *sets,
                              name=name, env=env)


def _members(cli: Any) -> dict[str, dict[str, Any]]:
    return {m["identity"]: m for m in cli.call("status", {}, deadline=10)["member_list"]}


def test_async_handlers_are_awaited_and_members_are_shown(xce_cluster: Any, xce_client: Any,
                                                          tmp_path: Path) -> None:
    cluster: LocalCluster = xce_cluster(1)
    all_out, none_out = tmp_path / "all.jsonl", tmp_path / "none.jsonl"
    proc = _probe(cluster, "p1", all_out, 'probe.colour="green"')
    quiet = _probe(cluster, "p2", none_out, 'probe.pushes="none"')
    # The async push handler ran: the state sync after the join is recorded.
    wait_for(lambda: any(r.get("push") == "sync_end" for r in _lines(all_out)), 30,
             what=f"the probe's state sync ({proc.text()[-2000:]})")
    assert {"state": "connected"} in _lines(all_out)  # the async connection-state handler too
    cli = xce_client(cluster, "cli", join=False)
    def both_joined() -> dict[str, dict[str, Any]] | None:
        found = _members(cli)
        return found if {"probe@p1", "probe@p2"} <= set(found) else None

    members = wait_for(both_joined, 30, what="both probes joined")
    # Join attributes of a non-worker role are shown, with the time it was last seen.
    assert members["probe@p1"]["attrs"] == {"colour": "green"}
    assert members["probe@p2"]["pushes"] == "none" and members["probe@p1"]["pushes"] == "all"
    first_seen = members["probe@p1"]["last_seen"]
    wait_for(lambda: _members(cli)["probe@p1"]["last_seen"] > first_seen, 10,
             what="a heartbeat moving last_seen")
    # A job change reaches the subscribed probe, never the one that asked for no pushes.
    jobid = cli.call("jobsubmit", {"command": "true"}, deadline=10)["jobid"]
    wait_for(lambda: any(r.get("push") == "job" for r in _lines(all_out)), 30, what="the job push")
    assert jobid >= 1
    assert not [r for r in _lines(none_out) if "push" in r], _lines(none_out)
    assert {"state": "connected"} in _lines(none_out) and quiet.alive()
    # `xce status` shows every member with what it joined with.
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cluster.config_path), "status"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("probe@p1"))
    assert "colour=green" in row and " all " in row, res.stdout


def test_a_missing_required_key_stops_the_role_before_it_connects(xce_cluster: Any, tmp_path: Path) -> None:
    cluster: LocalCluster = xce_cluster(1)
    env = {"PYTHONPATH": str(HERE), "XCE_PLUGIN_MODULES": "role_probe_plugin"}
    proc = cluster.start_role("probe", name="needy", env=env)
    assert proc.popen.wait(60) != 0
    text = proc.text()
    assert "probe.out is required: where to record" in text, text[-2000:]
    assert "connect" not in text.split("probe.out is required")[0].lower(), text[-2000:]
