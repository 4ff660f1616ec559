"""Users, PBKDF2-SHA256 password hashes and bearer tokens of the API server.

Users come from ``[apiserver] users = [{name, password_hash, role}]``; ``role`` is ``user`` or
``admin``. A hash looks like ``pbkdf2_sha256$<iterations>$<salt b64>$<digest b64>`` (print
one with ``xce apiserver hash-password``).

A logon returns a signed bearer token (a JWT, HS256) valid for ``token_ttl`` seconds, naming
the user (``sub``), its expiry (``exp``) and a unique id (``jti``). The signing key is
``[apiserver] token_key_file`` (mode 0600, shared by the site's API servers: a token is then
accepted by every one of them and after a restart; ``xce apiserver token-key FILE`` makes one)
or, unset, a random key of this process (tokens die with it). The user's role is read from
the configuration at every request, never from the token. ``/auth/refresh`` swaps a live
token for a fresh one. Logout (and refresh, for the old token) revokes a token by its id
until it would have expired, through the controller: every API server refuses it from then
on (:mod:`xce_apiserver.revocations`), and so does every token of a user issued before an
``xce admin revoke-tokens USER``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xce_apiserver.revocations import RevocationList

ROLES = ("user", "admin")
PAM_HASH = "pam"  # the password_hash of a user PAM vouched for (not in [apiserver] users)
ISSUER = "xce"
TOKEN_ALGORITHM = "HS256"
KEY_BYTES = 32  # the least a token key file may hold (RFC 7518: a key as long as the hash)
ALGORITHM = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 310_000  # OWASP's 2023 figure for PBKDF2-HMAC-SHA256
VERIFIED_CACHE = 10_000
"""Verified tokens remembered (by their text) so a request skips the signature check; when
full, the expired ones go, else the oldest half (a pass over it once per 5,000 new tokens)."""
MAX_TOKEN = 4096
"""Characters a bearer token may have (ours are ~250): a longer one is invalid unread."""


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
    """A logged-on user's token: the token itself, its user, expiry (epoch s), id and when
    it was issued (epoch s)."""

    token: str
    user: User
    expires: float
    jti: str = ""
    issued: float = 0.0


def load_token_key(path: str) -> bytes:
    """The token signing key in ``path``: at least 32 bytes, mode 0600 or stricter (a key
    others can read lets them mint tokens for anyone). Raises :class:`AuthConfigError`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise AuthConfigError(f"apiserver.token_key_file {path!r} cannot be read: "
                              f"{exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthConfigError(f"apiserver.token_key_file {path!r} has mode "
                                  f"{stat.S_IMODE(mode):04o}: others could mint tokens; "
                                  "chmod 0600 it")
        key = fh.read(4096).strip()
    if len(key) < KEY_BYTES:
        raise AuthConfigError(f"apiserver.token_key_file {path!r} holds {len(key)} bytes; a "
                              f"key needs at least {KEY_BYTES} (`xce apiserver token-key FILE`)")
    return key


def write_token_key(path: str) -> None:
    """Write a new random token key to ``path`` (mode 0600, never over an existing file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(48) + "\n")


class Authenticator:
    """Checks passwords and issues, checks and refreshes signed tokens.

    ``key``: the signing key shared by the site's API servers (None: a random one of this
    process). ``clock`` is the wall clock (tokens carry epoch times). ``revocations``: the
    revoked-token list every token is checked against (the store's; None: one of its own).
    """

    def __init__(
        self,
        users: Mapping[str, User],
        *,
        token_ttl: float = 8 * 3600.0,
        clock: Callable[[], float] = time.time,
        key: bytes | None = None,
        pam_service: str | None = None,
        revocations: RevocationList | None = None,
    ) -> None:
        import jwt

        self._jwt = jwt
        self.users = dict(users)
        self.token_ttl = token_ttl
        self.shared_key = key is not None
        self.pam_service = pam_service
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        self._clock = clock
        self.revocations = revocations if revocations is not None else RevocationList()
        # Verified tokens by their text: (user name, jti, issued, expires, pam). A hit skips
        # the signature check and JSON decode (about a fifth of a POST's CPU); expiry, the
        # user's configuration and revocations are checked on every request all the same.
        # Only tokens whose signature verified get in, so a client cannot fill it with junk.
        self._verified: dict[str, tuple[str, str, float, float, bool]] = {}
        # Unknown users are checked against this so a logon takes as long either way.
        self._dummy = hash_password("", iterations=DEFAULT_ITERATIONS // 10)

    def check_password(self, username: str, password: str) -> User | None:
        """The user if ``password`` is right (slow on purpose: run it on a thread).

        A configured user is checked against its hash; any other, with ``pam_service`` set,
        against PAM (the system's users: ``pam_authenticate`` then ``pam_acct_mgmt``, so an
        expired or locked account is refused too), as role ``user``.
        """
        user = self.users.get(username)
        if user is not None:
            return user if verify_password(password, user.password_hash) else None
        if self.pam_service is not None:
            return User(username, PAM_HASH, "user") if self._pam(username, password) else None
        verify_password(password, self._dummy)
        return None

    def _pam(self, username: str, password: str) -> bool:
        import pam

        checker = pam.PamAuthenticator()  # one per call: it keeps its handle
        try:
            return bool(checker.authenticate(username, password, service=self.pam_service,
                                             resetcreds=False))
        except (ValueError, TypeError):  # a NUL in the name or password
            return False

    def issue(self, user: User) -> Session:
        """A new signed token for ``user``."""
        now = self._clock()
        expires = now + self.token_ttl
        jti = secrets.token_urlsafe(16)
        # ``iat`` to the microsecond (RFC 7519 allows a fraction): a revocation of every token
        # issued before a moment must not catch one issued later in the same second.
        claims: dict[str, Any] = {"iss": ISSUER, "sub": user.name, "iat": now,
                                  "exp": expires, "jti": jti}
        if user.password_hash == PAM_HASH:
            claims["pam"] = True  # a system user: no [apiserver] users entry to find it by
        token = self._jwt.encode(claims, self._key, algorithm=TOKEN_ALGORITHM)
        return Session(token, user, expires, jti, now)

    def lookup(self, token: str) -> Session | None:
        """The live session of ``token``, or None (see :meth:`check`)."""
        found = self.check(token)
        return found if isinstance(found, Session) else None

    def check(self, token: str) -> Session | str:
        """The live session of ``token``, or why there is none: forged or malformed, expired,
        revoked (the reason says so and by what), or its user is no longer configured.

        A token whose signature was verified once is remembered until it expires (at most
        :data:`VERIFIED_CACHE` of them); every other check is made on every call."""
        hit = self._verified.get(token)
        if hit is None:
            claims = self._verify(token)
            if isinstance(claims, str):
                return claims
            hit = claims
            if len(self._verified) >= VERIFIED_CACHE:
                self._evict()
            self._verified[token] = hit
        name, jti, issued, expires, pam = hit
        if self._clock() >= expires:
            self._verified.pop(token, None)
            return "token expired"
        user = self.users.get(name)
        if user is None and pam and self.pam_service is not None:
            user = User(name, PAM_HASH, "user")
        if user is None:
            return "invalid token: its user is not configured"
        why = self.revocations.why(jti, name, issued)
        if why is not None:
            return why
        return Session(token, user, expires, jti, issued)

    def _verify(self, token: str) -> tuple[str, str, float, float, bool] | str:
        """The claims of ``token`` once its signature and shape are checked, or why not."""
        if len(token) > MAX_TOKEN:
            return "invalid token"
        try:
            claims = self._jwt.decode(
                token, self._key, algorithms=[TOKEN_ALGORITHM], issuer=ISSUER,
                options={"verify_exp": False, "verify_iat": False,
                         "require": ["exp", "sub", "jti", "iss", "iat"]})
        except self._jwt.InvalidTokenError:
            return "invalid token"
        expires, name, jti, issued = claims["exp"], claims["sub"], claims["jti"], claims["iat"]
        if not isinstance(expires, int | float) or not isinstance(name, str) \
                or not isinstance(jti, str) or not isinstance(issued, int | float):
            return "invalid token"
        return name, jti, float(issued), float(expires), claims.get("pam") is True

    def _evict(self) -> None:
        """Make room: drop the expired tokens, else the oldest half (insertion order)."""
        now = self._clock()
        kept = {t: v for t, v in self._verified.items() if v[3] > now}
        if len(kept) >= VERIFIED_CACHE:
            kept = dict(list(kept.items())[len(kept) // 2:])
        self._verified = kept

    def refresh(self, session: Session) -> Session:
        """A fresh token for ``session``'s user (the caller revokes the old one)."""
        return self.issue(session.user)
