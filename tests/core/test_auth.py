"""The credential step: the ``key`` method, method loading, the uid -> name lookup."""

from __future__ import annotations

import os
import pwd
from typing import Any

import pytest

from xcecore import auth
from xcecore.auth.key import KeyAuth

pytestmark = pytest.mark.timeout(30)
USERS = auth.Users()


def handshake(server: auth.AuthMethod, client: auth.AuthMethod, sender: str = "worker@h1",
              tamper: dict[str, Any] | None = None) -> auth.Identity:
    challenge, hello = auth.server_hello(server)
    answer = auth.client_answer(client, sender, hello)
    return auth.authenticate(server, challenge, {**answer, **(tamper or {})}, USERS)


def test_key_roundtrip_is_the_owner() -> None:
    who = handshake(KeyAuth(b"secret"), KeyAuth(b"secret"))
    assert who == auth.Identity(os.geteuid(), os.getegid(), pwd.getpwuid(os.geteuid()).pw_name,
                                "worker", "h1", "key")
    assert who.sender == "worker@h1" and who.to_wire()["method"] == "key"


def test_wrong_key_is_refused_as_bad_key() -> None:
    with pytest.raises(auth.AuthFailed) as err:
        handshake(KeyAuth(b"secret"), KeyAuth(b"wrong"))
    assert err.value.reason == "bad_key"
    assert str(err.value).startswith("authentication failed: bad cluster key")
    assert err.value.to_error()["code"] == "AUTH"


def test_identity_is_bound_to_the_mac() -> None:
    with pytest.raises(auth.AuthFailed, match="bad cluster key"):
        handshake(KeyAuth(b"k"), KeyAuth(b"k"), tamper={"from": "scheduler@h1"})


def test_a_key_answer_to_a_munge_server_is_the_wrong_method() -> None:
    from xcecore.auth.munge import MungeAuth

    challenge, hello = auth.server_hello(MungeAuth("/nonexistent"))
    with pytest.raises(auth.AuthFailed) as err:
        auth.client_answer(KeyAuth(b"k"), "cli@h", hello)
    assert err.value.reason == "wrong_method" and "'munge'" in err.value.message
    answer = {"from": "cli@h", "auth": "key", "mac": "00"}
    with pytest.raises(auth.AuthFailed) as err:
        auth.authenticate(MungeAuth("/nonexistent"), challenge, answer, USERS)
    assert err.value.reason == "wrong_method"


@pytest.mark.parametrize("answer", [{}, {"from": ""}, {"from": "x", "mac": 5}, {"from": "x"},
                                    {"from": "@h"}, {"from": "a" * 300 + "@h"}])
def test_malformed_answers(answer: dict[str, object]) -> None:
    with pytest.raises((auth.AuthError, auth.AuthFailed)):
        auth.authenticate(KeyAuth(b"k"), "c", answer, USERS)


def test_protocol_mismatch() -> None:
    with pytest.raises(auth.AuthError, match="protocol"):
        auth.client_answer(KeyAuth(b"k"), "a@b", {"proto": 99, "challenge": "x"})


def test_challenges_are_fresh() -> None:
    assert auth.make_challenge() != auth.make_challenge()


def test_keyless_only_on_loopback() -> None:
    KeyAuth(None).check_peer_hosts(["127.0.0.1", "::1", "localhost"])
    KeyAuth(b"k").check_peer_hosts(["10.0.0.1"])
    with pytest.raises(auth.AuthError, match="10.0.0.1 is not loopback"):
        KeyAuth(None).check_peer_hosts(["127.0.0.1", "10.0.0.1"])


def test_key_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "key"
    f.write_text("s3cret\n")
    assert auth.load_key(None, str(f)) == b"s3cret"
    with pytest.raises(auth.AuthError, match="not both"):
        auth.load_key("a", str(f))
    with pytest.raises(auth.AuthError, match="cannot read"):
        auth.load_key(None, str(tmp_path / "missing"))


def test_settings_pick_the_method_and_munge_refuses_a_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = auth.settings_from_cluster({"key": "abc"})
    assert s.method == "key" and s.key == b"abc"
    assert auth.load_method(s) == KeyAuth(b"abc") and auth.load_method(s) is auth.load_method(s)
    m = auth.settings_from_cluster({"auth": "munge", "munge_socket": "/run/m.sock"})
    assert auth.load_method(m).name == "munge" and m.key is None
    with pytest.raises(auth.AuthError, match="only auth = 'key' uses a shared key"):
        auth.settings_from_cluster({"auth": "munge", "key_file": str(tmp_path / "k")})


def test_an_unknown_method_names_the_entry_point_group() -> None:
    with pytest.raises(auth.AuthError, match="'xce.auth'"):
        auth.load_method(auth.AuthSettings("nosuch"))


def test_unknown_uid_is_refused_and_names_are_the_servers() -> None:
    users = auth.Users()
    assert users.name(0) == "root"
    with pytest.raises(auth.AuthFailed) as err:
        users.name(2**31 - 11)
    assert err.value.reason == "unknown_uid"
    users.pin(2**31 - 11, "owner")
    assert users.name(2**31 - 11) == "owner"


def test_the_mac_is_hmac_sha256_and_its_constructor_is_found_once() -> None:
    # The hand-written HMAC equals the standard one (short and over-long keys), and the
    # constructor is looked up once: a failing import (``_sha2`` before 3.12) is not cached
    # by Python and cost a sys.path search per handshake.
    import hashlib
    import hmac

    from xcecore.auth import key

    for k in (b"k", b"x" * 100, None):
        want = hmac.new(k or b"", b"c0ffee" + b"worker@h1", hashlib.sha256).hexdigest()
        assert key.compute_mac(k, "c0ffee", "worker@h1") == want
    assert key.sha256_constructor() is key.sha256_constructor() is key._sha256
