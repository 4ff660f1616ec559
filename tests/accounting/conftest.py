"""Fixtures of the accounting tests: a real PostgreSQL server for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from xce_accounting.pgserver import PgServer


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server in a temp dir (fails, naming the package, if it is not installed)."""
    server = PgServer()
    try:
        server.start()
    except Exception:
        log = server.log()
        server.stop()
        raise RuntimeError(f"could not start PostgreSQL: see its log:\n{log}") from None
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session's server; dropped afterwards."""
    import uuid

    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.dsn.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
