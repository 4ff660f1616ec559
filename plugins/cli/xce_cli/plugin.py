"""Adds the command-line client's commands to ``xce`` (placeholder)."""

from __future__ import annotations

import click

from xcecore.hookspecs import hookimpl


@hookimpl
def xce_cli_commands(group: click.Group) -> None:
    """Register the client commands."""
