"""A third-party role for the runtime tests: async handlers, join attributes, a subscription.

Loaded by module name (``XCE_PLUGIN_MODULES=role_probe_plugin``) in the role's process only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import orjson

from xcecore.candidates import Candidate
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.role import ALL_PUSHES, NO_PUSHES, Role, RoleContext, RoleSpec


class ProbeRole(Role):
    """Appends every push and connection state it is given, from ``async def`` handlers."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.out = Path(ctx.section["out"])
        self.subscription = NO_PUSHES if ctx.section["pushes"] == "none" else ALL_PUSHES

    def join_attributes(self) -> dict[str, Any]:
        return {"colour": self.ctx.section["colour"]}

    async def _record(self, what: dict[str, Any]) -> None:
        await anyio.lowlevel.checkpoint()  # a real suspension: the core must await this to get the line
        with self.out.open("ab") as fh:
            fh.write(orjson.dumps(what) + b"\n")

    async def push(self, event: str, seq: int, data: Any) -> None:
        await self._record({"push": event, "seq": seq})

    async def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> None:
        await self._record({"state": state})


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    return [RoleSpec("probe", ProbeRole, "records what the core hands it")]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    return [ConfigSection("probe", {
        "out": Field((str,), required=True, doc="where to record"),
        "pushes": Field((str,), "all", "all or none"),
        "colour": Field((str,), "blue", "a join attribute"),
        "hname": Field((str,), None, "host part of the identity"),
    })]
