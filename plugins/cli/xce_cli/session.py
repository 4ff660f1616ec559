"""How a command reaches the controller: one sync client per command, from the config.

Commands talk straight to the controller, as LSF's commands talk to mbatchd, with the same
candidate list and the same library-driven connect as every role. A command never waits
forever: ``--timeout`` bounds the whole call, after which it exits non-zero with one line.
"""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import orjson

DEFAULT_TIMEOUT = 15.0


def user_name() -> str:
    """The invoking user, as the controller records it."""
    return getpass.getuser()


class Session:
    """A connected sync client plus the caller's identity, for one command."""

    def __init__(self, client: Any, user: str, timeout: float) -> None:
        self._client = client
        self.user = user
        self.timeout = timeout

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        """Call ``op`` with the caller's user name; a controller error is one line and exit 1."""
        from xcecore.client import BackendUnavailable
        from xcecore.wire import RemoteError

        body = {"user": self.user, **(args or {})}
        try:
            return self._client.call(op, body, deadline=self.timeout)
        except RemoteError as exc:
            raise click.ClickException(f"{op}: {exc.message} ({exc.code})") from None
        except BackendUnavailable as exc:
            raise click.ClickException(f"controller unreachable after {self.timeout:g} s: {exc}") from None


@contextmanager
def session(ctx: click.Context, role: str = "cli") -> Iterator[Session]:
    """Open a client to the controller for the running command (identity ``role@host``)."""
    from xcecore.cli import XceGroup
    from xcecore.client import SyncClient
    from xcecore.runtime import client_config

    root = ctx.find_root()
    assert isinstance(root.command, XceGroup)
    root.command.plugin_manager(root)
    obj = root.ensure_object(dict)
    timeout = float(obj.get("timeout") or DEFAULT_TIMEOUT)
    try:
        cfg = client_config(obj["config"], f"{role}@{socket.gethostname()}")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # Connecting happens in the first call, inside its deadline: a command never waits forever.
    with SyncClient.open(cfg, role=role, connect=False) as client:
        yield Session(client, user_name(), timeout)


def emit_json(data: Any) -> None:
    """Stable machine-readable output: sorted keys, two-space indent."""
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")
