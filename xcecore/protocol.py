"""The protocol's vocabulary, in one place: job states, op names, error codes, addresses.

Every role, the CLI and the REST server take these names from here, so a new state or op is
added once; ``host:port`` text is parsed and formatted here and nowhere else (controller
candidates, listen addresses, advertised addresses). Nothing here imports anything heavy:
the one-shot commands import this module.
"""

from __future__ import annotations

import re
from enum import StrEnum

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers honour it)
if TYPE_CHECKING:
    # Type checkers only: importing ``typing`` (and with it its classes) costs a one-shot
    # command ~7 ms of its ~50. Runtime code (pydantic) takes :data:`xcecore.schema.types.JobState`.
    from typing import Final, Literal

    JobState = Literal["PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "UNKWN", "DONE", "EXIT"]
    OpName = Literal[
        "join", "hello", "heartbeat", "jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch",
        "jobdispatch_many", "set_pend_reason", "clear_reason", "update_resvals", "notify_job",
        "update_jusage", "resval",
        "clusterconf", "jobinfo", "hostinfo", "queueinfo", "status", "shutdown", "reconfig", "outcome",
        "events", "task_launch", "task_block", "revoke_token", "revoke_tokens",
    ]

# -- job states --------------------------------------------------------------------------------

JOB_STATES: Final[tuple[JobState, ...]] = ("PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "UNKWN",
                                           "DONE", "EXIT")
PENDING: Final = frozenset({"PEND", "PSUSP"})
"""Waiting to run (PSUSP: held by its owner or an administrator)."""
ACTIVE: Final = frozenset({"RUN", "USUSP", "SSUSP", "UNKWN"})
"""Dispatched to hosts, holding their slots (suspended ones too; UNKWN: its host is
unavail, so whether it still runs is not known)."""
FINISHED: Final = frozenset({"DONE", "EXIT"})
"""Ended; kept until the controller's ``clean_period`` has passed."""
UNFINISHED: Final = PENDING | ACTIVE

QUEUE_INACTIVE: Final = "queue is inactive"
"""The pend reason of every PEND job of an inactive queue: derived from the queue's record
where a job is shown (:func:`pend_reason`), never stored or sent per job (a million parked
jobs would otherwise cost a million volatile writes after every failover)."""


def pend_reason(state: object, stored: object, queue_active: bool) -> object:
    """The pend reason to show for a job in ``state`` whose stored (scheduler-set) reason is
    ``stored`` and whose queue is active or not: an inactive queue's PEND jobs wait for it,
    whatever reason a scheduler gave them while it was active."""
    if state == "PEND" and not queue_active:
        return QUEUE_INACTIVE
    return stored

# -- ops ---------------------------------------------------------------------------------------

OP_NAMES: Final[tuple[OpName, ...]] = (
    "join", "hello", "heartbeat", "jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch",
    "jobdispatch_many", "set_pend_reason", "clear_reason", "update_resvals", "notify_job",
    "update_jusage", "resval",
    "clusterconf", "jobinfo", "hostinfo", "queueinfo", "status", "shutdown", "reconfig", "outcome",
    "events", "task_launch", "task_block", "revoke_token", "revoke_tokens",
)
"""Every op the controller answers (``docs/protocol-ops.md``); a test keeps its table equal."""

KEYED_WRITES: Final = frozenset({"jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch",
                                 "jobdispatch_many", "notify_job", "task_launch", "task_block"})
"""The durable writes the controller records under their idempotency key (``rid``) with
their result, in the write's own transaction: a repeat of the key is answered from that
record, and the ``outcome`` op can say what became of a key. A client reports a lost reply
of one of these as an unknown outcome (``OutcomeUnknown``); every other op is a read or a
repeatable update (join, heartbeat, resource values, pend reasons), simply retried."""


class ErrorCode(StrEnum):
    """Error codes carried in ``reply.error.code`` (what a refused or failed request says)."""

    REDIRECT = "REDIRECT"  # a standby: "primary" names the primary's address
    NO_PRIMARY = "NO_PRIMARY"  # a standby that knows of no primary
    NOT_JOINED = "NOT_JOINED"  # the op needs a joined member; join first
    INVALID = "INVALID"  # malformed request, unknown op, bad arguments
    NOT_FOUND = "NOT_FOUND"
    DENIED = "DENIED"  # the caller's role or identity may not do this
    CONFLICT = "CONFLICT"  # the state forbids it (job not pending, queue closed, ...)
    STORAGE = "STORAGE"  # the store cannot commit (disk full, I/O error): not applied; retry
    UNAVAILABLE = "UNAVAILABLE"  # a delegated op: no member serves it, or it did not answer; retry
    INTERNAL = "INTERNAL"


# -- addresses ---------------------------------------------------------------------------------

# A hostname label: letters, digits, hyphen, underscore (common in lab names); dots join labels.
# Matched through re's own cache of compiled patterns (compiled on first use): a one-shot
# command whose peers are IP literals never compiles them.
_HOST_RE = r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$"
_V6_RE = r"[0-9A-Fa-f:.%a-zA-Z]+"


class AddressError(ValueError):
    """A ``host:port`` text is malformed; the message names the text, what it is, and why."""


def parse_hostport(text: str, *, what: str = "address", port_zero: bool = False) -> tuple[str, int]:
    """Parse ``host:port`` or ``[ipv6]:port`` into ``(host, port)``; the host comes unbracketed.

    ``what`` names the text in errors (``candidate``, ``controller.listen``); ``port_zero``
    admits port 0 (a listen address: any free port). Raises :class:`AddressError` naming what
    is wrong: an empty host, a bad host name, a missing, non-numeric or out-of-range port,
    unbalanced brackets, an unbracketed IPv6 address, or several addresses joined by ``;``.
    """
    entry = text
    text = text.strip()
    where = f"{what} {entry!r}"
    if not text:
        raise AddressError(f"empty {what}")
    if ";" in text:  # a common slip when listing candidates; say what the separator is
        raise AddressError(f"{where}: ';' is not a separator: list several addresses with ',' "
                           "(as h1:7600,h2:7600)")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise AddressError(f"{where}: '[' without a closing ']'")
        host, rest = text[1:close], text[close + 1 :]
        if not host:
            raise AddressError(f"{where}: empty host between brackets")
        if ":" not in host:
            raise AddressError(f"{where}: brackets are only for IPv6 addresses")
        if not re.fullmatch(_V6_RE, host):
            raise AddressError(f"{where}: {host!r} is not an IPv6 address")
        if not rest.startswith(":"):
            raise AddressError(f"{where}: missing ':port' after ']' (expected [ipv6]:port)")
        return host, _port(rest[1:], where, port_zero)
    if "]" in text:
        raise AddressError(f"{where}: ']' without an opening '['")
    if text.count(":") > 1:
        raise AddressError(f"{where}: IPv6 addresses must be bracketed, as [::1]:7600")
    if ":" not in text:
        raise AddressError(f"{where}: missing ':port' (expected host:port, e.g. 127.0.0.1:7600)")
    host, _, port = text.partition(":")
    if not host:
        raise AddressError(f"{where}: empty host")
    if not re.match(_HOST_RE, host) or ".." in host:
        raise AddressError(f"{where}: {host!r} is not a valid host name or address")
    return host, _port(port, where, port_zero)


def _port(text: str, where: str, port_zero: bool) -> int:
    if not text:
        raise AddressError(f"{where}: missing port after ':'")
    if not text.isdigit():
        raise AddressError(f"{where}: port {text!r} is not a number")
    port = int(text)
    low = 0 if port_zero else 1
    if not low <= port <= 65535:
        raise AddressError(f"{where}: port {port} is out of range {low}-65535")
    return port


def format_hostport(host: str, port: int) -> str:
    """``host:port``, an IPv6 host bracketed: the inverse of :func:`parse_hostport`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
