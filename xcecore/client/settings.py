"""The client's settings: :class:`ClientConfig`, the keys it is built from, and a light reader.

The keys of ``[client]`` and the keys of ``[cluster]`` that say how to reach the controller
are defined here, once (type, default, meaning); the configuration loader
(:mod:`xcecore.config`) builds its sections from these tables. :func:`client_config` is the
one translation of those two sections into a :class:`ClientConfig`.

A one-shot command (``xce jobs``) needs nothing else from the configuration, so
:func:`read_sections` reads the file and checks just these keys -- with the loader's own
error messages -- without loading plugins or the loader itself (whose records cost the
commands ~10 ms of start-up). Everything here is cheap to import: no dataclasses, no anyio.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xcecore import wire
from xcecore.candidates import Candidate, candidates_from_config

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    from xcecore.auth import AuthMethod
    from xcecore.tls import TLS

ENV_CONFIG = "XCE_CONFIG"

KeySpec = tuple[tuple[type, ...], "Any", str]
"""A key's accepted types, its default and what it means (``xcecore.records.Field``'s data)."""

_F: tuple[type, ...] = (float, int)

CLIENT_KEYS: dict[str, KeySpec] = {
    "connect_timeout": (_F, 1.0, "seconds per candidate for connect + handshake"),
    "liveness_timeout": (_F, 2.0, "seconds without a frame before a link is dead"),
    "heartbeat_interval": (_F, 2.0, "seconds between a member's heartbeats (0: none); an idle "
                           "member notices a silent primary within this plus liveness_timeout"),
    "backoff_base": (_F, 0.02, "first back-off after a failed pass, seconds"),
    "backoff_cap": (_F, 2.0, "largest back-off, seconds"),
}
"""Every key of ``[client]``: connection manager tuning shared by every client role."""

CLUSTER_KEYS: dict[str, KeySpec] = {
    "peers": ((str, list), None, "controller candidates separated by ',' (not ';'), "
                                 "'h1:7600,h2:7600,h3:7600', or a list of them"),
    "address": ((str,), None, "single controller address (when no peers)"),
    "port": ((int,), None, "single controller port (when no peers)"),
    "auth": ((str,), "key", "authentication method: 'key' (a shared key; single-user), 'munge' "
                             "(MUNGE credentials; multi-user), or a plugin's (entry points "
                             "'xce.auth')"),
    "key": ((str,), None, "cluster key (shared secret) of auth = 'key'; keyless is loopback-only"),
    "key_file": ((str,), None, "file holding the cluster key (auth = 'key'; mode 0600, the "
                               "cluster owner's)"),
    "munge_socket": ((str,), None, "munged's socket for auth = 'munge' (default: libmunge's, "
                                   "/run/munge/munge.socket.2)"),
    "auth_options": ((dict,), {}, "options of a third-party auth method"),
    "max_frame": ((int,), wire.DEFAULT_MAX_FRAME, "largest accepted wire frame, bytes"),
    "allow_unlisted_redirect": ((bool,), False, "follow redirects to unlisted hosts"),
    "unit_for_limits": ((str,), "MB", "unit of a bare number in a memory limit (`xce submit -M "
                                      "512`, `#BSUB -M 512`): KB, MB, GB, TB, PB or EB (LSF's "
                                      "LSF_UNIT_FOR_LIMITS)"),
}
"""The keys of ``[cluster]`` a client reads (the section has others, for the controller);
``unit_for_limits`` is the submitting commands' (its value is checked by the loader, and by
``xce submit`` when it needs it)."""


class SettingsError(ValueError):
    """The config file is unreadable, or a client key in it is invalid (message names it)."""


class ClientConfig:
    """How a client reaches the controller; built once from configuration, then immutable.

    ``connect_timeout`` bounds TCP connect plus handshake per candidate; ``liveness_timeout`` is
    how long a link may stay silent while a reply is owed; ``backoff_base`` is the first
    delay after a full failed pass (doubling, full jitter, at most ``backoff_cap``).
    ``heartbeat_interval`` 0 turns heartbeats off: an idle client then finds out about a
    failover only at its next call (for tests of the call path, and one-shot tools). The
    defaults are those of ``[client]`` (:data:`CLIENT_KEYS`).
    """

    __slots__ = (
        "allow_unlisted_redirect",
        "auth",
        "backoff_base",
        "backoff_cap",
        "candidates",
        "connect_timeout",
        "heartbeat_interval",
        "liveness_timeout",
        "max_frame",
        "sender",
        "tls",
    )

    candidates: tuple[Candidate, ...]
    sender: str
    auth: AuthMethod
    allow_unlisted_redirect: bool
    connect_timeout: float
    liveness_timeout: float
    heartbeat_interval: float
    backoff_base: float
    backoff_cap: float
    max_frame: int
    tls: TLS | None

    def __init__(
        self,
        candidates: tuple[Candidate, ...],
        sender: str,
        auth: AuthMethod | None = None,
        allow_unlisted_redirect: bool = False,
        connect_timeout: float = CLIENT_KEYS["connect_timeout"][1],
        liveness_timeout: float = CLIENT_KEYS["liveness_timeout"][1],
        heartbeat_interval: float = CLIENT_KEYS["heartbeat_interval"][1],
        backoff_base: float = CLIENT_KEYS["backoff_base"][1],
        backoff_cap: float = CLIENT_KEYS["backoff_cap"][1],
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        tls: TLS | None = None,
    ) -> None:
        if not candidates:
            raise ValueError("ClientConfig needs at least one controller candidate")
        values = {"connect_timeout": connect_timeout, "liveness_timeout": liveness_timeout,
                  "backoff_base": backoff_base, "backoff_cap": backoff_cap}
        for name, value in values.items():
            if not value > 0:
                raise ValueError(f"ClientConfig.{name} must be positive, got {value}")
        if not heartbeat_interval >= 0:
            raise ValueError(f"ClientConfig.heartbeat_interval must be >= 0 (0: off), "
                             f"got {heartbeat_interval}")
        setattr_ = object.__setattr__
        setattr_(self, "candidates", tuple(candidates))
        setattr_(self, "sender", sender)
        if auth is None:
            from xcecore.auth.key import KeyAuth

            auth = KeyAuth(None)
        setattr_(self, "auth", auth)
        setattr_(self, "allow_unlisted_redirect", allow_unlisted_redirect)
        setattr_(self, "max_frame", max_frame)
        setattr_(self, "tls", tls)  # None: plain TCP
        setattr_(self, "heartbeat_interval", heartbeat_interval)
        for name, value in values.items():
            setattr_(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ClientConfig is immutable (cannot set {name!r})")

    def replace(self, **changes: Any) -> ClientConfig:
        """A copy with ``changes`` (the constructor's keywords), checked as a new one is."""
        values = {name: getattr(self, name) for name in self.__slots__}
        unknown = sorted(set(changes) - set(values))
        if unknown:
            raise TypeError(f"ClientConfig has no field(s) {', '.join(unknown)}")
        values.update(changes)
        return ClientConfig(**values)

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientConfig):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"ClientConfig({shown})"


def client_config(cluster: Mapping[str, Any], client: Mapping[str, Any], sender: str,
                  tls: Mapping[str, Any] | None = None) -> ClientConfig:
    """The one translation of ``[cluster]`` and ``[client]`` into a :class:`ClientConfig`.

    ``cluster`` and ``client`` are validated sections (defaults filled in or not: missing
    keys take the defaults of :data:`CLUSTER_KEYS` / :data:`CLIENT_KEYS`). The
    authentication method is ``[cluster] auth``'s (:func:`xcecore.auth.load_method`): only
    ``key`` reads a key file. ``tls`` is the ``[tls]`` section (:func:`xcecore.tls.client_tls`;
    None or no ``ca``: plain TCP). Raises ``ValueError`` (a
    :class:`xcecore.candidates.CandidateError`, an :class:`xcecore.auth.AuthError` or a bad
    tuning value) naming what is wrong.
    """
    from xcecore import auth

    cands = candidates_from_config(cluster)
    method = auth.load_method(auth.settings_from_cluster(cluster))
    method.check_peer_hosts([c.host for c in cands])
    tuning = {k: client.get(k, spec[1]) for k, spec in CLIENT_KEYS.items()}
    from xcecore.tls import client_tls

    return ClientConfig(
        cands, sender, method,
        allow_unlisted_redirect=bool(cluster.get("allow_unlisted_redirect", False)),
        max_frame=int(cluster.get("max_frame") or wire.DEFAULT_MAX_FRAME),
        tls=client_tls(tls),
        **tuning,
    )


# ------------------------------------------------------------------ the one-shot reader


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def check_value(path: str, types: tuple[type, ...], value: Any) -> Any:
    """``value`` checked against ``types`` (an int is accepted, and made a float, where a float
    is); the same rule and message as the configuration loader's."""
    # bool is an int subclass in Python; a TOML `true` is never a valid port.
    if isinstance(value, bool) and bool not in types:
        raise SettingsError(f"{path}: expected {_type_name(types)}, got bool")
    if not isinstance(value, types):
        raise SettingsError(f"{path}: expected {_type_name(types)}, got {type(value).__name__}")
    if float in types and isinstance(value, int):
        return float(value)
    return value


def _section(raw: Mapping[str, Any], name: str, keys: dict[str, KeySpec], *,
             closed: bool) -> dict[str, Any]:
    body = raw.get(name, {})
    if not isinstance(body, dict):
        raise SettingsError(f"{name}: must be a table ([{name}]), got {type(body).__name__}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        spec = keys.get(key)
        if spec is None:
            if closed:
                raise SettingsError(f"unknown key {name}.{key}; keys of [{name}]: "
                                    f"{', '.join(sorted(keys))}")
            continue  # a [cluster] key for the controller: not this reader's to judge
        out[key] = check_value(f"{name}.{key}", spec[0], value)
    for key, spec in keys.items():
        out.setdefault(key, spec[1])
    return out


def read_sections(path: str | None = None) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    """Read ``path`` (or ``$XCE_CONFIG``) and check its client keys: ``(path, cluster, client)``
    (:func:`read_client_sections` without ``[tls]``)."""
    found, cluster, client, _ = read_client_sections(path)
    return found, cluster, client


SECTIONS = ("cluster", "client", "tls", "plugins")
"""The sections one-shot commands read (``[plugins]``: to list plugin commands)."""


def read_raw(path: str) -> dict[str, Any]:
    """:data:`SECTIONS` of the TOML file at ``path``, as parsed (from
    :mod:`xcecore.client.sectioncache` while the file is unchanged). Raises
    :class:`SettingsError` naming the file and what is wrong with it."""
    from xcecore.client.sectioncache import load, store

    where = os.path.abspath(path)
    try:
        cached = load(where)
        if cached is not None:
            return cached
        import tomllib

        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise SettingsError(f"config file {path!r} does not exist") from None
    except OSError as exc:
        raise SettingsError(f"config file {path!r} cannot be read: {exc.strerror}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise SettingsError(f"config file {path!r} is not valid TOML: {exc}") from None
    sections = {name: raw[name] for name in SECTIONS if name in raw}
    store(where, sections)
    return sections


def read_client_sections(path: str | None = None) -> \
        tuple[str | None, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Read ``path`` (or ``$XCE_CONFIG``) and check its client keys: ``(path, cluster, client,
    tls)``.

    ``[client]`` is checked whole; of ``[cluster]`` only :data:`CLUSTER_KEYS` (the others are
    the controller's, checked when a role loads the whole file). No file means the defaults.
    Raises :class:`SettingsError` with the configuration loader's messages.
    """
    if path is None:
        path = os.environ.get(ENV_CONFIG) or None
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_raw(path)
    cluster = _section(raw, "cluster", CLUSTER_KEYS, closed=False)
    client = _section(raw, "client", CLIENT_KEYS, closed=True)
    from xcecore.tls import TLS_KEYS, check_section

    tls = _section(raw, "tls", TLS_KEYS, closed=True)
    try:
        check_section(tls)
    except ValueError as exc:
        raise SettingsError(f"[tls]: {exc}") from None
    return path, cluster, client, tls
