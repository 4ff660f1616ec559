"""Cluster-key authentication: the challenge/response that opens every connection.

The server speaks first with ``{"proto": 1, "challenge": <random>}``; the client answers
``{"from": "<role>@<host>", "mac": HMAC-SHA256(key, challenge + from)}``; the server answers
``{"ok": true, ...status}`` or ``{"ok": false, "error": {...}}`` and closes. The status in the
accepting answer is the server's to fill (a controller says whether it is the primary), so a
client learns where to go without a further round trip.

A cluster with no key is allowed only on loopback; :func:`check_keyless` enforces that.

The client's side of the exchange is ONE function, :func:`client_answer`, which both the
event-loop client and the one-shot commands call (through ``xcecore.client.dialer``); it is
the seam where another credential (MUNGE, issue #18) will plug in. This module stays cheap to
import for them: what only a server or the config loader needs is imported where it is used.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from xcecore import wire


class AuthError(Exception):
    """The handshake failed: wrong key, wrong protocol, or a malformed answer."""


def make_challenge() -> str:
    """A fresh random challenge (128 bits, hex)."""
    import secrets

    return secrets.token_hex(16)


def compute_mac(key: bytes | None, challenge: str, sender: str) -> str:
    """HMAC-SHA256 of ``challenge + sender`` under ``key`` (hex); an empty key when keyless."""
    return hmac.new(key or b"", (challenge + sender).encode(), hashlib.sha256).hexdigest()


def verify_mac(key: bytes | None, challenge: str, sender: str, mac: object) -> bool:
    """Constant-time check of a client's MAC."""
    if not isinstance(mac, str):
        return False
    return hmac.compare_digest(compute_mac(key, challenge, sender), mac)


def load_key(key: str | None, key_file: str | None) -> bytes | None:
    """The cluster key from config: inline text or a file's stripped contents; None if neither."""
    if key is not None and key_file is not None:
        raise AuthError("configure either cluster.key or cluster.key_file, not both")
    if key_file is not None:
        try:
            with open(key_file, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError as exc:
            raise AuthError(f"cannot read cluster.key_file {key_file!r}: {exc.strerror}") from None
        if not text:
            raise AuthError(f"cluster.key_file {key_file!r} is empty")
        return text.encode()
    return key.encode() if key else None


def is_loopback(host: str) -> bool:
    """True for loopback addresses and ``localhost``."""
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_keyless(key: bytes | None, hosts: list[str]) -> None:
    """Refuse a keyless cluster anywhere but on loopback."""
    if key is None:
        remote = [h for h in hosts if not is_loopback(h)]
        if remote:
            raise AuthError(
                f"no cluster key configured, but {', '.join(remote)} is not loopback: "
                "set cluster.key or cluster.key_file"
            )


def server_hello() -> tuple[str, dict[str, Any]]:
    """The challenge and the first message a server sends."""
    challenge = make_challenge()
    return challenge, {"proto": wire.PROTO_VERSION, "challenge": challenge}


def check_client_answer(key: bytes | None, challenge: str, answer: dict[str, Any]) -> str:
    """Validate the client's answer; return its identity (``role@host``) or raise AuthError."""
    sender = answer.get("from")
    if not isinstance(sender, str) or not sender or len(sender) > 256:
        raise AuthError("handshake answer has no valid 'from'")
    if not verify_mac(key, challenge, sender, answer.get("mac")):
        raise AuthError(f"bad cluster-key MAC from {sender!r}")
    return sender


def client_answer(key: bytes | None, sender: str, hello: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to a server hello; raises AuthError on a protocol mismatch.

    The one credential step of every client (see the module docstring).
    """
    if hello.get("proto") != wire.PROTO_VERSION:
        raise AuthError(f"server speaks protocol {hello.get('proto')!r}, not {wire.PROTO_VERSION}")
    challenge = hello.get("challenge")
    if not isinstance(challenge, str):
        raise AuthError("server hello has no challenge")
    return {"from": sender, "mac": compute_mac(key, challenge, sender)}
