"""Adds the command-line client and ``xce up`` to the ``xce`` command.

Importing this module must stay cheap (every ``xce`` invocation imports it): command
bodies import what they need when they run.
"""

from __future__ import annotations

import click

from xcecore.hookspecs import hookimpl


@hookimpl
def xce_cli_commands(group: click.Group) -> None:
    """Register the client commands and ``xce up``."""
    from xce_cli.commands import COMMANDS
    from xce_cli.up import up

    for command in [*COMMANDS, up]:
        group.add_command(command)
