"""The accounting plugin: the ``accounting`` role, its ``[accounting]`` section, ``xce hist``
and ``xce acct``.

Nothing heavy at import: the role's machinery (the store, SQLite or psycopg) is imported when
the role is built, the commands' when they run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.role import RoleSpec

if TYPE_CHECKING:

    from xcecore.role import Role, RoleContext

ROLE = "accounting"


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/xce/accounting`` (``~/.local/state/xce/accounting``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "xce", "accounting")


def _check(values: dict[str, Any]) -> None:
    if values["backend"] not in ("sqlite", "postgresql"):
        raise ValueError("backend must be 'sqlite' or 'postgresql'")
    if values["backend"] == "postgresql" and not values.get("dsn"):
        raise ValueError("backend 'postgresql' needs dsn (e.g. 'host=db dbname=xce user=xce')")
    for key in ("keep_days", "flush_interval", "prune_interval"):
        if values[key] < 0 or (key != "keep_days" and values[key] == 0):
            raise ValueError(f"{key} must be > 0" if key != "keep_days" else "keep_days must be >= 0")
    for key in ("batch_max", "prune_batch", "query_threads"):
        if values[key] < 1:
            raise ValueError(f"{key} must be >= 1")
    if values["max_rows"] < 0:
        raise ValueError("max_rows must be >= 0")


def accounting_role(ctx: RoleContext) -> Role:
    """Build the accounting role's object (imports its machinery only now)."""
    from xce_accounting.role import AccountingRole

    return AccountingRole(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The accounting role."""
    return [RoleSpec(ROLE, accounting_role, "records every finished job attempt and its "
                                            "timeline; answers xce hist / xce acct")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[accounting]``."""
    return [ConfigSection(ROLE, {
        "backend": Field((str,), "sqlite", "where to record: 'sqlite' (a file in state_dir) or "
                                           "'postgresql' (dsn)"),
        "state_dir": Field((str,), None, "directory of the SQLite database (default: "
                                         "$XDG_STATE_HOME/xce/accounting, else "
                                         "~/.local/state/xce/accounting)"),
        "path": Field((str,), None, "the SQLite database file (default: state_dir/accounting.db)"),
        "dsn": Field((str,), None, "PostgreSQL connection string (libpq), for backend "
                                   "'postgresql'"),
        "keep_days": Field((int, float), 365, "remove records older than this many days (0: keep)"),
        "max_rows": Field((int,), 0, "keep at most this many finished attempts (and ten events "
                                     "per attempt), oldest removed first (0: no limit)"),
        "prune_batch": Field((int,), 10000, "most rows of a table one pruning pass removes"),
        "prune_interval": Field((int, float), 60.0, "seconds between pruning passes"),
        "batch_max": Field((int,), 5000, "most rows one transaction commits"),
        "flush_interval": Field((int, float), 0.05, "seconds a row waits at most before its "
                                                    "transaction commits"),
        "query_threads": Field((int,), 2, "threads answering history queries"),
        "hname": Field((str,), None, "host name in this role's identity"),
    }, "the accounting role (job history)", check=_check)]
