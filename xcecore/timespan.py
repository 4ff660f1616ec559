"""Spans of time as people write them: ``45s``, ``90m``, ``12h``, ``7d``, ``2w`` (and ``1.5h``).

One reader for every place that takes one -- the commands' ``--since 30d`` and settings such
as ``[controller] events_retention = "7d"`` -- written without a regular expression, so a
one-shot command that imports it compiles nothing.
"""

from __future__ import annotations

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Seconds per unit letter."""
_DIGITS = frozenset("0123456789")


def span_seconds(text: str) -> float | None:
    """The seconds ``text`` spans (a decimal number and one unit letter of :data:`UNITS`,
    surrounding blanks allowed), or None if it is not written that way."""
    t = text.strip()
    if len(t) < 2 or t[-1] not in UNITS:
        return None
    whole, dot, frac = t[:-1].partition(".")
    if not whole or not set(whole) <= _DIGITS or (dot and (not frac or not set(frac) <= _DIGITS)):
        return None
    return float(t[:-1]) * UNITS[t[-1]]
