"""The API server role's main: build the app over the role's store and serve it."""

from __future__ import annotations

import anyio
from loguru import logger

from xce_apiserver.app import create_app
from xce_apiserver.auth import Authenticator, load_token_key, parse_users
from xce_apiserver.backend import Backend
from xce_apiserver.metrics import RequestMetrics
from xce_apiserver.server import bind, bound_address, serve, ssl_options, write_port_file
from xce_apiserver.session import ApiServerRole
from xce_apiserver.throttle import Throttle


async def run(role: ApiServerRole) -> None:
    """Serve the REST API on ``[apiserver] listen`` until the role stops."""
    ctx = role.ctx
    assert ctx.client is not None
    section = ctx.section
    users = parse_users(section["users"])
    if not users and not section.get("pam_service"):
        logger.warning("apiserver: no [apiserver] users configured: every route but health "
                       "answers 401 (add users with `xce apiserver hash-password`)")
    key_file = section.get("token_key_file")
    key = load_token_key(key_file) if key_file else None
    if key is None:
        logger.warning("apiserver: no [apiserver] token_key_file: tokens are signed with a key of "
                       "this process, so they die with it and no other API server accepts them")
    auth = Authenticator(users, token_ttl=float(section["token_ttl"]), key=key,
                         pam_service=section.get("pam_service"),
                         revocations=role.store.revocations)
    throttle = Throttle(int(section["logon_failures"]), float(section["logon_window"]))
    backend = Backend(ctx.client, role.health, timeout=float(section["backend_timeout"]),
                      retries=section["backend_retries"])
    app = create_app(role.store, backend, role.health, auth, ctx.pm.resreq_evaluator,
                     max_body=section["max_body"], throttle=throttle,
                     access_log=bool(section["access_log"]))
    app.add_middleware(RequestMetrics, stats=role.requests)
    ssl = ssl_options(ctx.config.section("tls"))  # before binding: a bad file is said first
    sock = bind(section["listen"])
    address = bound_address(sock)
    if section.get("port_file"):
        write_port_file(section["port_file"], sock.getsockname()[1])
    logger.info("apiserver: REST API listening on {}://{}/xce/v1 ({} users); next: serving "
                "from pushes, writes to the controller", "https" if ssl else "http", address,
                len(users))
    async def end_streams() -> None:  # open event streams would hold uvicorn's shutdown
        await ctx.stop.wait_async()
        role.store.hub.stop()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(end_streams)
            tg.start_soon(role.lag.run)
            await serve(app, sock, ctx.stop, ssl=ssl)
            tg.cancel_scope.cancel()
    finally:
        logger.info("apiserver: REST API on {} stopped", address)
