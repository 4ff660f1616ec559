"""The ``[controller]`` config section, and the settings a candidate builds from a validated config.

Every default of the controller is written once, here: the section's :class:`Field` records
carry them, and :func:`settings_from_config` reads them only from a validated
:class:`~xcecore.config.Config` (``xce run controller``, ``python -m xce_controller`` and the
tests all build one), so no other module repeats a default. The server core takes a
:class:`ControllerSettings` and nothing else from the configuration system.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from xce_controller.events import EVENTS_MAX, EVENTS_RETENTION
from xcecore.auth import AuthMethod
from xcecore.config import CORE_SECTIONS, Config, validate
from xcecore.protocol import parse_hostport
from xcecore.records import ConfigSection, Field
from xcecore.timespan import span_seconds
from xcecore.tls import TLS, server_tls

DEFAULT_HUNG_TIMEOUT = 2.0
"""Seconds without a primary heartbeat before a standby fences it (the default)."""
MIN_HUNG_TIMEOUT = 0.5
"""Below this, the ordinary scheduling hiccups of a busy host would get primaries fenced."""
DEFAULT_QUEUES: tuple[dict[str, Any], ...] = (
    {"name": "normal", "priority": 30, "description": "For normal low-priority jobs (default)"},
    {"name": "priority", "priority": 43, "description": "Jobs submitted here run first"},
)
HOST_TIMEOUT = 30.0
"""Seconds without a worker heartbeat before its host is unavail (the default)."""
LOST_JOB_TIMEOUT = 600.0
"""Seconds a job stays UNKWN on a lost host before ``lost_job_action`` (the default)."""
LOST_JOB_ACTIONS = ("requeue", "exit")
IDEM_TTL = 86400.0
"""Seconds an idempotency key's result is kept (the default: one day)."""
HANDSHAKE_TIMEOUT = 10.0
DELEGATE_TIMEOUT = 10.0
"""Seconds a delegated call waits for its member's answer (``[controller] delegate_timeout``)."""
"""Seconds a client may take to finish its handshake (not configurable)."""
MAX_UNSENT_BYTES = 32 * 1024 * 1024
"""Bytes of replies and pushes a connection may have waiting to be sent (the default)."""
CHANGE_RETENTION = 100_000
"""Changes the retention window keeps (the default): a member that re-joins with a ``since``
at most this many changes old gets only what it missed."""


@dataclass(slots=True)
class ClusterConf:
    """The static configuration the state model needs (built by :func:`settings_from_config`)."""

    name: str = "xce"
    resources: list[dict[str, Any]] = field(default_factory=list)  # site resource definitions
    admins: frozenset[str] = frozenset()
    default_queue: str = "normal"
    host_timeout: float = HOST_TIMEOUT
    host_groups: dict[str, Any] = field(default_factory=dict)
    user_groups: dict[str, Any] = field(default_factory=dict)
    queues: tuple[dict[str, Any], ...] = DEFAULT_QUEUES
    lost_job_timeout: float = LOST_JOB_TIMEOUT  # 0: an UNKWN job waits for its host forever
    lost_job_action: str = "exit"  # or "requeue"
    kill_unsatisfiable: bool = False  # a job whose dependency can never hold ends EXIT


RECONFIGURABLE = frozenset({"conf", "service_users", "grants", "reload"})
"""Settings a reconfiguration applies at once (``conf`` but its resources and name)."""


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Everything :func:`xce_controller.server.serve` needs; made by :func:`settings_from_config`.

    ``reload`` (given by the role) reads the configuration file again into new settings
    (blocking), for ``xce admin reconfig`` and SIGHUP; None: this candidate cannot reload.
    """

    state_dir: str
    listen: str
    advertise: str | None
    auth: AuthMethod  # [cluster] auth: how callers are authenticated
    max_frame: int
    conf: ClusterConf
    max_subscriber_queue: int
    max_inflight: int
    idem_ttl: float
    clean_period: float  # 0: finished jobs are kept forever
    peers: tuple[str, ...]
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    max_unsent_bytes: int = MAX_UNSENT_BYTES  # reading stops at half, a member is dropped past it
    stall_timeout: float = 30.0  # a connection that takes no byte this long with frames waiting
    frame_timeout: float = 10.0  # a frame begun must be whole within this
    delegate_timeout: float = DELEGATE_TIMEOUT  # a delegated call's wait for its member
    storage_retry: float = 1.0  # seconds between probes of a store that cannot commit
    hung_timeout: float = DEFAULT_HUNG_TIMEOUT  # 0: standbys never fence a hung primary
    change_retention: int = CHANGE_RETENTION  # changes the retention window holds
    events_retention: float = EVENTS_RETENTION  # seconds cluster events are kept
    events_max: int = EVENTS_MAX  # the most cluster events kept
    service_users: frozenset[str] = frozenset()  # [cluster] service_users (root always is one)
    grants: Mapping[str, frozenset[str]] = field(default_factory=dict)  # role -> ops
    backend: str = "file"  # which plugin's election and store ("file": the built-in ones)
    tls: TLS | None = None  # [tls]: the listener's TLS (None: plain TCP)
    reload: Callable[[], ControllerSettings] | None = field(default=None, compare=False)

    def reconfigurable(self, new: ControllerSettings) -> list[str]:
        """What ``new`` changes that a reconfiguration cannot apply (a restart can): names of
        settings, empty when every difference takes effect at once. Applied at once: the
        cluster conf (queues, administrators, groups, default queue, host timeout) but its
        resources and name, the service users and the grants."""
        found = [f.name for f in fields(self) if f.name not in RECONFIGURABLE
                 and getattr(self, f.name) != getattr(new, f.name)]
        for name in ("resources", "name"):
            if getattr(self.conf, name) != getattr(new.conf, name):
                found.append(f"cluster.{name}")
        return found


def parse_span(value: Any, what: str) -> float:
    """A span of time: seconds (a number) or ``90s``, ``30m``, ``12h``, ``7d``, ``2w``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        span = span_seconds(value) if isinstance(value, str) else None
        if span is None:
            raise ValueError(f"{what} must be seconds or a span like 90s, 30m, 12h, 7d, 2w; got "
                             f"{value!r}")
        seconds = span
    if not seconds > 0:  # also refuses NaN
        raise ValueError(f"{what} must be > 0, got {value!r}")
    return seconds


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (port 0 picks a free port) -> (host, port)."""
    return parse_hostport(text, what="controller.listen", port_zero=True)


def check_queues(queues: Any) -> tuple[dict[str, Any], ...]:
    """Validate ``[[controller.queues]]``: tables with a unique ``name`` and an int ``priority``."""
    if not isinstance(queues, list | tuple) or not queues:
        raise ValueError("controller.queues must be a non-empty list of tables")
    allowed = {"name", "priority", "description", "open", "active"}
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, q in enumerate(queues):
        where = f"controller.queues[{i}]"
        if not isinstance(q, Mapping):
            raise ValueError(f"{where} must be a table")
        name = q.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' (string) is required")
        if name in seen:
            raise ValueError(f"{where}: queue {name!r} is defined twice")
        extra = set(q) - allowed
        if extra:
            raise ValueError(f"{where} ({name}): unknown key(s) {', '.join(sorted(extra))}")
        prio = q.get("priority", 30)
        if not isinstance(prio, int) or isinstance(prio, bool):
            raise ValueError(f"{where} ({name}): 'priority' must be an integer")
        seen.add(name)
        out.append(dict(q))
    return tuple(out)


def check_grants(grants: Any) -> dict[str, frozenset[str]]:
    """Validate ``[controller] grants``: role name -> list of grantable op names."""
    from xce_controller.authz import DAEMON_ROLES, GRANTABLE

    out: dict[str, frozenset[str]] = {}
    for role, ops in grants.items():
        where = f"controller.grants.{role}"
        if role in DAEMON_ROLES:
            raise ValueError(f"{where}: {role} is a built-in daemon role; its ops are fixed")
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise ValueError(f"{where} must be a list of op names")
        bad = sorted(set(ops) - GRANTABLE)
        if bad:
            raise ValueError(f"{where}: {', '.join(bad)} cannot be granted; grantable ops: "
                             f"{', '.join(sorted(GRANTABLE))}")
        out[role] = frozenset(ops)
    return out


def check_controller_section(section: dict[str, Any]) -> None:
    """The ``check`` of the ``[controller]`` section (it sees the given keys plus defaults)."""
    parse_listen(section["listen"])
    if section.get("advertise") is not None:
        parse_hostport(section["advertise"], what="controller.advertise")
    queues = check_queues(section["queues"])
    if section["default_queue"] not in {q["name"] for q in queues}:
        raise ValueError(f"controller.default_queue {section['default_queue']!r} is not a configured queue")
    for key in ("host_timeout", "idem_ttl", "stall_timeout", "frame_timeout", "storage_retry",
                "delegate_timeout"):
        if not section[key] > 0:  # also refuses NaN
            raise ValueError(f"controller.{key} must be > 0, got {section[key]!r}")
    for key in ("max_subscriber_queue", "max_inflight", "max_unsent_bytes", "change_retention"):
        if section[key] < 1:
            raise ValueError(f"controller.{key} must be >= 1, got {section[key]!r}")
    check_grants(section["grants"])
    parse_span(section["events_retention"], "controller.events_retention")
    if isinstance(section["events_max"], bool) or section["events_max"] < 1:
        raise ValueError(f"controller.events_max must be >= 1, got {section['events_max']!r}")
    admins = section["admins"]
    if not all(isinstance(a, str) and a for a in admins):
        raise ValueError(f"controller.admins must be a list of user names, got {admins!r}")
    if not section["clean_period"] >= 0:  # also refuses NaN
        raise ValueError(
            f"controller.clean_period must be >= 0 (0 keeps finished jobs), got {section['clean_period']!r}")
    if not section["lost_job_timeout"] >= 0:  # also refuses NaN
        raise ValueError("controller.lost_job_timeout must be >= 0 (0: wait for the host "
                         f"forever), got {section['lost_job_timeout']!r}")
    if section["lost_job_action"] not in LOST_JOB_ACTIONS:
        raise ValueError("controller.lost_job_action must be 'requeue' or 'exit', got "
                         f"{section['lost_job_action']!r}")
    if not section["backend"] or not section["backend"].isidentifier():
        raise ValueError(f"controller.backend must be a backend's name (\"file\", \"etcd\"), "
                         f"got {section['backend']!r}")
    hung = section["hung_timeout"]
    if isinstance(hung, bool) or not isinstance(hung, int | float) or not (hung == 0 or hung >= MIN_HUNG_TIMEOUT):
        raise ValueError(f"controller.hung_timeout must be 0 (off) or a number of seconds >= "
                         f"{MIN_HUNG_TIMEOUT:g}, got {hung!r}")


_NUM = (float, int)
SECTION = ConfigSection(
    "controller",
    {
        "listen": Field((str,), "127.0.0.1:7600", "host:port this candidate listens on"),
        "advertise": Field((str,), None, "address clients are redirected to (default: listen)"),
        "state_dir": Field((str,), None, "state directory: shared by every candidate with the file "
                           "backend (flock, SQLite); a local directory with etcd",
                           required=True),
        "admins": Field((list,), [], "user names with administrator rights (root always has "
                                     "them; with auth = 'key' so does the cluster's owner)"),
        "grants": Field((dict,), {}, "role -> ops it may call with administrator rights, e.g. "
                                     "{ healthcheck = [\"hostctrl\"] } (such a role must run "
                                     "as root or a service user)"),
        "host_timeout": Field(_NUM, HOST_TIMEOUT, "seconds without a worker heartbeat before unavail"),
        "lost_job_timeout": Field(
            _NUM, LOST_JOB_TIMEOUT,
            "seconds a running job stays UNKWN after its host went unavail before "
            "lost_job_action is taken (its worker re-joining with the job alive makes it RUN "
            "again); 0 waits for the host forever"),
        "lost_job_action": Field(
            (str,), "exit",
            "what becomes of a job UNKWN for lost_job_timeout: 'exit' (EXIT, reason 'host "
            "lost') or 'requeue' (PEND again, a new attempt)"),
        "queues": Field((list,), [dict(q) for q in DEFAULT_QUEUES],
                        "queues: tables {name, priority, description, open, active}"),
        "default_queue": Field((str,), "normal", "queue of a submission that names none"),
        "kill_unsatisfiable": Field(
            (bool,), False, "end (EXIT) a job whose dependency can never be satisfied, with "
            "that reason; false: it stays pending and says so"),
        "host_groups": Field((dict,), {}, "host group name -> list of hosts"),
        "user_groups": Field((dict,), {}, "user group name -> list of users"),
        "max_subscriber_queue": Field((int,), 10000, "unsent pushes before a member is dropped"),
        "max_inflight": Field((int,), 4096, "requests in flight per connection"),
        "max_unsent_bytes": Field(
            (int,), MAX_UNSENT_BYTES,
            "bytes of replies and pushes a connection may have waiting: its requests stop being "
            "read at half of it, and a member is dropped when a push would pass it"),
        "stall_timeout": Field(
            _NUM, 30.0, "seconds a connection with frames waiting may take no byte before it is "
            "dropped"),
        "frame_timeout": Field(
            _NUM, 10.0, "seconds a frame may take to arrive in full once its first byte has"),
        "delegate_timeout": Field(
            _NUM, DELEGATE_TIMEOUT, "seconds a call the controller forwards to a member that "
            "serves it (the accounting role's history.*) waits for its answer; then the caller "
            "gets UNAVAILABLE"),
        "storage_retry": Field(
            _NUM, 1.0, "seconds between probes of a state store that cannot commit (writes are "
            "refused with STORAGE meanwhile)"),
        "idem_ttl": Field(_NUM, IDEM_TTL, "seconds an idempotency key's result is kept"),
        "change_retention": Field(
            (int,), CHANGE_RETENTION,
            "changes the retention window keeps in memory (~17 bytes each): a member that "
            "re-joins within it gets only what it missed, else a snapshot"),
        "events_retention": Field(
            (str, float, int), "7d",
            "how long cluster events (xce events) are kept: seconds or a span (90m, 12h, 7d)"),
        "events_max": Field(
            (int,), EVENTS_MAX,
            "the most cluster events kept (the oldest leave first; each is held in the "
            "primary's memory, a few hundred bytes)"),
        "clean_period": Field(
            _NUM, 3600.0,
            "seconds a finished (DONE/EXIT) job is kept after it ends before it is purged "
            "(like LSF CLEAN_PERIOD); 0 keeps finished jobs forever",
        ),
        "backend": Field(
            (str,), "file", "election and state store: \"file\" (the built-in flock and SQLite "
            "in state_dir, candidates on one host) or a plugin's (\"etcd\": xce-etcd, "
            "candidates on several hosts, the [etcd] section)"),
        "hung_timeout": Field(
            _NUM, DEFAULT_HUNG_TIMEOUT,
            "seconds without a heartbeat from the primary before a standby on the same host "
            "fences it (SIGKILL of the verified lock holder) and takes over; 0 turns this "
            "off, else at least 0.5",
        ),
    },
    "the controller role",
    check=check_controller_section,
)


def config_of(cluster: Mapping[str, Any] | None = None, controller: Mapping[str, Any] | None = None) -> Config:
    """A validated config of just ``[cluster]`` and ``[controller]`` (``python -m
    xce_controller``, in-process tests); raises ``ConfigError`` naming a bad key."""
    return validate({"cluster": dict(cluster or {}), "controller": dict(controller or {})},
                    [*CORE_SECTIONS, SECTION])


def settings_from_config(config: Config, auth: AuthMethod) -> ControllerSettings:
    """The candidate's settings from a validated config (``[cluster]`` and ``[controller]``)
    and the configured authentication method.

    Raises ``ConfigError`` when ``controller.state_dir`` is missing.
    """
    cluster, c = config.cluster, config.require("controller")
    peers = cluster.get("peers") or ()
    if isinstance(peers, str):
        peers = tuple(p.strip() for p in peers.split(",") if p.strip())
    conf = ClusterConf(
        name=cluster["name"],
        resources=[dict(r) for r in cluster["resources"]],
        admins=frozenset(c["admins"]),
        default_queue=c["default_queue"],
        host_timeout=float(c["host_timeout"]),
        host_groups=dict(c["host_groups"]),
        user_groups=dict(c["user_groups"]),
        queues=check_queues(c["queues"]),
        lost_job_timeout=float(c["lost_job_timeout"]),
        lost_job_action=str(c["lost_job_action"]),
        kill_unsatisfiable=bool(c["kill_unsatisfiable"]),
    )
    return ControllerSettings(
        state_dir=str(c["state_dir"]),
        listen=c["listen"],
        advertise=c["advertise"],
        auth=auth,
        max_frame=int(cluster["max_frame"]),
        conf=conf,
        max_subscriber_queue=int(c["max_subscriber_queue"]),
        max_inflight=int(c["max_inflight"]),
        idem_ttl=float(c["idem_ttl"]),
        clean_period=float(c["clean_period"]),
        peers=tuple(peers),
        max_unsent_bytes=int(c["max_unsent_bytes"]),
        stall_timeout=float(c["stall_timeout"]),
        frame_timeout=float(c["frame_timeout"]),
        delegate_timeout=float(c["delegate_timeout"]),
        storage_retry=float(c["storage_retry"]),
        hung_timeout=float(c["hung_timeout"]),
        change_retention=int(c["change_retention"]),
        events_retention=parse_span(c["events_retention"], "controller.events_retention"),
        events_max=int(c["events_max"]),
        service_users=frozenset(cluster["service_users"]),
        grants=check_grants(c["grants"]),
        backend=str(c["backend"]),
        tls=server_tls(config.section("tls"), what="a controller candidate"),
    )
