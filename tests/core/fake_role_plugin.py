"""A third-party role that is not installed: loaded by module name in the plugin tests."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import anyio

from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection, Field
from xcecore.role import Role, RoleSpec


class FakeRole(Role):
    """Writes proof that it ran, with its config, then returns."""

    async def main(self) -> None:
        ctx = self.ctx
        text = f"{ctx.role} {ctx.identity} {ctx.section['greeting']} {os.getpid()}\n"
        await anyio.to_thread.run_sync(Path(ctx.section["out"]).write_text, text)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The fake role."""
    return [RoleSpec("fakerole", FakeRole, "a test role", client=False)]


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """Its config section."""
    return [ConfigSection("fakerole", {"out": Field((str,), required=True, doc="where to write"),
                                       "greeting": Field((str,), "hi")})]
