"""The REST front door: signed tokens across API servers and restarts, logon throttling, the
log of refusals, the access log and the offline API reference -- with real processes -- and
the pieces (Throttle, Authenticator, the token key file) on their own."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from xce_apiserver.auth import (
    AuthConfigError,
    Authenticator,
    load_token_key,
    parse_users,
    write_token_key,
)
from xce_apiserver.auth import hash_password as _hash
from xce_apiserver.throttle import Throttle

from xcecore.testing import LocalCluster, Proc, wait_for

USERS = (f'[{{name = "alice", password_hash = "{_hash("pw", iterations=1000)}", role = "user"}}, '
         f'{{name = "bob", password_hash = "{_hash("pw2", iterations=1000)}", role = "user"}}]')


def start_api(cl: LocalCluster, tmp: Path, name: str, *extra: str) -> tuple[Proc, str]:
    """API server ``name`` (host name too) with alice and bob: ``(process, its /xce/v1 URL)``."""
    proc, base = cl.start_apiserver(tmp / f"{name}.port", f"apiserver.users={USERS}",
                                    f'apiserver.hname="{name}"', *extra, name=name)
    return proc, f"{base}/xce/v1"


def logon(base: str, user: str = "alice", password: str = "pw") -> httpx.Response:
    return httpx.post(f"{base}/auth/logon", json={"username": user, "password": password},
                      timeout=10)


def jobs(base: str, token: str) -> int:
    return httpx.get(f"{base}/jobs", headers={"Authorization": f"Bearer {token}"},
                     timeout=10).status_code


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_a_token_works_on_a_second_api_server_and_after_a_restart(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    key = tmp_path / "token.key"
    write_token_key(str(key))
    shared = f'apiserver.token_key_file="{key}"'
    a, base_a = start_api(cl, tmp_path, "web1", shared)
    _, base_b = start_api(cl, tmp_path, "web2", shared)
    r = logon(base_a)
    assert r.status_code == 200, r.text
    token = r.json()["data"]["token"]
    assert jobs(base_a, token) == 200 and jobs(base_b, token) == 200
    os.kill(a.pid, signal.SIGTERM)  # a restart of the server that issued it
    a.popen.wait(20)
    _, base_a = start_api(cl, tmp_path, "web1", shared)
    assert jobs(base_a, token) == 200
    # Refresh: a fresh token, accepted everywhere; the old one is revoked (everywhere: see
    # test_revocation.py).
    r = httpx.post(f"{base_a}/auth/refresh", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    fresh = r.json()["data"]["token"]
    assert fresh != token and jobs(base_b, fresh) == 200 and jobs(base_a, token) == 401
    # Logout revokes.
    r = httpx.post(f"{base_b}/auth/logout", headers={"Authorization": f"Bearer {fresh}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert jobs(base_b, fresh) == 401
    # A server with another key (or none) does not accept the site's tokens.
    _, base_c = start_api(cl, tmp_path, "web3")
    other = logon(base_a).json()["data"]["token"]
    assert jobs(base_c, other) == 401
    assert "refused (401): invalid token" in cl.logs()


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_failed_logons_are_throttled_logged_and_the_docs_need_no_cdn(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    proc, base = start_api(cl, tmp_path, "web1", "apiserver.logon_failures=3",
                           "apiserver.logon_window=30", "apiserver.access_log=true")
    for _ in range(3):
        assert logon(base, password="wrong").status_code == 401
    r = logon(base, password="pw")  # the right password, but the user is throttled
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["Retry-After"]) <= 30 and "too many failed logons" in r.json()["msg"]
    r = logon(base, "bob", "pw2")  # another user from the same address: the address is throttled
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    text = proc.text()
    assert "POST /xce/v1/auth/logon from 127.0.0.1 as 'alice' refused (401): logon failed" in text
    assert "as 'alice' refused (429): 3 failed logons of this user or address within 30 s" in text
    assert "apiserver access: 127.0.0.1 POST /xce/v1/auth/logon 429" in text
    r = httpx.get(f"{base}/jobs", timeout=10)
    assert r.status_code == 401
    wait_for(lambda: "GET /xce/v1/jobs from 127.0.0.1 refused (401): no bearer token"
             in proc.text(), 10, what="the refused request's line")
    # The API reference loads nothing from outside.
    page = httpx.get(f"{base}/docs", timeout=10)
    assert page.status_code == 200 and "/xce/v1/docs/assets/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text.replace(
        "https://fastapi.tiangolo.com", "")
    js = httpx.get(f"{base}/docs/assets/swagger-ui-bundle.js", timeout=10)
    assert js.status_code == 200 and len(js.content) > 100_000
    css = httpx.get(f"{base}/docs/assets/swagger-ui.css", timeout=10)
    assert css.status_code == 200 and "swagger-ui" in css.text


def test_throttle_counts_per_key_within_the_window() -> None:
    t = Throttle(2, 10.0, max_keys=3)
    keys = ("user:a", "addr:1.2.3.4")
    assert t.retry_after(keys, 0.0) == 0
    t.failed(keys, 0.0)
    t.failed(keys, 4.0)
    assert t.retry_after(keys, 5.0) == pytest.approx(5.0)  # the oldest failure leaves at 10
    assert t.retry_after(("user:b", "addr:1.2.3.4"), 5.0) == pytest.approx(5.0)
    assert t.retry_after(("user:b", "addr:9.9.9.9"), 5.0) == 0
    assert t.retry_after(keys, 10.5) == 0  # one failure left in the window
    t.succeeded("user:a")
    t.failed(keys, 11.0)
    assert t.retry_after(("user:a",), 11.0) == 0 and t.retry_after(("addr:1.2.3.4",), 11.0) > 0
    for i in range(10):  # bounded: the least recently failed keys go
        t.failed((f"user:x{i}",), 12.0)
    assert len(t._fails) == 3
    with pytest.raises(ValueError, match="limit >= 1"):
        Throttle(0, 1.0)


def _auth(**kw: Any) -> Authenticator:
    users = parse_users([{"name": "a", "password_hash": _hash("pw", iterations=1000)}])
    return Authenticator(users, **kw)


def test_tokens_are_signed_and_checked() -> None:
    key = b"k" * 32
    auth = _auth(key=key)
    s = auth.issue(auth.users["a"])
    claims = jwt.decode(s.token, key, algorithms=["HS256"])
    assert claims["sub"] == "a" and claims["iss"] == "xce" and claims["jti"] == s.jti
    other = _auth(key=key).lookup(s.token)  # another server with the key
    assert other is not None and (other.user.name, other.jti, other.expires) == ("a", s.jti, s.expires)
    assert _auth(key=b"x" * 32).lookup(s.token) is None  # another key
    forged = jwt.encode({**claims, "sub": "a"}, b"y" * 32, algorithm="HS256")
    assert auth.lookup(forged) is None
    unsigned = jwt.encode(claims, None, algorithm="none")
    assert auth.lookup(unsigned) is None
    ghost = jwt.encode({**claims, "sub": "nobody"}, key, algorithm="HS256")
    assert auth.lookup(ghost) is None  # a user no longer configured
    assert auth.lookup("not a token") is None and auth.lookup("") is None
    fresh = auth.refresh(s)
    assert auth.lookup(fresh.token) is not None and fresh.jti != s.jti
    now = [1000.0]
    timed = _auth(key=key, clock=lambda: now[0], token_ttl=10)
    t = timed.issue(timed.users["a"])
    now[0] = 1011.0
    assert timed.check(t.token) == "token expired"


def test_a_revocation_names_its_own_user_and_a_user_wide_one_spares_later_tokens() -> None:
    now = [1000.0]
    auth = _auth(key=b"k" * 32, clock=lambda: now[0])
    users = parse_users([{"name": "a", "password_hash": _hash("pw", iterations=1000)},
                         {"name": "b", "password_hash": _hash("pw", iterations=1000)}])
    auth.users = users
    a1, b1 = auth.issue(users["a"]), auth.issue(users["b"])
    # b names a's token id in a revocation of its own: a's token is untouched.
    auth.revocations.hold({"key": f"t:{a1.jti}", "user": "b", "jti": a1.jti, "expires": 2000.0,
                           "rev": 1})
    assert auth.lookup(a1.token) is not None
    now[0] = 1000.5
    auth.revocations.hold({"key": "u:a", "user": "a", "before": now[0], "expires": 2000.0,
                           "by": "administrator root", "rev": 2})
    why = auth.check(a1.token)
    assert isinstance(why, str) and "every token of a issued before" in why and "root" in why
    a2 = auth.issue(users["a"])  # in the same second, after the revocation
    assert auth.lookup(a2.token) is not None and auth.lookup(b1.token) is not None


def test_the_token_key_file_must_be_private_and_long(tmp_path: Path) -> None:
    path = tmp_path / "k"
    write_token_key(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600 and len(load_token_key(str(path))) >= 32
    with pytest.raises(FileExistsError):
        write_token_key(str(path))
    os.chmod(path, 0o640)
    with pytest.raises(AuthConfigError, match="mode 0640: others could mint tokens"):
        load_token_key(str(path))
    short = tmp_path / "short"
    short.write_text("abc")
    os.chmod(short, 0o600)
    with pytest.raises(AuthConfigError, match="holds 3 bytes"):
        load_token_key(str(short))
    with pytest.raises(AuthConfigError, match="cannot be read"):
        load_token_key(str(tmp_path / "missing"))
