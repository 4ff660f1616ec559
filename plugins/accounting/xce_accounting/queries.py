"""The answers to the delegated history ops, authorized from the identity the controller attached.

The controller validated the arguments (``xcecore.schema.delegated``) and attached who is
calling: ``{"user", "admin", "role", "identity"}``. A caller who is not an administrator sees
only their own jobs: ``owner`` is forced to them (naming someone else is DENIED), and another
user's job history is DENIED. Cluster events are not private.
"""

from __future__ import annotations

from typing import Any

from xce_accounting.store import Filters, QueryError, Store
from xcecore.wire import ErrorCode, RemoteError

DEFAULT_LIMIT = 100
JOB_EVENTS_MAX = 1000
"""Events ``history.job`` returns at most (``history.events`` pages through the rest)."""


def _owner(op: str, args: dict[str, Any], caller: dict[str, Any]) -> str | None:
    owner = args.get("owner")
    if caller.get("admin"):
        return owner  # type: ignore[no-any-return]
    user = caller.get("user")
    if not isinstance(user, str):
        raise RemoteError(ErrorCode.DENIED, f"{op}: the caller names no user; only "
                                            "administrators may read every user's history")
    if owner is not None and owner != user:
        raise RemoteError(ErrorCode.DENIED, f"{op}: {user} may read only their own history, "
                                            f"not {owner}'s (administrators read everyone's)")
    return user


def filters(op: str, args: dict[str, Any], caller: dict[str, Any]) -> Filters:
    """The attempt filters of a ``history.jobs`` or ``history.summary`` call."""
    return Filters(owner=_owner(op, args, caller), queue=args.get("queue"),
                   project=args.get("project"), host=args.get("host"), state=args.get("state"),
                   since=args.get("since"), until=args.get("until"))


def _check_job(op: str, store: Store, jobid: int, caller: dict[str, Any]) -> dict[str, Any]:
    found = store.job(jobid)
    if found is None:
        raise RemoteError(ErrorCode.NOT_FOUND, f"{op}: nothing is recorded for job {jobid}")
    if not caller.get("admin") and found["user"] != caller.get("user"):
        raise RemoteError(ErrorCode.DENIED, f"{op}: job {jobid} belongs to {found['user']}, not "
                                            f"{caller.get('user')}")
    return found


def answer(store: Store, op: str, args: dict[str, Any], caller: dict[str, Any]) -> dict[str, Any]:
    """The result of delegated ``op``; raises :class:`RemoteError` for a refusal."""
    try:
        if op == "history.jobs":
            rows, nxt = store.jobs(filters(op, args, caller), args.get("limit", DEFAULT_LIMIT),
                                   args.get("cursor"))
            return {"rows": rows, "next": nxt}
        if op == "history.summary":
            return store.summary(filters(op, args, caller))
        if op == "history.job":
            found = _check_job(op, store, args["jobid"], caller)
            more = len(found["events"]) > JOB_EVENTS_MAX
            found["events"] = found["events"][:JOB_EVENTS_MAX]
            found["more_events"] = more
            return found
        if op == "history.events":
            limit, cursor = args.get("limit", DEFAULT_LIMIT), args.get("cursor")
            since, until = args.get("since"), args.get("until")
            if "jobid" in args:
                _check_job(op, store, args["jobid"], caller)
                events, nxt = store.job_events(args["jobid"], limit, cursor, since, until)
            else:
                events, nxt = store.cluster_events(limit, cursor, since, until)
            return {"events": events, "next": nxt}
    except QueryError as exc:
        raise RemoteError(ErrorCode.INVALID, f"{op}: {exc}") from None
    raise RemoteError(ErrorCode.INVALID, f"the accounting role does not serve {op}")
