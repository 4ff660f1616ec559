"""Who is calling: the handshake's credential step, the authentication methods, the identity.

Every connection opens with a challenge and an answer::

    server -> {"proto": 1, "challenge": <random>, "auth": "<method>"}    (+ a standby's verdict)
    client -> {"from": "<role>@<host>", "auth": "<method>", ...the method's credential}
    server -> {"ok": true, ...status, "identity": {...}}
              or {"ok": false, "error": {"code": "AUTH", "reason": ..., "message": ...}}

Authentication is a plugin, chosen by ``[cluster] auth`` (as Slurm's auth plugins are):

- ``key`` (:mod:`xcecore.auth.key`, the default): an HMAC over the challenge under a shared
  cluster key. The key proves a cluster member, nothing more: every key holder is the OS user
  that owns the cluster (the verifying process's own uid). For the embedded single-user
  cluster and tests.
- ``munge`` (:mod:`xcecore.auth.munge`): a MUNGE credential minted by the client host's
  ``munged`` (which learns the caller's uid from the kernel), its payload binding the
  challenge and the claimed ``role@host``, decoded by the controller host's ``munged``. No
  xce process holds a secret. For multi-user sites.
- a third party's: an object of the :class:`AuthMethod` shape, made by a factory declared in
  the entry-point group :data:`ENTRY_POINT_GROUP` under the method's name, loaded only when
  ``[cluster] auth`` names it.

The built-in methods are found by name, without pluggy or an entry-point scan: the one-shot
commands pay only for the module of the configured method. A client's ONE credential step is
:func:`client_answer` (both the event-loop client and the one-shot commands reach it through
``xcecore.client.dialer``); a server's is :func:`authenticate`, which returns an
:class:`Identity` whose user name comes from the server's own uid -> name lookup
(:class:`Users`), never from the client.
"""

from __future__ import annotations

from collections.abc import Mapping

from xcecore import wire

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

BUILTIN: dict[str, str] = {"key": "xcecore.auth.key", "munge": "xcecore.auth.munge"}
"""Built-in methods: name -> module (whose ``make(settings)`` builds the method)."""
ENTRY_POINT_GROUP = "xce.auth"
"""Entry-point group of third-party methods: ``name = "pkg.module:factory"``, where
``factory(settings: AuthSettings) -> AuthMethod``."""
SENDER_MAX = 256
"""Longest ``role@host`` a handshake may claim."""


class AuthError(ValueError):
    """The authentication configuration is wrong, or a peer broke the handshake's protocol."""


class AuthFailed(Exception):
    """A credential was refused (or could not be made): ``reason`` is a short code, the message
    says what is wrong. ``str()`` reads ``authentication failed: <message>``.

    Reasons: ``bad_key``, ``expired``, ``rewound``, ``replayed``, ``invalid`` (made under
    another key), ``malformed``, ``unauthorized`` (restricted to another uid/gid),
    ``unknown_uid``, ``wrong_method``, ``no_daemon`` (munged unreachable), ``role`` (the role
    claimed needs a service identity), or a third-party method's own.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"authentication failed: {self.message}"

    def to_error(self) -> dict[str, Any]:
        """The refusal as the handshake's error object (code ``AUTH``)."""
        return {"code": "AUTH", "reason": self.reason, "message": str(self)}


# The two records below are tuples with named fields, written out: ``typing.NamedTuple``
# would make every one-shot command import ``typing`` (~7 ms of its start-up).


class Verified(tuple[int, int]):
    """What a method proves about the caller: its uid and gid (a ``(uid, gid)`` tuple)."""

    __slots__ = ()

    def __new__(cls, uid: int, gid: int) -> Verified:
        return super().__new__(cls, (uid, gid))

    @property
    def uid(self) -> int:
        return self[0]

    @property
    def gid(self) -> int:
        return self[1]

    def __repr__(self) -> str:
        return f"Verified(uid={self[0]!r}, gid={self[1]!r})"


class Identity(tuple[int, int, str, str, str, str]):
    """An authenticated caller: ``uid``/``gid`` (proven by ``method``), ``user`` (the server's
    own name for that uid), and the ``role`` and ``host`` it claimed in ``role@host``
    (a ``(uid, gid, user, role, host, method)`` tuple)."""

    __slots__ = ()

    def __new__(cls, uid: int, gid: int, user: str, role: str, host: str, method: str) -> Identity:
        return super().__new__(cls, (uid, gid, user, role, host, method))

    @property
    def uid(self) -> int:
        return self[0]

    @property
    def gid(self) -> int:
        return self[1]

    @property
    def user(self) -> str:
        return self[2]

    @property
    def role(self) -> str:
        return self[3]

    @property
    def host(self) -> str:
        return self[4]

    @property
    def method(self) -> str:
        return self[5]

    def __repr__(self) -> str:
        return (f"Identity(uid={self[0]!r}, gid={self[1]!r}, user={self[2]!r}, role={self[3]!r}, "
                f"host={self[4]!r}, method={self[5]!r})")

    @property
    def sender(self) -> str:
        """The handshake's ``role@host``."""
        return f"{self.role}@{self.host}"

    def label(self) -> str:
        """How logs name the caller: ``alice (uid 1001) as cli@h1``."""
        return f"{self.user} (uid {self.uid}) as {self.sender}"

    def to_wire(self) -> dict[str, Any]:
        """What the accepting handshake tells the client about itself."""
        return {"user": self.user, "uid": self.uid, "gid": self.gid, "method": self.method}


class AuthSettings:
    """The ``[cluster]`` keys a method is made from (immutable, hashable).

    ``method`` is ``[cluster] auth``; ``key`` the cluster key (``key`` mode only);
    ``munge_socket`` munged's socket (None: libmunge's default); ``options`` the
    ``[cluster] auth_options`` table, for a third-party method.
    """

    __slots__ = ("key", "method", "munge_socket", "options")

    method: str
    key: bytes | None
    munge_socket: str | None
    options: tuple[tuple[str, Any], ...]

    def __init__(self, method: str = "key", *, key: bytes | None = None,
                 munge_socket: str | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        set_ = object.__setattr__
        set_(self, "method", method)
        set_(self, "key", key)
        set_(self, "munge_socket", munge_socket)
        set_(self, "options", tuple(sorted((options or {}).items())))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"AuthSettings is immutable (cannot set {name!r})")

    def _fields(self) -> tuple[Any, ...]:
        return (self.method, self.key, self.munge_socket, self.options)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AuthSettings) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"AuthSettings({self.method!r}, key={'<key>' if self.key else None}, "
                f"munge_socket={self.munge_socket!r}, options={dict(self.options)!r})")


def settings_from_cluster(cluster: Mapping[str, Any]) -> AuthSettings:
    """The :class:`AuthSettings` of a validated ``[cluster]`` section.

    The key file is read only in ``key`` mode; any other method refuses a configured key:
    with ``munge`` nothing but munged holds a secret. Raises :class:`AuthError`.
    """
    method = cluster.get("auth") or "key"
    key_text, key_file = cluster.get("key"), cluster.get("key_file")
    if method != "key":
        if key_text is not None or key_file is not None:
            raise AuthError(f"cluster.auth is {method!r}: remove cluster.key and "
                            "cluster.key_file (only auth = 'key' uses a shared key)")
        return AuthSettings(method, munge_socket=cluster.get("munge_socket"),
                            options=cluster.get("auth_options") or {})
    return AuthSettings("key", key=load_key(key_text, key_file))


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


class AuthMethod:
    """An authentication method: what both ends of the handshake do with a credential.

    A method is one object for both sides (the client mints, the server verifies), built once
    per process from :class:`AuthSettings`. ``blocking`` says whether :meth:`answer` or
    :meth:`verify` may block (talk to a daemon, a directory): an event loop then calls them on
    a thread. Methods must compare equal when made from equal settings (client configs are
    compared).
    """

    name: str = ""
    blocking: bool = False

    def answer(self, challenge: str, sender: str) -> dict[str, Any]:
        """Client side: the credential fields of the answer to ``challenge`` from ``sender``
        (``role@host``), bound to both. Raises :class:`AuthFailed` when none can be made."""
        raise NotImplementedError(f"auth method {self.name!r} does not implement answer()")

    def verify(self, challenge: str, sender: str, answer: Mapping[str, Any]) -> Verified:
        """Server side: check ``answer`` against ``challenge`` and ``sender``; the proven
        uid and gid, or :class:`AuthFailed` with the reason."""
        raise NotImplementedError(f"auth method {self.name!r} does not implement verify()")

    def check_peer_hosts(self, hosts: list[str]) -> None:
        """Refuse a configuration this method cannot protect (``key`` without a key off
        loopback); raises :class:`AuthError`. Nothing to check by default."""


_MADE: dict[AuthSettings, AuthMethod] = {}


def load_method(settings: AuthSettings) -> AuthMethod:
    """The method ``settings`` name (made once per process and settings).

    Built-ins are imported by name; a third party's through its entry point, only now.
    Raises :class:`AuthError` for an unknown name or a factory that fails.
    """
    made = _MADE.get(settings)
    if made is not None:
        return made
    module = BUILTIN.get(settings.method)
    # A built-in through the import statement's own function (``importlib`` would cost a
    # one-shot command ~0.7 ms more, with ``warnings``); ``fromlist``: the module itself.
    made = (__import__(module, fromlist=["make"]).make(settings) if module is not None
            else _third_party(settings))
    _MADE[settings] = made
    return made


def _third_party(settings: AuthSettings) -> AuthMethod:
    from xcecore.entrypoints import scan

    found = [ep for ep in scan(ENTRY_POINT_GROUP) if ep.name == settings.method]
    if not found:
        raise AuthError(f"unknown cluster.auth {settings.method!r}: the built-in methods are "
                        f"{', '.join(sorted(BUILTIN))}, and no installed distribution declares "
                        f"{settings.method!r} in the entry-point group {ENTRY_POINT_GROUP!r}")
    try:
        made = found[0].load()(settings)  # type: ignore[operator]
    except Exception as exc:
        raise AuthError(f"cluster.auth {settings.method!r} ({found[0].value}) failed to load: "
                        f"{type(exc).__name__}: {exc}") from exc
    for attr in ("answer", "verify"):
        if not callable(getattr(made, attr, None)):
            raise AuthError(f"cluster.auth {settings.method!r} ({found[0].value}) made "
                            f"{type(made).__name__}, which has no {attr}() method")
    if getattr(made, "name", None) != settings.method:
        raise AuthError(f"cluster.auth {settings.method!r} ({found[0].value}) made a method "
                        f"named {getattr(made, 'name', None)!r}")
    return made  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- handshake


def make_challenge() -> str:
    """A fresh random challenge (128 bits, hex)."""
    import secrets

    return secrets.token_hex(16)


def server_hello(method: AuthMethod) -> tuple[str, dict[str, Any]]:
    """The challenge and the first message a server sends."""
    challenge = make_challenge()
    return challenge, {"proto": wire.PROTO_VERSION, "challenge": challenge, "auth": method.name}


def client_answer(method: AuthMethod, sender: str, hello: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to a server hello: THE credential step of every client.

    Raises :class:`AuthError` on a protocol mismatch and :class:`AuthFailed` when the server
    uses another method (``wrong_method``) or no credential can be made.
    """
    if hello.get("proto") != wire.PROTO_VERSION:
        raise AuthError(f"server speaks protocol {hello.get('proto')!r}, not {wire.PROTO_VERSION}")
    challenge = hello.get("challenge")
    if not isinstance(challenge, str):
        raise AuthError("server hello has no challenge")
    theirs = hello.get("auth", "key")
    if theirs != method.name:
        raise AuthFailed("wrong_method", f"the controller authenticates with {theirs!r}, this "
                                         f"client is configured with auth = {method.name!r}")
    return {"from": sender, "auth": method.name, **method.answer(challenge, sender)}


def check_sender(answer: Mapping[str, Any]) -> tuple[str, str]:
    """The ``(role, host)`` an answer claims in ``from``; :class:`AuthError` if malformed."""
    sender = answer.get("from")
    if not isinstance(sender, str) or not sender or len(sender) > SENDER_MAX:
        raise AuthError("handshake answer has no valid 'from'")
    role, sep, host = sender.partition("@")
    if not sep or not role:
        raise AuthError(f"identity {sender[:80]!r} is not role@host")
    return role, host


def authenticate(method: AuthMethod, challenge: str, answer: Mapping[str, Any],
                 users: Users) -> Identity:
    """Server side: verify ``answer`` to ``challenge``; the caller's :class:`Identity`.

    Raises :class:`AuthError` for a malformed answer and :class:`AuthFailed` for a refused
    credential (a key answer to a munge server is ``wrong_method``: holding the cluster key
    proves nothing there). May block when ``method.blocking`` (or the uid lookup does).
    """
    role, host = check_sender(answer)
    sender = f"{role}@{host}"
    used = answer.get("auth", "key")  # an answer without "auth" is the key method's MAC
    if used != method.name:
        raise AuthFailed("wrong_method", f"{sender} answered with {str(used)[:40]!r}, this "
                                         f"cluster authenticates with {method.name!r}")
    uid, gid = method.verify(challenge, sender, answer)
    return Identity(uid, gid, users.name(uid), role, host, method.name)


class Users:
    """The server's uid -> user name lookup, with a small cache (names change rarely; the
    lookup may ask a directory service). An unknown uid is refused (``unknown_uid``)."""

    def __init__(self, ttl: float = 300.0, limit: int = 4096) -> None:
        self.ttl = ttl
        self.limit = limit
        self._names: dict[int, tuple[str, float]] = {}
        self._pinned: dict[int, str] = {}

    def name(self, uid: int) -> str:
        """The user name of ``uid`` on this host; :class:`AuthFailed` if there is none."""
        pinned = self._pinned.get(uid)
        if pinned is not None:
            return pinned
        import time

        now = time.monotonic()
        hit = self._names.get(uid)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        import pwd

        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            raise AuthFailed("unknown_uid", f"unknown uid {uid}: no such user on the "
                                            "controller's host") from None
        if len(self._names) >= self.limit:
            self._names.clear()
        self._names[uid] = (name, now)
        return name

    def pin(self, uid: int, name: str) -> None:
        """Know ``uid`` as ``name`` for good (a server's own uid, under ``key``)."""
        self._pinned[uid] = name
