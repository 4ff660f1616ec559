"""Chaos: concurrent submitters while the primary is SIGKILLed again and again.

Rounds come from ``XCE_CHAOS_ROUNDS`` (a few in CI; set it high when running by hand). After
the storm every acknowledged job exists exactly once, every job finishes, and every
acknowledged state change (a kill) is there.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from typing import Any

import pytest
from e2ekit import jobs_named

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing.cluster import wait_for

ROUNDS = int(os.environ.get("XCE_CHAOS_ROUNDS", "3"))
SUBMITTERS = 3
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120 + 30 * ROUNDS)]


def test_acknowledged_work_survives_repeated_kills(embedded: Any) -> None:
    emb = embedded(3, 2)
    _, config = load(emb.cluster.config_path)
    stop = threading.Event()
    acked: dict[str, int] = {}
    killed: dict[str, int] = {}
    errors: list[BaseException] = []
    user = emb.user

    def submitter(k: int) -> None:
        cfg = client_config(config, f"cli@{socket.gethostname()}-{k}")
        try:
            with SyncClient.open(cfg, role="cli") as c:
                n = 0
                while not stop.is_set():
                    name = f"chaos-{k}-{n}"
                    if n % 5 == 4:  # a long job, killed at once: the kill is an acknowledged change
                        res = c.call("jobsubmit", {"command": "sleep 60", "name": name, "user": user}, deadline=60)
                        c.call("jobctrl", {"jobid": res["jobid"], "action": "kill", "user": user}, deadline=60)
                        killed[name] = res["jobid"]
                    else:
                        res = c.call("jobsubmit", {"command": "true", "name": name, "user": user}, deadline=60)
                    acked[name] = res["jobid"]
                    n += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(SUBMITTERS)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    try:
        for _ in range(ROUNDS):
            threading.Event().wait(rng.uniform(0.3, 1.0))
            old, _new = emb.cluster.kill_primary()
            emb.cluster.start_candidate(old)
            emb.cluster.wait_state(old, "standby", 30)
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert not errors, errors
    assert len(acked) >= SUBMITTERS * ROUNDS, f"too little traffic to prove anything: {len(acked)}"

    def finished() -> list[dict[str, Any]] | None:
        found = jobs_named(emb, "chaos-")
        return found if found and all(j["state"] in ("DONE", "EXIT") for j in found) else None

    jobs = wait_for(finished, 120, interval=0.5, what="every chaos job to finish")
    names = [j["name"] for j in jobs]
    assert len(names) == len(set(names)), "a submission was applied twice"
    assert set(names) == set(acked), f"lost: {set(acked) - set(names)}; unexpected: {set(names) - set(acked)}"
    by_name = {j["name"]: j for j in jobs}
    for name, jobid in acked.items():
        assert by_name[name]["jobid"] == jobid
        expected = "EXIT" if name in killed else "DONE"
        assert by_name[name]["state"] == expected, by_name[name]
