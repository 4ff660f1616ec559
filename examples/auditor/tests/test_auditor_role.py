"""The example auditor role across a controller failover, with real processes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(120)]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_auditor_logs_every_change_across_a_failover(xce_cluster: Any, tmp_path: Path) -> None:
    cluster: LocalCluster = xce_cluster(3)
    log = tmp_path / "audit.jsonl"
    auditor = cluster.start_role("auditor", f'auditor.log_file="{log}"')
    _, config = load(cluster.config_path)
    with SyncClient.open(client_config(config, f"cli@{socket.gethostname()}"), role="cli") as cli:
        def submit() -> int:
            return int(cli.call("jobsubmit", {"command": "true"}, deadline=30)["jobid"])

        first = submit()
        wait_for(lambda: any(r["jobid"] == first for r in _lines(log)), 30, what="auditor logs job 1")
        cluster.kill_primary()
        second = submit()
        cli.call("jobctrl", {"jobid": first, "action": "kill"}, deadline=30)
        wait_for(lambda: {(r["jobid"], r["state"]) for r in _lines(log)} >= {(first, "PEND"), (second, "PEND"),
                                                                            (first, "EXIT")},
                 30, what="auditor logs changes after the failover")
    assert auditor.alive(), auditor.text()
    rows = [(r["jobid"], r["state"]) for r in _lines(log)]
    assert len(rows) == len(set(rows)), f"a change was logged twice: {rows}"
    text = auditor.text()
    assert "re-joined" in text or "rejoined" in text, text[-3000:]
