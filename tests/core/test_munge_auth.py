"""The ``munge`` method against a real munged (its own key and socket in a temp directory):
a credential binds the challenge and the claim; expired, replayed, forged, another key's and
another uid's credentials are refused with their reason. Needs root and munged (fails naming
them otherwise)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xcecore import auth
from xcecore.auth.munge import Libmunge, MungeAuth, payload_for
from xcecore.testing import wait_for
from xcecore.testing.munge import Munged, shared_dir

pytestmark = pytest.mark.timeout(60)
USERS = auth.Users()


@pytest.fixture(scope="module")
def daemons() -> Iterator[tuple[Munged, Munged]]:
    """Two munged: this cluster's, and one with another key (another cluster's)."""
    root = shared_dir("xce-munge-test-")
    ours, theirs = Munged(root / "ours"), Munged(root / "theirs")
    try:
        ours.start()
        theirs.start()
        yield ours, theirs
    finally:
        ours.stop()
        theirs.stop()
        shutil.rmtree(root, ignore_errors=True)


def refused(server: MungeAuth, challenge: str, answer: dict[str, object]) -> auth.AuthFailed:
    with pytest.raises(auth.AuthFailed) as err:
        auth.authenticate(server, challenge, answer, USERS)
    assert str(err.value).startswith("authentication failed: ")
    return err.value


def test_a_credential_proves_the_callers_uid(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, hello = auth.server_hello(method)
    assert hello["auth"] == "munge"
    answer = auth.client_answer(method, "cli@h1", hello)
    assert set(answer) == {"from", "auth", "cred"} and answer["cred"].startswith("MUNGE:")
    who = auth.authenticate(method, challenge, answer, USERS)
    assert (who.uid, who.gid, who.user, who.method) == (os.geteuid(), os.getegid(), "root", "munge")


def test_replayed_on_the_same_or_another_connection(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, hello = auth.server_hello(method)
    answer = auth.client_answer(method, "cli@h1", hello)
    auth.authenticate(method, challenge, answer, USERS)
    assert refused(method, challenge, answer).reason == "replayed"  # munged's replay cache
    # A fresh credential made for one connection's challenge, offered on another's.
    _, hello1 = auth.server_hello(method)
    other = auth.client_answer(method, "cli@h1", hello1)
    challenge2, _ = auth.server_hello(method)
    err = refused(method, challenge2, other)
    assert err.reason == "replayed" and "another connection's challenge" in err.message


def test_a_claim_moved_to_another_role_is_refused(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, hello = auth.server_hello(method)
    answer = auth.client_answer(method, "cli@h1", hello)
    err = refused(method, challenge, {**answer, "from": "worker@h1"})
    assert err.reason == "malformed" and "made for 'cli@h1'" in err.message


def test_forged_credentials_are_refused(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, hello = auth.server_hello(method)
    cred = auth.client_answer(method, "cli@h1", hello)["cred"]
    body = cred[len("MUNGE:"):-1]
    flipped = body[:40] + ("A" if body[40] != "A" else "B") + body[41:]
    for forged in (f"MUNGE:{flipped}:", "MUNGE:AAAA:", "not a credential"):
        err = refused(method, challenge, {"from": "cli@h1", "auth": "munge", "cred": forged})
        assert err.reason in ("malformed", "invalid"), (forged, err.reason)
    assert refused(method, challenge, {"from": "cli@h1", "auth": "munge"}).reason == "malformed"


def test_another_keys_credential_is_invalid(daemons: tuple[Munged, Munged]) -> None:
    ours, theirs = MungeAuth(daemons[0].socket), MungeAuth(daemons[1].socket)
    challenge, hello = auth.server_hello(ours)
    answer = auth.client_answer(theirs, "cli@h1", hello)
    err = refused(ours, challenge, answer)
    assert err.reason == "invalid" and "another munge key" in err.message


def test_a_credential_for_another_uid_is_unauthorized(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, _ = auth.server_hello(method)
    err, cred = Libmunge(daemons[0].socket).encode(payload_for(challenge, "cli@h1"),
                                                  uid_restriction=os.geteuid() + 4242)
    assert err == 0, cred
    got = refused(method, challenge, {"from": "cli@h1", "auth": "munge", "cred": cred})
    assert got.reason == "unauthorized" and "another uid" in got.message


def test_an_expired_credential_is_refused(daemons: tuple[Munged, Munged]) -> None:
    method = MungeAuth(daemons[0].socket)
    challenge, _ = auth.server_hello(method)
    err, cred = Libmunge(daemons[0].socket).encode(payload_for(challenge, "cli@h1"), ttl=1)
    assert err == 0, cred
    made = time.time()
    # Expiry is a property of time itself: wait until munged's 1 s lifetime (and its
    # one-second clock granularity) have certainly passed.
    while time.time() < made + 2.2:
        time.sleep(0.1)
    got = refused(method, challenge, {"from": "cli@h1", "auth": "munge", "cred": cred})
    assert got.reason == "expired" and "expired" in got.message


def test_the_cluster_key_proves_nothing_to_a_munge_server(daemons: tuple[Munged, Munged]) -> None:
    from xcecore.auth.key import compute_mac

    method = MungeAuth(daemons[0].socket)
    challenge, _ = auth.server_hello(method)
    answer = {"from": "worker@h1", "auth": "key", "mac": compute_mac(b"k", challenge, "worker@h1")}
    assert refused(method, challenge, answer).reason == "wrong_method"
    answer.pop("auth")  # an old client's answer (no "auth"): the key method's
    assert refused(method, challenge, answer).reason == "wrong_method"


def test_no_munged_is_said_on_both_sides(tmp_path: Path) -> None:
    gone = MungeAuth(str(tmp_path / "no-such-socket"))
    challenge, hello = auth.server_hello(gone)
    with pytest.raises(auth.AuthFailed) as err:
        auth.client_answer(gone, "cli@h1", hello)
    assert err.value.reason == "no_daemon" and "is munged running on this host?" in err.value.message
    got = refused(gone, challenge, {"from": "cli@h1", "auth": "munge", "cred": "MUNGE:AAAA:"})
    assert got.reason == "no_daemon" and "cannot reach" in got.message


def test_a_munge_cluster_fails_over_with_the_fixtures(xce_munged: Any, xce_cluster: Any,
                                                      xce_client: Any) -> None:
    daemon = xce_munged()
    cluster = xce_cluster(2, key=None, auth="munge", munge_socket=daemon.socket)
    assert "cluster.key" not in cluster.config_path.read_text() and "key =" not in \
        cluster.config_path.read_text()
    worker = xce_client(cluster, "worker", hname="mw1", ncpus=1)
    cli = xce_client(cluster, "cli", join=False)
    assert cli.call("hello", deadline=10)["state"] == "primary"
    cluster.kill_primary()
    # Both re-authenticate with fresh credentials at the new primary; the worker re-joins.
    assert [h["name"] for h in cli.call("hostinfo", {}, deadline=10)["hosts"]] == ["mw1"]
    # The re-join follows the first call after the reconnect (the worker's rejoin point), so
    # that call's own answer may still say "not joined": wait for the one after.
    wait_for(lambda: worker.call("hello", deadline=10)["joined"] is True, 20, what="the worker re-joined")
    jobid = cli.call("jobsubmit", {"command": "true"}, deadline=10)["jobid"]
    rec = cli.call("jobinfo", {"jobids": [jobid]}, deadline=10)["jobs"][0]
    assert (rec["user"], rec["uid"], rec["via"]) == ("root", 0, None)
