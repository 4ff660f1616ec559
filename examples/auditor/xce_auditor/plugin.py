"""The auditor role: joins as ``auditor``, hears every job change, appends it to a log.

This is the whole of a third-party role. Connecting to the primary through the candidate
list, following redirects, re-connecting after a failover and re-joining are the core's
work: the role has no reconnect code at all. After each (re-)join the controller pushes the
full state; the auditor compares it with what it last saw, so a change that happened while
it was away is logged too, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from xcecore.attached import Attached
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field, RoleSpec

if TYPE_CHECKING:
    from xcecore.connection import Client
    from xcecore.runtime import RoleContext

ROLE = "auditor"


class Ledger:
    """The last state seen of each job, and the append-only log of changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[int, str] = {}
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a restarted auditor does not log again what it logged before
            for line in path.read_text().splitlines():
                rec = orjson.loads(line)
                self.seen[rec["jobid"]] = rec["state"]

    def observe(self, jobs: Iterable[dict[str, Any]]) -> int:
        """Log each job whose state differs from the last one seen; how many were logged."""
        lines = []
        with self._lock:
            for job in jobs:
                if self.seen.get(job["jobid"]) != job["state"]:
                    self.seen[job["jobid"]] = job["state"]
                    lines.append(orjson.dumps({"time": time.time(), "jobid": job["jobid"], "state": job["state"],
                                               "user": job["user"], "queue": job["queue"]}))
            if lines:
                with self.path.open("ab") as fh:
                    fh.write(b"\n".join(lines) + b"\n")
        return len(lines)


# One ledger per client, made at its first push from the log file it joined with.
ledger_for: Attached[Ledger] = Attached(lambda client: Ledger(Path(client.join_attrs["log_file"])))


async def main(ctx: RoleContext) -> None:
    """Nothing to drive: pushes do the work until the role is stopped."""
    import anyio

    while not ctx.stop.is_set():
        await anyio.sleep(0.2)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The auditor role."""
    return [RoleSpec(ROLE, main, "append-only JSON-lines log of every job state change")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """``[auditor] log_file``."""
    return [ConfigSection(ROLE, {"log_file": Field((str,), "xce-audit.jsonl", "where to append"),
                                 "hname": Field((str,), None, "host name in the identity")})]


@hookimpl
def xce_join_attributes(role: str, config: Any) -> dict[str, Any] | None:
    """The auditor joins with its log file's path, for operators reading `status`."""
    if role != ROLE:
        return None
    return {"log_file": str(Path(config.section(ROLE)["log_file"]).resolve())}


@hookimpl
def xce_push(client: Client, role: str, event: str, seq: int, data: Any) -> None:
    """Log job changes: the full state after each join, then each job delta."""
    if role != ROLE:
        return
    if event == "state":
        ledger_for(client).observe(data["jobs"])
    elif event == "job":
        ledger_for(client).observe([data])
