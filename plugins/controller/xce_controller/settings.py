"""The controller's settings, built from the ``[cluster]`` and ``[controller]`` config tables.

The server core takes a :class:`ControllerSettings` and nothing else from the configuration
system, so it runs the same under ``xce run controller``, ``python -m xce_controller`` and
in-process tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xcecore.wire import DEFAULT_MAX_FRAME

if TYPE_CHECKING:  # the state model loads only when a controller runs, not for every `xce` command
    from xce_controller.state import ClusterConf


def _default_conf() -> ClusterConf:
    from xce_controller.state import ClusterConf

    return ClusterConf(queues=DEFAULT_QUEUES)

DEFAULT_LISTEN = "127.0.0.1:7600"
DEFAULT_CLEAN_PERIOD = 3600.0  # LSF's CLEAN_PERIOD default
DEFAULT_QUEUES: tuple[dict[str, Any], ...] = (
    {"name": "normal", "priority": 30, "description": "For normal low-priority jobs (default)"},
    {"name": "priority", "priority": 43, "description": "Jobs submitted here run first"},
)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Everything :func:`xce_controller.server.serve` needs."""

    state_dir: str
    listen: str = DEFAULT_LISTEN
    advertise: str | None = None
    key: bytes | None = None
    max_frame: int = DEFAULT_MAX_FRAME
    conf: ClusterConf = field(default_factory=_default_conf)
    max_subscriber_queue: int = 10000
    max_inflight: int = 4096
    idem_ttl: float = 86400.0
    clean_period: float = DEFAULT_CLEAN_PERIOD  # 0: finished jobs are kept forever
    handshake_timeout: float = 10.0
    peers: tuple[str, ...] = ()


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (port 0 picks a free port) -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"controller.listen {text!r}: expected host:port, e.g. 127.0.0.1:7600")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"controller.listen {text!r}: bracket IPv6 addresses, as [::1]:7600")
    return host, int(port)


def format_address(host: str, port: int) -> str:
    """The ``host:port`` text, IPv6 bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def check_controller_section(section: dict[str, Any]) -> None:
    """The ``check`` of the ``[controller]`` config section."""
    parse_listen(section.get("listen") or DEFAULT_LISTEN)
    queues = check_queues(section.get("queues") or list(DEFAULT_QUEUES))
    default = section.get("default_queue") or "normal"
    if default not in {q["name"] for q in queues}:
        raise ValueError(f"controller.default_queue {default!r} is not a configured queue")
    for key in ("host_timeout", "idem_ttl"):
        if key in section and section[key] is not None and section[key] <= 0:
            raise ValueError(f"controller.{key} must be > 0")
    clean = section.get("clean_period")
    if clean is not None:
        if isinstance(clean, bool) or not isinstance(clean, int | float):
            raise ValueError(f"controller.clean_period must be a number of seconds, got {clean!r}")
        if not clean >= 0:  # also refuses NaN
            raise ValueError(
                f"controller.clean_period must be >= 0 (0 keeps finished jobs), got {clean!r}"
            )


def settings_from_config(
    cluster: Mapping[str, Any], controller: Mapping[str, Any], key: bytes | None
) -> ControllerSettings:
    """Build settings from the ``[cluster]`` and ``[controller]`` tables (defaults applied)."""
    from xce_controller.state import ClusterConf

    c = dict(controller)
    check_controller_section(c)
    queues = check_queues(c.get("queues") or list(DEFAULT_QUEUES))
    state_dir = c.get("state_dir") or cluster.get("state_dir")
    if not state_dir:
        raise ValueError("controller: set cluster.state_dir (shared by every candidate)")
    peers = cluster.get("peers") or ()
    if isinstance(peers, str):
        peers = tuple(p.strip() for p in peers.split(",") if p.strip())
    conf = ClusterConf(
        name=str(cluster.get("name") or "xce"),
        resources=[dict(r) for r in cluster.get("resources") or ()],
        admins=frozenset(c.get("admins") or ()),
        default_queue=c.get("default_queue") or "normal",
        host_timeout=float(c.get("host_timeout") or 30.0),
        host_groups=dict(c.get("host_groups") or {}),
        user_groups=dict(c.get("user_groups") or {}),
        queues=queues,
    )
    return ControllerSettings(
        state_dir=str(state_dir),
        listen=c.get("listen") or DEFAULT_LISTEN,
        advertise=c.get("advertise"),
        key=key,
        max_frame=int(cluster.get("max_frame") or DEFAULT_MAX_FRAME),
        conf=conf,
        max_subscriber_queue=int(c.get("max_subscriber_queue") or 10000),
        max_inflight=int(c.get("max_inflight") or 4096),
        idem_ttl=float(c.get("idem_ttl") or 86400.0),
        clean_period=float(DEFAULT_CLEAN_PERIOD if c.get("clean_period") is None
                           else c["clean_period"]),
        peers=tuple(peers),
    )
