"""``python -m xcecore`` is the ``xce`` command."""

from xcecore.cli import cli

cli()
