"""Helpers for the client tests: fast client configs, clients on the in-memory network, and a
recording hooks facade."""

from __future__ import annotations

from typing import Any

from xcecore.auth.key import KeyAuth
from xcecore.candidates import parse_peers
from xcecore.client import Client, ClientConfig
from xcecore.client.backend import NetworkBackend


def make_config(*addresses: str, **overrides: Any) -> ClientConfig:
    """A client config with test-speed timeouts; heartbeats off unless asked for. ``key``
    (bytes or None) stands for ``auth=KeyAuth(key)``."""
    settings: dict[str, Any] = {
        "sender": "scheduler@h1",
        "connect_timeout": 0.5,
        "liveness_timeout": 0.6,
        "heartbeat_interval": 0.0,  # off
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
    }
    settings.update(overrides)
    if "key" in settings:
        settings["auth"] = KeyAuth(settings.pop("key"))
    return ClientConfig(candidates=parse_peers(",".join(addresses)), **settings)


def mem_client(net: NetworkBackend, config: ClientConfig, **kw: Any) -> Client:
    """A client whose connections go through ``net`` (a ``MemoryNetwork``: no sockets)."""
    return Client(config, backend=net, **kw)


class SpyHooks:
    """A hooks facade that records every call (and marks rejoins, like the built-in plugin)."""

    def __init__(self) -> None:
        self.reconnects: list[tuple[Any, bool]] = []  # (candidate, lock held at the time)
        self.states: list[tuple[str, Any, str]] = []
        self.pushes: list[tuple[str, str, int, Any]] = []

    def reconnected(self, client: Client, candidate: Any) -> object:
        self.reconnects.append((candidate, client.failover_locked))
        client.mark_rejoin_pending()
        return None

    def connection_state(self, client: Client, state: str, candidate: Any, detail: str) -> None:
        self.states.append((state, candidate, detail))

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> None:
        self.pushes.append((role, event, seq, data))
