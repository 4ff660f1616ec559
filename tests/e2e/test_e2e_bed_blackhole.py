"""Black-holed client traffic to a healthy primary, on the fault test bed.

The clients' host loses every packet to and from the primary's port (nothing is closed, so
only the clients' liveness timeout can notice), while the controller host itself is fine.
What happens, and what docs/operator.md says: the primary keeps beating and keeps its lock, so
no standby fences it and nothing fails over (with the file backend the candidates share one
host; failing over would not reach the cut-off clients either); the cut-off clients detect the
dead link, walk the candidates, are redirected by the standbys to the primary they cannot
reach, and keep trying until the path heals; every other client is served throughout; after
the heal everything acknowledged is there once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from xcecore.testing.checker import OK, History, check, promotions_in_logs
from xcecore.testing.cluster import wait_for
from xcecore.testing.faultbed import FaultBed
from xcecore.testing.workload import Writers, all_jobs, resolve_unknown

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
HOLD = 4.0  # longer than the clients' liveness timeout (1.5 s) and hung_timeout (2 s)


def test_black_holed_clients_of_a_healthy_primary(xce_faultbed: FaultBed) -> None:
    bed = xce_faultbed
    ctl, cli, svc = bed.add_host("ctl"), bed.add_host("cli"), bed.add_host("svc")
    cluster = bed.cluster(ctl, 3, extra_config='[controller]\nadmins = ["chaos"]\n')
    cluster.start()
    history = History()

    def open_client(name: str) -> Any:
        return bed.client(cluster, svc if name.startswith("svc") else cli, "cli", name=name)

    cut = Writers(history, open_client, 2, seed=3, gap=0.01)  # w0, w1 on cli
    cut.start()
    wait_for(lambda: history.counts().get("ok", 0) >= 10, 30, what="the first writes")
    primary = cluster.candidates[0]
    with bed.client(cluster, svc, "cli", name="svc-writer") as other:
        bed.partition(cli, ctl, port=cluster.ports[0])
        t_cut = time.time()
        served = 0
        while time.time() < t_cut + HOLD:  # a client elsewhere is served all along
            other.call("jobsubmit", {"command": "true", "name": f"svc-{served}"},
                       deadline=5)
            served += 1
        bed.heal(cli, ctl)
        t_heal = time.time()
    during = [op for op in history.snapshot() if op.outcome == OK and op.kind != "read"
              and t_cut + 0.1 < op.invoked and op.completed is not None and op.completed < t_heal]
    assert not during, f"a black-holed client was acknowledged during the black hole: {during[0]}"
    wait_for(lambda: [op for op in history.snapshot() if op.outcome == OK and op.invoked > t_heal], 30,
             what="the cut-off clients' writes after the heal")
    cut.stop()
    assert not cut.errors
    assert served > 10  # the primary served the uncut client throughout
    assert primary.alive() and cluster.primary() == 0  # nothing failed over, nobody fenced
    text = "\n".join(p.text() for p in cluster.procs)
    assert "fenced" not in text and text.count("promoted to primary") == 1
    with bed.client(cluster, svc, "cli", name="final") as c:
        resolve_unknown(history, c)
        jobs = [j for j in all_jobs(c) if not j["name"].startswith("svc-")]
    verdict = check(history.snapshot(), jobs, promotions=promotions_in_logs(
        [cluster.root / f"controller{i}.log" for i in range(3)]))
    assert verdict.ok, verdict.summary()
