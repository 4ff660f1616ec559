"""Cluster-key challenge/response."""

from __future__ import annotations

import pytest

from xcecore import auth

pytestmark = pytest.mark.timeout(30)


def test_mac_roundtrip() -> None:
    challenge, hello = auth.server_hello()
    answer = auth.client_answer(b"secret", "worker@h1", hello)
    assert auth.check_client_answer(b"secret", challenge, answer) == "worker@h1"


def test_wrong_key_rejected() -> None:
    challenge, hello = auth.server_hello()
    answer = auth.client_answer(b"wrong", "worker@h1", hello)
    with pytest.raises(auth.AuthError, match="bad cluster-key MAC from 'worker@h1'"):
        auth.check_client_answer(b"secret", challenge, answer)


def test_identity_is_bound_to_the_mac() -> None:
    challenge, hello = auth.server_hello()
    answer = auth.client_answer(b"k", "worker@h1", hello)
    answer["from"] = "admin@h1"
    with pytest.raises(auth.AuthError):
        auth.check_client_answer(b"k", challenge, answer)


@pytest.mark.parametrize("answer", [{}, {"from": ""}, {"from": "x", "mac": 5}, {"from": "x"}])
def test_malformed_answers(answer: dict[str, object]) -> None:
    with pytest.raises(auth.AuthError):
        auth.check_client_answer(b"k", "c", answer)


def test_protocol_mismatch() -> None:
    with pytest.raises(auth.AuthError, match="protocol"):
        auth.client_answer(b"k", "a@b", {"proto": 99, "challenge": "x"})


def test_challenges_are_fresh() -> None:
    assert auth.make_challenge() != auth.make_challenge()


def test_keyless_only_on_loopback() -> None:
    auth.check_keyless(None, ["127.0.0.1", "::1", "localhost"])
    auth.check_keyless(b"k", ["10.0.0.1"])
    with pytest.raises(auth.AuthError, match="10.0.0.1 is not loopback"):
        auth.check_keyless(None, ["127.0.0.1", "10.0.0.1"])


def test_key_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "key"
    f.write_text("s3cret\n")
    assert auth.load_key(None, str(f)) == b"s3cret"
    with pytest.raises(auth.AuthError, match="not both"):
        auth.load_key("a", str(f))
    with pytest.raises(auth.AuthError, match="cannot read"):
        auth.load_key(None, str(tmp_path / "missing"))
