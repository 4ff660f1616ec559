"""The client of the controller: every role's connection, and every command's.

Public names:

- :class:`Client` -- the event-loop client (anyio): one connection to the primary, many
  requests in flight, failover, rejoin, heartbeats, pushes;
- :class:`ClientHooks` -- the events object it calls back (``reconnected``,
  ``connection_state``, ``push``);
- :class:`SyncClient` -- the blocking facade over a :class:`Client`, for threads;
- :class:`OneShotClient` -- a blocking client over a plain socket for one-shot commands (no
  event loop, no threads);
- :class:`ClientConfig` -- how to reach the controller (:func:`client_config` builds it from
  the ``[cluster]`` and ``[client]`` sections);
- the errors :class:`BackendUnavailable` (and its :class:`AuthenticationFailed`),
  :class:`OutcomeUnknown`, :class:`ClientClosed`,
  :class:`HookContractError` (error replies are :class:`xcecore.wire.RemoteError`).

Inside: :mod:`~xcecore.client.machine` (the pure state machine), :mod:`~xcecore.client.dialer`
(the candidate walk and the handshake), :mod:`~xcecore.client.lock` (the failover lock),
:mod:`~xcecore.client.backend` (TCP and in-memory networks), and the shells
:mod:`~xcecore.client.asyncclient`, :mod:`~xcecore.client.blocking`,
:mod:`~xcecore.client.oneshot`.

The shells are imported on first use: ``import xcecore.client`` costs only the errors and
the settings (the configuration loader uses the settings), and ``from xcecore.client import
OneShotClient`` -- a command's whole client -- loads no anyio or loguru.
"""

from __future__ import annotations

from xcecore.client.errors import (
    AuthenticationFailed,
    BackendUnavailable,
    ClientClosed,
    HookContractError,
    OutcomeUnknown,
)
from xcecore.client.settings import ClientConfig, client_config

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    from xcecore.client.asyncclient import Client, ClientHooks
    from xcecore.client.blocking import SyncClient
    from xcecore.client.oneshot import OneShotClient

__all__ = [
    "AuthenticationFailed",
    "BackendUnavailable",
    "Client",
    "ClientClosed",
    "ClientConfig",
    "ClientHooks",
    "HookContractError",
    "OneShotClient",
    "OutcomeUnknown",
    "SyncClient",
    "client_config",
]

_LAZY = {
    "Client": "xcecore.client.asyncclient",
    "ClientHooks": "xcecore.client.asyncclient",
    "SyncClient": "xcecore.client.blocking",
    "OneShotClient": "xcecore.client.oneshot",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'xcecore.client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
