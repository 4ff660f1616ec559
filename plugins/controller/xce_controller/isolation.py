"""What keeps one request's data from harming the controller: every request is isolated.

A request is decoded by orjson, which reads up to 1,024 levels of nesting, while orjson
*writes* at most 254; any value a handler stores (a worker's join attributes, resource
values, job usage) is written again later, in a reply, a push, a row or the state a member
gets when it joins, often a level or two deeper than it came in. So before a handler may
change anything, the request's arguments are encoded once, wrapped in :data:`MARGIN` levels:
if that fails, the request is refused and the state is unchanged; if it succeeds, everything
the change produces can be encoded too (the deepest place arguments end up is two levels
below the top of a frame). The validation edge refuses deep values far earlier; this is the
controller's own guarantee, whatever the edge lets through.

Nor may a log line or an error message recurse into a client's value (``str`` of a value
nested 1,000 deep raises :class:`RecursionError`): :func:`label` names a value safely.
"""

from __future__ import annotations

from typing import Any

import orjson

from xcecore.wire import ErrorCode, RemoteError

MARGIN = 8  # levels a stored argument may sit deeper in an outgoing frame than in its request


_FLAT = frozenset({str, int, float, bool, type(None)})
"""Value types of arguments that are one level deep (most requests' are: a submission of a
command, a job id): such arguments always encode, wrapped or not -- orjson decodes no string
it cannot write and no integer beyond 64 bits (it gives a float) -- so they are not encoded
here (``test_ctl_isolation`` pins both facts)."""


def check_encodable(op: str, args: dict[str, Any]) -> None:
    """Refuse (INVALID) arguments that could not be encoded once stored; changes nothing."""
    if not args:
        return
    flat = _FLAT
    for value in args.values():
        if type(value) not in flat:
            break
    else:
        return  # one level deep: nothing to nest too deep (see _FLAT)
    wrapped: Any = args
    for _ in range(MARGIN):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise RemoteError(
            ErrorCode.INVALID,
            f"{op}: the arguments cannot be stored ({exc}: nested deeper than "
            f"{254 - MARGIN} levels?)",
        ) from None


def label(value: Any, limit: int = 64) -> str:
    """A short, safe name for a value from a client, for log lines and error messages."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, bool | int | float) or value is None:
        return str(value)[:limit]
    return type(value).__name__


def request_id(msg: Any) -> int | None:
    """The request's id if it has a usable one (for an error reply), else None."""
    mid = msg.get("id") if isinstance(msg, dict) else None
    return mid if isinstance(mid, int) and not isinstance(mid, bool) else None
