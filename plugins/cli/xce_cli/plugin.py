"""Adds ``xce up`` (the embedded cluster and its failover demo) to the ``xce`` command.

The cluster commands (``xce submit``, ``xce jobs``, ...) are built into the core
(:mod:`xcecore.cli`), so that they start without loading any plugin; this plugin's command
loads only when ``xce up`` or the full ``xce --help`` is asked for. Importing this module
stays cheap: command bodies import what they need when they run.
"""

from __future__ import annotations

import click

from xcecore.hookspecs import hookimpl


@hookimpl
def xce_cli_commands(group: click.Group) -> None:
    """Register ``xce up``."""
    from xce_cli.up import up

    group.add_command(up)
