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
