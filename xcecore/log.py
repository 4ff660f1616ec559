"""One logging setup for every role: loguru to stderr, the component in every line."""

from __future__ import annotations

import sys

from loguru import logger

_FORMAT = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[component]}</cyan> | {message}"
)


def setup_logging(
    component: str = "xce", level: str = "INFO", *, json: bool = False, file: str | None = None
) -> None:
    """Send logs to stderr (and ``file``) at ``level``, tagged with ``component`` (role@host).

    ``json`` writes one JSON object per line for log shippers.
    """
    logger.remove()
    logger.configure(extra={"component": component})
    level = level.upper()
    logger.add(sys.stderr, level=level, format=_FORMAT, serialize=json, backtrace=False,
               diagnose=False, colorize=None if not json else False)
    if file:
        logger.add(file, level=level, format=_FORMAT, serialize=json, colorize=False,
                   backtrace=False, diagnose=False)
