"""How records are stored as etcd values (pure; the store writes them, the store's loads and
a standby's follow read them)."""

from __future__ import annotations

CHAIN = b"/w"  # under the prefix: the last transaction's id (the store's chain key)
BEAT = b"/beat"  # under the prefix: an idle primary's sign of life (the election's)
JOB_DIGITS = 20  # a job's key is its id zero-padded, so etcd's key order is id order


def record_of(value: bytes) -> bytes:
    """A record's JSON from its stored value (``<rev> <JSON>``)."""
    return value.partition(b" ")[2]


def stamped(value: bytes) -> tuple[int, bytes]:
    """A record's rev and JSON from its stored value (``<rev> <JSON>``)."""
    rev, _, data = value.partition(b" ")
    return int(rev), data


def job_value(stamp: bytes, data: bytes, spec: bytes) -> bytes:
    """A job's stored value: ``<rev> <fields>\\n<submission>`` (compact JSON has no raw
    newline, so the first one ends the fields)."""
    return stamp + data + b"\n" + spec


def job_of(value: bytes) -> tuple[int, bytes, bytes]:
    """A job's rev, fields JSON and submission JSON from its stored value."""
    rev, _, rest = value.partition(b" ")
    data, _, spec = rest.partition(b"\n")
    return int(rev), data, spec


# -- idempotency groups --------------------------------------------------------------------------
# A transaction's idempotency keys share one etcd key, ``P/i/<second>/<group>``: the second
# (10 digits, so key order is time order) the store filed them under, which the controller
# remembers per key and passes back to a lookup; the value is the keys and their results on
# alternate lines (a key has no control character, the schema's rule; a result is compact
# JSON: neither holds a raw newline).

SECOND_DIGITS = 10


def group_name(second: int, group: str) -> bytes:
    """A group's key under ``P/i/``: ``<second>/<group>``."""
    return b"%0*d/%s" % (SECOND_DIGITS, second, group.encode())


def second_of(name: bytes) -> int | None:
    """The second of a group's key under ``P/i/``; None for any other key (one of an
    earlier layout's: one key per idempotency key, not read any more)."""
    head = name[:SECOND_DIGITS]
    if len(name) <= SECOND_DIGITS or name[SECOND_DIGITS] != 0x2F or not head.isdigit():
        return None
    return int(head)


def second_bound(second: int) -> bytes:
    """The name below every group of ``second`` and above every earlier one's (a range end)."""
    return b"%0*d" % (SECOND_DIGITS, second)


def group_value(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A group's value from its ``(rid, result)`` pairs (ValueError: a raw newline)."""
    parts: list[bytes] = []
    for rid, result in entries:
        if b"\n" in rid or b"\n" in result:
            raise ValueError(f"idempotency key {rid[:80]!r} or its result holds a newline")
        parts += (rid, result)
    return b"\n".join(parts)


def group_rids(value: bytes) -> list[bytes]:
    """The keys of a group's value."""
    return value.split(b"\n")[::2]


def group_results(value: bytes) -> dict[bytes, bytes]:
    """A group's keys and their results."""
    lines = value.split(b"\n")
    return dict(zip(lines[::2], lines[1::2], strict=True))
