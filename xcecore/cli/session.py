"""What a built-in command works with: the settings, one client, the caller, and output.

Commands talk straight to the controller, as LSF's commands talk to mbatchd, through a
:class:`xcecore.client.OneShotClient` built from the config file's ``[cluster]`` and
``[client]`` sections (read and checked by :func:`xcecore.client.settings.read_sections`:
no plugins are loaded for that). A command never waits forever: ``--timeout`` bounds each
call, after which it exits 1 with one line. Only what needs plugins -- checking a resource
requirement with the configured evaluator -- loads them (:meth:`Session.plugin_manager`).
"""

from __future__ import annotations

import _socket  # not socket, for gethostname only: see xcecore.client.oneshot._connect_socket
import json
import os
import sys
import time

from xcecore.cli.options import Options

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    from xcecore.client.oneshot import OneShotClient
    from xcecore.config import Config
    from xcecore.plugins import PluginManager

DEFAULT_TIMEOUT = 15.0


class CommandError(Exception):
    """A command failed: its message is printed as one line (``Error: ...``) and it exits 1.
    ``data``: the controller's error object, when it refused the request."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data or {}


def user_name() -> str:
    """The invoking user's login name (``getpass.getuser``'s rule): a label for people, e.g.
    the REST user ``xce up`` makes. The controller never takes it: it knows who calls from
    the credential (:meth:`Session.whoami`)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        user = os.environ.get(name)
        if user:
            return user
    import pwd

    return pwd.getpwuid(os.getuid())[0]


class Session:
    """One command's connection to the controller and what it knows about its caller."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.timeout = opts.timeout if opts.timeout is not None else DEFAULT_TIMEOUT
        self._clients: dict[str, OneShotClient] = {}
        self._loaded: tuple[PluginManager, Config] | None = None
        self._sections: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None = None

    def sections(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """``[cluster]`` (its client keys), ``[client]`` and ``[tls]``, read and checked once."""
        if self._sections is None:
            from xcecore.client.settings import read_client_sections

            try:
                _, cluster, tuning, tls = read_client_sections(self.opts.config)
            except ValueError as exc:  # SettingsError
                raise CommandError(str(exc)) from None
            self._sections = cluster, tuning, tls
        return self._sections

    def client(self, role: str = "cli") -> OneShotClient:
        """The command's client, as ``role@<this host>`` (made on first use)."""
        found = self._clients.get(role)
        if found is None:
            from xcecore.client.oneshot import OneShotClient, stderr_logger
            from xcecore.client.settings import client_config

            cluster, tuning, tls = self.sections()
            try:
                cfg = client_config(cluster, tuning, f"{role}@{_socket.gethostname()}", tls)
            except ValueError as exc:  # CandidateError, AuthError, TLSConfigError, bad tuning
                raise CommandError(str(exc)) from None
            found = self._clients[role] = OneShotClient(
                cfg, role=role, log=stderr_logger(self.opts.command_log_level()))
        return found

    def call(self, op: str, args: dict[str, Any] | None = None, *, role: str = "cli") -> Any:
        """Call ``op`` (as whoever the credential proves); any failure is a
        :class:`CommandError` line."""
        from xcecore.client.errors import AuthenticationFailed, BackendUnavailable, OutcomeUnknown
        from xcecore.wire import RemoteError

        try:
            return self.client(role).call(op, args or {}, deadline=self.timeout)
        except AuthenticationFailed as exc:
            raise CommandError(str(exc)) from None
        except RemoteError as exc:
            raise CommandError(f"{op}: {exc.message} ({exc.code})", exc.data) from None
        except OutcomeUnknown as exc:
            raise CommandError(
                f"{op}: the controller did not answer within {self.timeout:g} s after the request "
                f"was sent, so it may or may not have been applied; `xce outcome {exc.rid}` "
                "tells (and makes a 'not applied' answer final)") from None
        except BackendUnavailable as exc:
            raise CommandError(f"controller unreachable after {self.timeout:g} s: {exc}") from None

    def whoami(self) -> str:
        """The user the controller authenticated this command as."""
        from xcecore.client.errors import AuthenticationFailed, BackendUnavailable

        try:
            who = self.client().whoami(deadline=self.timeout)
        except AuthenticationFailed as exc:
            raise CommandError(str(exc)) from None
        except BackendUnavailable as exc:
            raise CommandError(f"controller unreachable after {self.timeout:g} s: {exc}") from None
        user = who.get("user")
        if not isinstance(user, str):
            raise CommandError("the controller did not say whom it authenticated this command as")
        return user

    def plugin_manager(self) -> PluginManager:
        """The configured plugins (loads them and the whole config once; slow path)."""
        return self._load()[0]

    def config(self) -> Config:
        """The whole configuration, validated against every loaded plugin (slow path)."""
        return self._load()[1]

    def _load(self) -> tuple[PluginManager, Config]:
        if self._loaded is None:
            from xcecore.runtime import load

            try:
                self._loaded = load(self.opts.config)
            except Exception as exc:
                raise CommandError(str(exc)) from None
        return self._loaded

    def close(self) -> None:
        """Close every client."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()


# --------------------------------------------------------------------------- output


def echo(text: str = "", *, err: bool = False) -> None:
    """Print one line (or several) to stdout, or stderr."""
    (sys.stderr if err else sys.stdout).write(text + "\n")


def emit_json(data: Any) -> None:
    """Stable machine-readable output: sorted keys, two-space indent."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """Print an aligned plain-text table, as bjobs and bhosts do.

    Plain columns: ``xce jobs`` with thousands of rows must answer in milliseconds, and
    scripts that cut columns want no box characters or colour codes.
    """
    cells = [columns, *(["-" if v is None or v == "" else str(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = [title] if title else []
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    echo("\n".join(out))


class StreamTable:
    """A plain-text table printed page by page: column widths are set by the header and the
    first page (a later, wider cell widens only its own line), as bjobs prints its columns."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.widths: list[int] | None = None
        self.rows = 0

    def add(self, rows: list[list[Any]]) -> None:
        """Print ``rows`` (the header first, with the first rows)."""
        if not rows:
            return
        cells = [["-" if v is None or v == "" else str(v) for v in row] for row in rows]
        lines = []
        if self.widths is None:
            self.widths = [max(len(r[i]) for r in [self.columns, *cells])
                           for i in range(len(self.columns))]
            cells.insert(0, self.columns)
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, self.widths, strict=True)).rstrip()
                 for r in cells]
        self.rows += len(rows)
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def close(self) -> int:
        """The number of rows printed."""
        return self.rows


class JsonList:
    """A JSON array written as its items arrive: the same text as :func:`emit_json` of the
    whole list (sorted keys, two-space indent), without holding the list."""

    def __init__(self) -> None:
        self.items = 0

    def add(self, items: list[Any]) -> None:
        """Write ``items`` (the opening bracket first)."""
        out = sys.stdout
        for item in items:
            text = json.dumps(item, indent=2, sort_keys=True, ensure_ascii=False)
            out.write(("[\n  " if not self.items else ",\n  ") + text.replace("\n", "\n  "))
            self.items += 1
        out.flush()

    def close(self) -> int:
        """End the array; the number of items written."""
        sys.stdout.write("\n]\n" if self.items else "[]\n")
        return self.items


def parse_time(text: str, now: float | None = None) -> float:
    """``30d``, ``12h``, ``90m`` (that long ago), an ISO date or time (local unless it says),
    or seconds since 1970."""
    from datetime import UTC, datetime  # only the commands that read times pay for it

    from xcecore.timespan import span_seconds

    now = time.time() if now is None else now
    span = span_seconds(text)
    if span is not None:
        return now - span
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"time {text!r}: give a span ago (30d, 12h, 90m, 45s, 2w), an ISO "
                           "date or time (2026-11-30, 2026-11-30T08:00), or epoch seconds") from None
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # local time, as bacct -C reads it
    return stamp.astimezone(UTC).timestamp()


def when(epoch: float | None) -> str:
    """A timestamp as bjobs shows it (``Dec 01 10:03:01``)."""
    return time.strftime("%b %d %H:%M:%S", time.localtime(epoch)) if epoch else "-"
