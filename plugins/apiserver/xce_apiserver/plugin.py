"""The API server's plugin: the ``apiserver`` role, its ``[apiserver]`` section, and the
``xce apiserver`` commands.

Importing this module must stay cheap (the ``xce`` command imports every plugin module at
start): the role object (:class:`xce_apiserver.session.ApiServerRole`) and FastAPI, uvicorn
and pydantic are imported only when the role runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.role import RoleSpec

if TYPE_CHECKING:
    import click

    from xcecore.role import Role, RoleContext

ROLE = "apiserver"


def _check_section(values: dict[str, Any]) -> None:
    from xce_apiserver.auth import parse_users
    from xcecore.protocol import parse_hostport

    parse_hostport(values["listen"], what="apiserver.listen", port_zero=True)
    parse_users(values["users"])
    if values["backend_retries"] < 0:
        raise ValueError(f"backend_retries must be >= 0, got {values['backend_retries']}")
    for key in ("backend_timeout", "token_ttl"):
        if values[key] <= 0:
            raise ValueError(f"{key} must be > 0, got {values[key]}")
    if not values["failover_grace"] >= 0:
        raise ValueError(f"failover_grace must be >= 0, got {values['failover_grace']}")
    if values["max_body"] < 1024:
        raise ValueError(f"max_body must be at least 1024 bytes, got {values['max_body']}")
    if values["logon_failures"] < 1:
        raise ValueError(f"logon_failures must be at least 1, got {values['logon_failures']}")
    if not values["logon_window"] > 0:
        raise ValueError(f"logon_window must be positive, got {values['logon_window']}")


SECTION = ConfigSection(
    ROLE,
    {
        "listen": Field((str,), "127.0.0.1:8080", "host:port the REST API listens on (port 0: any)"),
        "port_file": Field((str,), None, "write the bound port to this file (for port 0)"),
        "hname": Field((str,), None, "host part of the identity apiserver@HOST"),
        "backend_timeout": Field((float, int), 3.0, "seconds a write may wait for the controller"),
        "backend_retries": Field((int,), 10, "retries (re-sends, connect passes) per write"),
        "failover_grace": Field((float, int), 0.25, "seconds a write waits for the client to reach a "
                                                     "primary after the link was lost; then writes "
                                                     "answer 503 at once until a heartbeat reconnects"),
        "max_body": Field((int,), 1024 * 1024, "bytes a request body may have (larger: 413)"),
        "token_ttl": Field((float, int), 8 * 3600.0, "seconds a bearer token stays valid"),
        "token_key_file": Field((str,), None, "file (mode 0600) holding the key that signs tokens, "
                                              "shared by the site's API servers (tokens then work "
                                              "on each and across restarts); unset: a random key "
                                              "per process (`xce apiserver token-key FILE`)"),
        "pam_service": Field((str,), None, "also log on the system's users through this PAM "
                                           "service (e.g. 'login', or a site's /etc/pam.d/xce), "
                                           "as role user; [apiserver] users are checked first"),
        "logon_failures": Field((int,), 5, "failed logons allowed per user and per client "
                                           "address within logon_window; then 429"),
        "logon_window": Field((float, int), 60.0, "seconds over which failed logons are counted"),
        "access_log": Field((bool,), False, "log one line per request (client, method, path, "
                                            "status, ms)"),
        "users": Field((list,), [], "[{name, password_hash, role = 'user'|'admin'}]; admins must "
                                    "also be in [controller] admins for admin ops"),
    },
    "the REST API server",
    check=_check_section,
)


def apiserver_role(ctx: RoleContext) -> Role:
    """Build the API server's role object (its store and health; the app comes in main)."""
    from xce_apiserver.session import ApiServerRole

    return ApiServerRole(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The apiserver role."""
    return [RoleSpec(ROLE, apiserver_role, "REST API (FastAPI) over a push-fed view of the cluster")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[apiserver]``."""
    return [SECTION]


@hookimpl
def xce_cli_commands(group: click.Group) -> None:
    """``xce apiserver hash-password``."""
    import click

    @group.group(ROLE)
    def apiserver() -> None:
        """API server tools."""

    @apiserver.command("token-key")
    @click.argument("path")
    def token_key_cmd(path: str) -> None:
        """Write a new token signing key to PATH (mode 0600) for [apiserver] token_key_file."""
        from xce_apiserver.auth import write_token_key

        try:
            write_token_key(path)
        except OSError as exc:
            raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None
        click.echo(f"wrote a token key to {path}; copy it (mode 0600) to every API server and "
                   f"set [apiserver] token_key_file = \"{path}\"")

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
