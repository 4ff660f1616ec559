"""The ``key`` method: an HMAC of the challenge under the shared cluster key.

The client answers ``{"mac": HMAC-SHA256(key, challenge + sender)}``; the MAC binds the
challenge (so it is good for one connection) and the claimed ``role@host``. The key proves
that the caller is a member of the cluster and nothing more: anyone who can read it can be
any role, so every key holder is one identity, the OS user that owns the cluster, taken as
the verifying process's own uid and gid (the controller's). That is the embedded single-user
cluster's model (``xce up``, tests); multi-user sites use ``munge``.

The key file must be readable by the cluster's owner only (mode 0600): with this method
every process that authenticates -- daemons and commands -- reads it. A cluster with no key
is allowed only on loopback (:meth:`KeyAuth.check_peer_hosts`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xcecore.auth import AuthError, AuthFailed, AuthMethod, AuthSettings, Verified

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

_INNER = bytes(x ^ 0x36 for x in range(256))
_OUTER = bytes(x ^ 0x5C for x in range(256))


_sha256: Any = None  # the constructor, found once (see sha256_constructor)


def sha256_constructor() -> Any:
    """SHA-256's constructor: CPython's built-in one where it has it (``_sha2`` from 3.12,
    ``_sha256`` before), since ``hashlib`` initialises OpenSSL on import -- a few ms of every
    one-shot command's start-up -- and else ``hashlib``'s.

    Found once and kept: an import that fails (``_sha2`` on 3.11) is not cached by Python and
    searches every ``sys.path`` entry again, which a controller did for every handshake (about
    10 % of its CPU in a join storm of 10,000 workers)."""
    global _sha256
    if _sha256 is not None:
        return _sha256
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            from hashlib import sha256
    _sha256 = sha256
    return sha256


def compute_mac(key: bytes | None, challenge: str, sender: str) -> str:
    """HMAC-SHA256 (RFC 2104) of ``challenge + sender`` under ``key`` (hex); an empty key
    when keyless. Written out over :func:`sha256_constructor` rather than through :mod:`hmac`, which
    imports :mod:`hashlib` (tests compare it with :func:`hmac.new`)."""
    sha256 = sha256_constructor()
    k = key or b""
    if len(k) > 64:
        k = sha256(k).digest()
    k = k.ljust(64, b"\0")
    inner = sha256(k.translate(_INNER) + (challenge + sender).encode()).digest()
    return str(sha256(k.translate(_OUTER) + inner).hexdigest())


def is_loopback(host: str) -> bool:
    """True for loopback addresses and ``localhost``."""
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyAuth(AuthMethod):
    """The ``key`` method over ``key`` (None: keyless, loopback only)."""

    name = "key"
    blocking = False

    def __init__(self, key: bytes | None) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyAuth) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("key", self.key))

    def __repr__(self) -> str:
        return f"KeyAuth({'<key>' if self.key else None})"

    def answer(self, challenge: str, sender: str) -> dict[str, Any]:
        """``{"mac": ...}`` for ``challenge`` and ``sender``."""
        return {"mac": compute_mac(self.key, challenge, sender)}

    def verify(self, challenge: str, sender: str, answer: Mapping[str, Any]) -> Verified:
        """Check the MAC; the identity is this process's own uid and gid (the owner's)."""
        import hmac

        mac = answer.get("mac")
        if not isinstance(mac, str) or not hmac.compare_digest(
                compute_mac(self.key, challenge, sender), mac):
            raise AuthFailed("bad_key", f"bad cluster key: the MAC from {sender!r} does not "
                                        "match (check cluster.key / cluster.key_file)")
        return Verified(os.geteuid(), os.getegid())

    def check_peer_hosts(self, hosts: list[str]) -> None:
        """Refuse a keyless cluster anywhere but on loopback."""
        if self.key is None:
            remote = [h for h in hosts if not is_loopback(h)]
            if remote:
                raise AuthError(
                    f"no cluster key configured, but {', '.join(remote)} is not loopback: "
                    "set cluster.key or cluster.key_file (or cluster.auth = 'munge')"
                )


def make(settings: AuthSettings) -> KeyAuth:
    """The method of ``settings`` (``[cluster] auth = "key"``)."""
    return KeyAuth(settings.key)
