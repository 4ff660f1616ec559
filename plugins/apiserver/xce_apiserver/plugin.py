"""Hook implementations of the API server role (``xce run apiserver``).

Importing this module must stay cheap (the ``xce`` command imports every plugin module at
start): FastAPI, uvicorn and pydantic are imported only inside the role's main.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from loguru import logger

from xce_apiserver.backend import REJOIN_POINTS
from xce_apiserver.session import find_session, session_for
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field, RoleSpec

if TYPE_CHECKING:
    import click

    from xcecore.candidates import Candidate
    from xcecore.config import Config
    from xcecore.runtime import RoleContext

ROLE = "apiserver"


def _check_section(values: dict[str, Any]) -> None:
    from xce_apiserver.auth import parse_users
    from xce_apiserver.server import split_listen

    split_listen(values["listen"])
    parse_users(values["users"])
    if values["backend_retries"] < 0:
        raise ValueError(f"backend_retries must be >= 0, got {values['backend_retries']}")
    for key in ("backend_timeout", "degraded_ttl", "token_ttl"):
        if values[key] <= 0:
            raise ValueError(f"{key} must be > 0, got {values[key]}")


SECTION = ConfigSection(
    ROLE,
    {
        "listen": Field((str,), "127.0.0.1:8080", "host:port the REST API listens on (port 0: any)"),
        "port_file": Field((str,), None, "write the bound port to this file (for port 0)"),
        "hname": Field((str,), None, "host part of the identity apiserver@HOST"),
        "backend_timeout": Field((float, int), 3.0, "seconds a write may wait for the controller"),
        "backend_retries": Field((int,), 10, "retries (re-sends, connect passes) per write"),
        "degraded_ttl": Field((float, int), 5.0, "seconds writes fail fast (503) after a timeout"),
        "token_ttl": Field((float, int), 8 * 3600.0, "seconds a bearer token stays valid"),
        "users": Field((list,), [], "[{name, password_hash, role = 'user'|'admin'}]; admins must "
                                    "also be in [controller] admins for admin ops"),
    },
    "the REST API server",
    check=_check_section,
)


async def main(ctx: RoleContext) -> None:
    """Serve the REST API until the role stops."""
    import importlib

    import anyio

    # FastAPI, pydantic and uvicorn take a good part of a second to import: on a thread, so
    # the client's reader and heartbeats on this loop go on meanwhile (a failover during
    # start-up is noticed at once, not after the imports).
    role = await anyio.to_thread.run_sync(importlib.import_module, "xce_apiserver.role")
    await role.run(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The apiserver role."""
    return [RoleSpec(ROLE, main, "REST API (FastAPI) over a push-fed view of the cluster")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[apiserver]``."""
    return [SECTION]


@hookimpl
def xce_join_attributes(role: str, config: Config) -> dict[str, Any] | None:
    """The API server joins with the address its REST API listens on."""
    if role != ROLE:
        return None
    return {"listen": config.section(ROLE).get("listen", SECTION.fields["listen"].default)}


@hookimpl
def xce_rejoin_points(role: str) -> Iterable[str] | None:
    """Every write op the API server forwards is a rejoin point."""
    return REJOIN_POINTS if role == ROLE else None


@hookimpl
def xce_push(client: Any, role: str, event: str, seq: int, data: Any) -> None:
    """Feed the store; ``state`` replaces it."""
    if role != ROLE:
        return
    store = session_for(client).store
    store.apply(event, data)
    if event == "state":
        logger.info(
            "apiserver: full state from {} (seq {}): {} jobs, {} hosts, {} queues; serving it",
            store.server, seq, len(store.jobs), len(store.hosts), len(store.queues),
        )


@hookimpl
def xce_connection_state(client: Any, state: str, candidate: Candidate | None, detail: str) -> None:
    """A re-join (heartbeat recovery or write path) marks the backend healthy again."""
    session = find_session(client)
    if session is None:
        if getattr(client, "role", None) != ROLE:
            return
        session = session_for(client)
    if state in ("rejoined", "connected"):
        if session.health.is_degraded():
            logger.info("apiserver: {} {}; backend healthy again, writes resume", state, candidate)
        session.health.mark_healthy()
    elif state == "degraded":
        logger.warning("apiserver: connection degraded ({}); writes answer 503 for up to {:g} s",
                       detail, session.degraded_ttl)
        session.health.mark_degraded(session.degraded_ttl, f"connection degraded: {detail}")


@hookimpl
def xce_cli_commands(group: click.Group) -> None:
    """``xce apiserver hash-password``."""
    import click

    @group.group(ROLE)
    def apiserver() -> None:
        """API server tools."""

    @apiserver.command("hash-password")
    @click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
    @click.option("--iterations", type=click.IntRange(1000), default=None, help="PBKDF2 iterations.")
    def hash_password_cmd(password_stdin: bool, iterations: int | None) -> None:
        """Print a PBKDF2-SHA256 hash for [apiserver] users."""
        import sys

        from xce_apiserver.auth import DEFAULT_ITERATIONS, hash_password

        if password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = click.prompt("password", hide_input=True, confirmation_prompt=True)
        if not password:
            raise click.ClickException("empty password")
        click.echo(hash_password(password, iterations=iterations or DEFAULT_ITERATIONS))
