"""What one API server client session holds: its store and its backend health.

Pushes and connection-state changes reach the plugin through hooks that only name the
client, and they start before the role's main runs (the ``state`` push follows the join), so
the session is found, or made, by client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xce_apiserver.health import BackendHealth
from xce_apiserver.store import Store
from xcecore.attached import Attached


@dataclass
class ApiSession:
    """The store fed by one client's pushes, and that client's backend health."""

    store: Store = field(default_factory=Store)
    health: BackendHealth = field(default_factory=BackendHealth)
    degraded_ttl: float = 5.0


_sessions: Attached[ApiSession] = Attached(lambda client: ApiSession())


def session_for(client: Any) -> ApiSession:
    """The session of ``client``, made on first use."""
    return _sessions(client)


def find_session(client: Any) -> ApiSession | None:
    """The session of ``client`` if it has one."""
    return _sessions.find(client)


def drop_session(client: Any) -> None:
    """Forget the session of ``client`` (when the role stops)."""
    _sessions.forget(client)
