"""Partition: a proxy between the clients and the primary stops forwarding, closing nothing.

Only the liveness timeout can notice. The primary still holds the lock, so no standby
promotes: the clients detect the dead link within the timeout, keep trying (the standbys
redirect to the primary's real address, which is not in their list), and recover when the
proxy heals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tcpproxy import running_proxy
from xce_apiserver.auth import hash_password

from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_black_holed_primary_is_detected_and_healed(xce_cluster: Any, tmp_path: Path) -> None:
    users = f'[{{name = "ops", password_hash = "{hash_password("pw", iterations=1000)}", role = "admin"}}]'
    cluster: LocalCluster = xce_cluster(3, extra_config='[controller]\nadmins = ["ops"]\n')
    p = cluster.ports
    with running_proxy(p[0]) as proxy:
        peers = f"127.0.0.1:{proxy.port},127.0.0.1:{p[1]},127.0.0.1:{p[2]}"
        port_file = tmp_path / "api.port"
        api = cluster.start_role("apiserver", f'cluster.peers="{peers}"', 'apiserver.listen="127.0.0.1:0"',
                                 f'apiserver.port_file="{port_file}"', f"apiserver.users={users}",
                                 "apiserver.backend_timeout=2.0")
        sched = cluster.start_role("scheduler", f'cluster.peers="{peers}"')
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 30, what="the API port")
        base = f"http://127.0.0.1:{int(port_file.read_text())}/xce/v1"
        http = httpx.Client(base_url=base, timeout=30)
        wait_for(lambda: http.get("/readyz").status_code == 200, 30, what="the API server ready")
        token = http.post("/auth/logon", json={"username": "ops", "password": "pw"}).json()["data"]["token"]
        hdr = {"Authorization": f"Bearer {token}"}
        wait_for(lambda: "joined as scheduler" in sched.text(), 30, what="the scheduler's join")
        assert http.post("/jobs", json={"command": "true", "name": "p-0"}, headers=hdr).status_code == 200

        proxy.partition()
        cut = time.monotonic()
        for proc in (api, sched):
            wait_for(lambda proc=proc: "liveness timeout" in proc.text(), 20,
                     what=f"{proc.name} to notice the black hole")
        noticed = time.monotonic() - cut
        # The primary still holds the lock: nobody promoted, the clients keep trying.
        assert cluster.state_of(0) == "primary" and cluster.primary() == 0
        wait_for(lambda: "not followed" in api.text(), 20, what="the standbys' redirects to be refused")

        proxy.heal()
        wait_for(lambda: "re-joined" in api.text() and "re-joined" in sched.text(), 60,
                 what="both roles to re-join after the heal")
        wait_for(lambda: http.get("/readyz").status_code == 200, 30, what="ready again")
        r = http.post("/jobs", json={"command": "true", "name": "p-1"}, headers=hdr)
        assert r.status_code == 200, r.text
        assert api.alive() and sched.alive()
        http.close()
    assert noticed < 20
