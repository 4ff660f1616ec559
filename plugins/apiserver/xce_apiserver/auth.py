"""Users, PBKDF2-SHA256 password hashes and bearer tokens of the API server.

Users come from ``[apiserver] users = [{name, password_hash, role}]``; ``role`` is ``user`` or
``admin``. A hash looks like ``pbkdf2_sha256$<iterations>$<salt b64>$<digest b64>`` (print
one with ``xce apiserver hash-password``). A logon returns a random bearer token valid for
``token_ttl`` seconds; logout revokes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROLES = ("user", "admin")
ALGORITHM = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 310_000  # OWASP's 2023 figure for PBKDF2-HMAC-SHA256


class AuthConfigError(ValueError):
    """A user entry or password hash in the config is malformed; the message names it."""


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """Return the PBKDF2-SHA256 hash string of ``password``."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"{ALGORITHM}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def _parse_hash(text: str) -> tuple[int, bytes, bytes]:
    parts = text.split("$")
    if len(parts) != 4 or parts[0] != ALGORITHM:
        raise AuthConfigError(f"password hash must look like '{ALGORITHM}$<iterations>$<salt>$<digest>'")
    try:
        iterations = int(parts[1])
        salt, digest = base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    except ValueError as exc:
        raise AuthConfigError(f"password hash is malformed: {exc}") from None
    if iterations < 1 or not salt or not digest:
        raise AuthConfigError("password hash has no iterations, salt or digest")
    return iterations, salt, digest


def verify_password(password: str, hashed: str) -> bool:
    """True when ``password`` matches ``hashed`` (constant-time comparison)."""
    iterations, salt, digest = _parse_hash(hashed)
    got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return hmac.compare_digest(got, digest)


@dataclass(frozen=True, slots=True)
class User:
    """A configured user."""

    name: str
    password_hash: str
    role: str

    @property
    def is_admin(self) -> bool:
        """True for administrators."""
        return self.role == "admin"


def parse_users(entries: Iterable[Any]) -> dict[str, User]:
    """Validate ``[apiserver] users``; raise :class:`AuthConfigError` naming the bad entry."""
    users: dict[str, User] = {}
    for i, entry in enumerate(entries):
        where = f"apiserver.users[{i}]"
        if not isinstance(entry, Mapping):
            raise AuthConfigError(f"{where}: expected a table {{name, password_hash, role}}")
        unknown = sorted(set(entry) - {"name", "password_hash", "role"})
        if unknown:
            raise AuthConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        name, hashed, role = entry.get("name"), entry.get("password_hash"), entry.get("role", "user")
        if not isinstance(name, str) or not name:
            raise AuthConfigError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(hashed, str):
            raise AuthConfigError(f"{where} ({name}): 'password_hash' must be a string")
        try:
            _parse_hash(hashed)
        except AuthConfigError as exc:
            raise AuthConfigError(f"{where} ({name}): {exc}") from None
        if role not in ROLES:
            raise AuthConfigError(f"{where} ({name}): 'role' must be 'user' or 'admin', got {role!r}")
        if name in users:
            raise AuthConfigError(f"{where}: user {name!r} is listed twice")
        users[name] = User(name, hashed, role)
    return users


@dataclass(frozen=True, slots=True)
class Session:
    """A logged-on user's token."""

    token: str
    user: User
    expires: float


class Authenticator:
    """Checks passwords and issues, looks up and revokes bearer tokens (thread-safe)."""

    def __init__(
        self,
        users: Mapping[str, User],
        *,
        token_ttl: float = 8 * 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.users = dict(users)
        self.token_ttl = token_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, Session] = {}
        # Unknown users are checked against this so a logon takes as long either way.
        self._dummy = hash_password("", iterations=DEFAULT_ITERATIONS // 10)

    def check_password(self, username: str, password: str) -> User | None:
        """The user if ``password`` is right (slow on purpose: run it on a thread)."""
        user = self.users.get(username)
        if user is None:
            verify_password(password, self._dummy)
            return None
        return user if verify_password(password, user.password_hash) else None

    def issue(self, user: User) -> Session:
        """A new token for ``user``."""
        session = Session(secrets.token_urlsafe(32), user, self._clock() + self.token_ttl)
        with self._lock:
            self._purge()
            self._tokens[session.token] = session
        return session

    def lookup(self, token: str) -> Session | None:
        """The live session of ``token``, or None (unknown, revoked or expired)."""
        with self._lock:
            session = self._tokens.get(token)
            if session is None:
                return None
            if self._clock() >= session.expires:
                del self._tokens[token]
                return None
            return session

    def revoke(self, token: str) -> bool:
        """Forget ``token``; True if it was live."""
        with self._lock:
            return self._tokens.pop(token, None) is not None

    def _purge(self) -> None:
        now = self._clock()
        for token in [t for t, s in self._tokens.items() if now >= s.expires]:
            del self._tokens[token]
