"""A revoked token is refused everywhere: two API servers on one cluster (real processes), a
logout on one refused on the other, after a SIGKILL failover of the primary and after an API
server restart; ``xce admin revoke-tokens USER`` refuses the user's older tokens while new
logons work, and ``POST /auth/revoke`` does the same for a user's own tokens (an
administrator's: anyone's); a logout with no controller reachable is a 503, not a silent success."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from test_api_frontdoor import logon, start_api
from xce_apiserver.auth import write_token_key

from xcecore.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def get(base: str, token: str) -> tuple[int, str]:
    """``GET /jobs`` with ``token``: the status and the envelope's message."""
    r = httpx.get(f"{base}/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    return r.status_code, str(r.json().get("msg", ""))


def refused(base: str, token: str, why: str = "revoked") -> bool:
    code, msg = get(base, token)
    return code == 401 and why in msg


def post(base: str, path: str, token: str) -> httpx.Response:
    return httpx.post(f"{base}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=15)


def revoke(base: str, token: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{base}/auth/revoke", json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=15)


def token_of(base: str, user: str = "alice", password: str = "pw") -> str:
    r = logon(base, user, password)
    assert r.status_code == 200, r.text
    return str(r.json()["data"]["token"])


def test_a_revoked_token_is_refused_everywhere(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(2)
    key = tmp_path / "token.key"
    write_token_key(str(key))
    shared = f'apiserver.token_key_file="{key}"'
    _, base1 = start_api(cl, tmp_path, "web1", shared)
    web2, base2 = start_api(cl, tmp_path, "web2", shared)
    t1, t2 = token_of(base1), token_of(base1)
    assert get(base2, t1)[0] == 200
    # Logout on web1: refused there at once, on web2 as soon as the push arrives.
    r = post(base1, "/auth/logout", t1)
    assert r.status_code == 200 and "revoked on every API server" in r.json()["msg"], r.text
    assert refused(base1, t1)
    wait_for(lambda: refused(base2, t1), 10, what="web2 refusing the logged-out token")
    assert "token revoked (logged out at" in get(base2, t1)[1]
    assert get(base2, t2)[0] == 200 and get(base1, t2)[0] == 200  # only that token
    # A SIGKILL failover of the primary: the revocation was committed, the new primary has it.
    cl.kill_primary()
    wait_for(lambda: post(base2, "/auth/logout", t2).status_code == 200, 30,
             what="a logout through the new primary")
    for base in (base1, base2):
        wait_for(lambda b=base: refused(b, t2), 10, what="the second logout refused everywhere")
        assert refused(base, t1)
    # A restart of an API server: it syncs the list from the controller.
    web2.kill()
    web2.popen.wait(20)
    _, base2 = start_api(cl, tmp_path, "web2", shared)
    assert refused(base2, t1) and refused(base2, t2)
    # Refresh: the old token is revoked everywhere, the fresh one works everywhere.
    t3 = token_of(base2)
    r = post(base2, "/auth/refresh", t3)
    assert r.status_code == 200, r.text
    t4 = str(r.json()["data"]["token"])
    wait_for(lambda: refused(base1, t3), 10, what="the refreshed-away token refused on web1")
    assert get(base1, t4)[0] == 200
    # An administrator revokes every older token of alice: refused everywhere, new logons work.
    bob = token_of(base1, "bob", "pw2")
    cli = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path),
                          "admin", "revoke-tokens", "alice"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert cli.returncode == 0 and "revoked every token of alice issued before" in cli.stdout, cli
    for base in (base1, base2):
        wait_for(lambda b=base: refused(b, t4, "every token of alice issued before"), 10,
                 what="alice's older tokens refused")
        assert get(base, bob)[0] == 200  # another user's are untouched
    t5 = token_of(base1)
    assert get(base1, t5)[0] == 200 and get(base2, t5)[0] == 200
    # bob logging out revokes bob's token, never alice's.
    assert post(base2, "/auth/logout", bob).status_code == 200
    wait_for(lambda: refused(base1, bob), 10, what="bob's logout")
    assert get(base1, t5)[0] == 200 and get(base2, t5)[0] == 200
    # Over REST (POST /auth/revoke): a user may revoke every token of their own (one was
    # stolen), never another user's; an administrator may revoke anyone's (the CLI above).
    b1, b2 = token_of(base1, "bob", "pw2"), token_of(base2, "bob", "pw2")
    r = revoke(base1, b1, {"user": "alice"})
    assert r.status_code == 403 and "may revoke only their own tokens" in r.json()["msg"], r.text
    assert revoke(base1, b1, {"user": "no such user!"}).status_code == 422
    assert revoke(base1, b1, {"user": "bob", "extra": 1}).status_code == 422
    r = revoke(base2, b1, {"user": "bob"})
    assert r.status_code == 200 and r.json()["data"]["user"] == "bob", r.text
    assert refused(base2, b1, "every token of bob issued before")  # at once where answered
    for base in (base1, base2):
        wait_for(lambda b=base: refused(b, b2, "every token of bob issued before"), 10,
                 what="bob's tokens refused after his REST revocation")
        assert get(base, t5)[0] == 200  # alice's untouched
    # No controller at all: a logout cannot be committed, so it says so (and the token,
    # truthfully, still works).
    for proc in list(cl.candidates.values()):
        proc.kill()
    r = post(base1, "/auth/logout", t5)
    assert r.status_code == 503 and "backend unavailable" in r.json()["msg"], r.text
    assert r.headers.get("Retry-After")
    assert get(base2, t5)[0] == 200
