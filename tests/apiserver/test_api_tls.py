"""HTTPS on the REST API from ``[tls]``: a real API server process in a TLS cluster."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from xce_apiserver.auth import hash_password

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]


def test_rest_is_https_with_the_cluster_certificate(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1, tls=True)
    port_file = tmp_path / "api.port"
    users = (f'[{{name = "alice", password_hash = "{hash_password("pw", iterations=1000)}", '
             'role = "user"}]')
    proc = cl.start_role("apiserver", 'apiserver.listen="127.0.0.1:0"',
                         f'apiserver.port_file="{port_file}"', f"apiserver.users={users}")
    wait_for(lambda: (port_file.exists() and port_file.read_text().strip()) or not proc.alive(),
             30, what="the API server's port file")
    assert proc.alive(), proc.text()
    port = int(port_file.read_text())
    trust = ssl.create_default_context(cafile=str(cl.tls_dir / "ca.pem"))
    base = f"https://127.0.0.1:{port}"
    with httpx.Client(base_url=base, verify=trust, timeout=10) as http:
        wait_for(lambda: http.get("/xce/v1/readyz").status_code == 200, 30, what="readyz")
        r = http.post("/xce/v1/auth/logon", json={"username": "alice", "password": "pw"})
        assert r.status_code == 200, r.text
        token = r.json()["data"]["token"]
        r = http.post("/xce/v1/jobs", json={"command": "true"},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["code"] == 201, r.text
    assert f"REST API listening on https://127.0.0.1:{port}/xce/v1" in proc.text()
    # Plain HTTP to the HTTPS port gets no answer; a client trusting another CA refuses it.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/xce/v1/readyz", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{base}/xce/v1/readyz", verify=ssl.create_default_context(), timeout=5)
