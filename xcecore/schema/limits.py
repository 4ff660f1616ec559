"""Every limit on what comes in, and the one walker that checks a JSON value against bounds.

Plain Python, no pydantic: :mod:`xcecore.wire` applies :data:`WIRE` to every request frame,
and :mod:`xcecore.schema.types` applies :data:`JSON` to the free-form values (a worker's join
attributes, job usage). The typed fields (names, commands, paths, ...) carry their own limits
from the constants below, so ``docs/protocol-ops.md`` and the code quote the same numbers.
"""

from __future__ import annotations

import math
import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any, Final

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1

NAME_MAX: Final = 255
"""User, queue, host, project, resource and role names (a host name is at most 255)."""
LABEL_MAX: Final = 1024
"""Free text: a job's name, a host's comment, a reason."""
COMMAND_MAX: Final = 32768
"""A job's command line, in characters: 4 UTF-8 bytes each still fit Linux's 128 KiB limit
on one ``execve`` argument (``sh -c COMMAND``)."""
PATH_MAX: Final = 4096
"""A working directory (Linux ``PATH_MAX``)."""
RESREQ_MAX: Final = 8192
"""A resource requirement string."""
MEM_LIMIT_MAX: Final = 1 << 62
"""A job's memory limit, in bytes (4 EiB: beyond any machine, and a 64-bit integer)."""
RUN_LIMIT_MAX: Final = 100 * 365 * 86400
"""A job's run limit, in seconds (a century: beyond it a limit means nothing)."""
EPOCH_MAX: Final = 253402300799.0
"""A time a worker reports, in seconds since the epoch (the end of year 9999: anything later
cannot be shown as a date)."""
ENV_MAX_ITEMS: Final = 1024
ENV_VALUE_MAX: Final = 32768
RID_MAX: Final = 128
"""An idempotency key (``rid``)."""
BATCH_MAX: Final = 1_000_000
DISPATCH_MORE_MAX: Final = 1000
DISPATCH_BATCH_MAX: Final = 1000
"""Allocations one ``jobdispatch_many`` carries (items, each a job)."""
DISPATCH_ELEMENTS_MAX: Final = 10_000
"""Allocations one ``jobdispatch_many`` carries in all, each item's ``more`` counted."""
TASK_HOSTS_MAX: Final = 1024  # hosts one task_launch names
TASKS_MAX: Final = 4096  # tasks one job may launch in all
TASK_COMMANDS_MAX: Final = 256 * 1024  # characters of all of a job's task commands
"""Array elements one ``jobdispatch`` may start beyond its first (``more``)."""
"""Ids or names in one list (``jobids``, ``hosts``, ``reasons``, ...)."""
TAKEOVER_MS_MAX: Final = 600_000
"""The largest ``takeover_ms`` a client takes as a promise in a standby's verdict
(:mod:`xcecore.schema.verdict`; ten minutes); a larger, negative or non-integer value is ignored
(the verdict then reads as "no primary known")."""

PAGE_MAX: Final = 1000
"""The most records one page of a listing holds (``limit``), and the most ids or names a
listing takes (``jobinfo``'s ``jobids``, ``hostinfo``'s ``hosts``)."""
CURSOR_MAX: Final = 600
"""A page's cursor (``next``), as the controller made it."""
ALLOC_MAX: Final = 10_000
"""Hosts in one allocation."""
RESVALS_MAX: Final = 1024
"""Resource values of one host."""
RESVAL_STRING_MAX: Final = 1024

NO_CONTROL: Final = r"^[^\x00-\x1f\x7f-\x9f]*$"
"""No control character at all (C0, DEL, C1): names, labels, paths."""
NO_CONTROL_BUT_TAB_LF: Final = r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$"
"""No control character but TAB and LF (a multi-line command or environment value)."""
NAME_PATTERN: Final = r"^[^\x00-\x20\x7f-\x9f]+$"
"""A name: no control character and no space."""
ENV_NAME_PATTERN: Final = r"^[^\x00-\x20=\x7f-\x9f]+$"
"""An environment variable name: no control character, space or ``=``."""
JOBID_KEY_PATTERN: Final = r"^[1-9][0-9]{0,17}$"
"""A job id written as a string (an object key): 1 to 18 digits, no leading zero."""
COMMAND_PATTERN: Final = (r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*[^\x00-\x20\x7f-\x9f]"
                          r"[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$")
"""A command: not blank, no control character but TAB and LF."""

PATTERN_TEXT: Final = {
    NO_CONTROL: "must not contain control characters (U+0000-U+001F, U+007F-U+009F)",
    NO_CONTROL_BUT_TAB_LF: "must not contain control characters other than TAB and LF "
                           "(no NUL, CR, ESC, ...)",
    NAME_PATTERN: "must not be empty or contain spaces or control characters",
    ENV_NAME_PATTERN: "must not be empty or contain '=', spaces or control characters",
    JOBID_KEY_PATTERN: "must be a job id: 1 to 18 digits without a leading zero",
    COMMAND_PATTERN: "must not be blank and must not contain control characters other than "
                     "TAB and LF (no NUL, CR, ESC, ...)",
}
"""What each pattern means, for error messages and the generated docs."""

CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Finds a control character (C0, DEL, C1)."""
CONTROL_OR_SPACE: Final = re.compile(r"[\x00-\x20\x7f-\x9f]")
"""Finds a control character or a space."""


class Bound:
    """Bounds on a JSON value: nesting depth (the value itself is level 1), items per list or
    object, characters per string and per object key; ``strict`` also checks that every
    scalar is a JSON scalar (64-bit integer, finite float, string, bool, null) and that keys
    and strings hold no NUL (keys: no control character).

    A plain class, not a dataclass: the wire imports this module, and one-shot commands pay
    for every millisecond of import.
    """

    __slots__ = ("depth", "items", "key", "strict", "string")

    def __init__(self, *, depth: int, items: int, string: int, key: int, strict: bool = False) -> None:
        self.depth, self.items, self.string, self.key, self.strict = depth, items, string, key, strict

    def describe(self) -> str:
        """The bounds in words (docs and messages)."""
        return (f"at most {self.depth} levels deep, at most {self.items:,} items per list or "
                f"object, strings of at most {self.string:,} characters, keys of at most "
                f"{self.key:,}")


WIRE: Final = Bound(depth=32, items=BATCH_MAX, string=16 * 1024 * 1024, key=4096)
"""The generic bound on every request's ``args`` (the frame's own size is ``max_frame``).

A small depth, far below what orjson can encode (254 levels): nothing accepted can fail to
encode when it is stored, pushed or echoed inside a record, which adds a few levels."""

JSON: Final = Bound(depth=8, items=1024, string=4096, key=NAME_MAX, strict=True)
"""A free-form value inside the typed arguments: join attributes, job usage."""


def takeover_of(verdict: dict[str, object]) -> float | None:
    """Seconds until the standby of ``verdict`` expects to take over, or None (no promise,
    or a value outside :data:`TAKEOVER_MS_MAX`: a sloppy or hostile peer gains nothing by it).
    The one reader of ``takeover_ms`` (here, not in :mod:`xcecore.schema.verdict`, whose
    ``TypedDict`` needs ``typing`` at run time: the one-shot commands read verdicts)."""
    value = verdict.get("takeover_ms")
    if type(value) is not int or not 0 <= value <= TAKEOVER_MS_MAX:
        return None
    return value / 1000.0


def find_violation(value: Any, bound: Bound) -> tuple[str, str] | None:
    """The first place where ``value`` breaks ``bound``: ``(dotted path, problem)``, or None.

    The path is relative to ``value`` ("" for the value itself; list items by index). Costs one
    visit per container item, nothing per byte of a string.
    """
    found = _walk(value, bound, 1)
    if found is None:
        return None
    keys, problem = found
    return ".".join(reversed(keys)), problem


def _walk(value: Any, b: Bound, depth: int) -> tuple[list[str], str] | None:
    t = type(value)
    if t is dict:
        if depth > b.depth:
            return [], f"nests deeper than {b.depth} levels"
        if len(value) > b.items:
            return [], f"has {len(value):,} entries, more than {b.items:,}"
        strict, longest = b.strict, b.string
        for k, v in value.items():
            if type(k) is not str:
                return [], f"has a key of type {type(k).__name__}, not a string"
            if len(k) > b.key:
                return [k[:32] + "..."], f"key is longer than {b.key:,} characters"
            if strict and CONTROL.search(k):
                return [repr(k)], "key must not contain control characters"
            tv = type(v)  # inline checks for the common scalars: this loop is on the hot path
            if tv is dict or tv is list:
                found = _walk(v, b, depth + 1)
            elif tv is str and not strict:
                found = None if len(v) <= longest else _scalar(v, b)
            elif tv is float and not strict:
                found = None
            else:
                found = _scalar(v, b)
            if found is not None:
                found[0].append(k)
                return found
        return None
    if t is list:
        if depth > b.depth:
            return [], f"nests deeper than {b.depth} levels"
        if len(value) > b.items:
            return [], f"has {len(value):,} items, more than {b.items:,}"
        for i, v in enumerate(value):
            found = _scalar(v, b) if type(v) not in _NESTED else _walk(v, b, depth + 1)
            if found is not None:
                found[0].append(str(i))
                return found
        return None
    return _scalar(value, b)


_NESTED = (dict, list)


def _scalar(v: Any, b: Bound) -> tuple[list[str], str] | None:
    t = type(v)
    if t is str:
        if len(v) > b.string:
            return [], f"is a string of {len(v):,} characters, more than {b.string:,}"
        if b.strict and "\x00" in v:
            return [], "must not contain NUL (U+0000)"
        return None
    if not b.strict or v is None or t is bool:
        return None
    if t is int:
        if not INT64_MIN <= v <= INT64_MAX:
            return [], "is an integer outside the 64-bit range"
        return None
    if t is float:
        return None if math.isfinite(v) else ([], "must be a finite number")
    return [], f"is a {t.__name__}, not a JSON value"
