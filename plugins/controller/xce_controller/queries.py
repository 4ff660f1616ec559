"""Paged listings: jobs, hosts, resource values, members -- one bounded page per request.

Every listing returns at most a page (``limit``, and a byte bound for jobs) and a ``next``
cursor to continue, or None when there is no more. A jobs cursor is the next job id and a
digest of the query, so a cursor cannot be used with another query by mistake; hosts and
members page by name. The work of a request is bounded: a jobs page examines at most
:data:`SCAN_BUDGET` jobs from the smallest index that covers the query (a page may come back
short, with a cursor), a hosts or members page looks at ``limit`` names.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import orjson

from xce_controller.jobs import Query
from xce_controller.state import ClusterState
from xcecore.protocol import pend_reason
from xcecore.wire import ErrorCode, RemoteError

JOBS_LIMIT: Final = 100  # a jobs page, by default
LIST_LIMIT: Final = 1000  # a hosts, resource-values or members page, by default
PAGE_BYTES: Final = 512 * 1024  # about the most JSON one jobs page holds
SCAN_BUDGET: Final = 20_000  # jobs one page may examine
CLEAR_BATCH: Final = 10_000  # pend reasons one clear_reason without ids clears


def job_query(args: dict[str, Any], owner: str | None) -> Query:
    """The :class:`Query` of a ``jobinfo`` request (its arguments validated)."""
    states = frozenset(args.get("states") or ([args["state"]] if "state" in args else []))
    jobids = args.get("jobids")
    return Query(
        states=states, user=owner, queue=args.get("queue"), host=args.get("host"),
        name=args.get("name"), first=int(args.get("min_jobid", 1)), last=args.get("max_jobid"),
        jobids=None if jobids is None else tuple(sorted(set(jobids))),
        array=args.get("array"),
    )


def _digest(q: Query) -> str:
    return hashlib.blake2b(q.key(), digest_size=6).hexdigest()


def job_cursor(q: Query, next_id: int | None) -> str | None:
    return None if next_id is None else f"j{next_id}-{_digest(q)}"


def job_start(q: Query, cursor: str | None) -> int:
    """Where a jobs page starts: its cursor's id (INVALID for a cursor of another query)."""
    if cursor is None:
        return q.first
    head, _, digest = cursor.partition("-")
    if not head.startswith("j") or not head[1:].isdigit() or digest != _digest(q):
        raise RemoteError(ErrorCode.INVALID, "jobinfo: 'cursor' is not one this query made "
                          "(pass back the 'next' of the previous page, with the same filters)",
                          {"arg": "cursor"})
    return int(head[1:])


def jobs_page(st: ClusterState, args: dict[str, Any], owner: str | None) -> dict[str, Any]:
    """One page of ``jobinfo``."""
    q = job_query(args, owner)
    page = st.jobs.page(q, job_start(q, args.get("cursor")), int(args.get("limit", JOBS_LIMIT)),
                        PAGE_BYTES, SCAN_BUDGET)
    inactive = {name for name, queue in st.queues.items() if not queue.get("active", True)}
    return {"jobs": [_shown(j, inactive) for j in page.jobs], "next": job_cursor(q, page.next)}


def _shown(data: bytes, inactive: set[str]) -> orjson.Fragment:
    """A job's JSON as ``jobinfo`` answers it: a PEND job of an inactive queue says so
    (:func:`xcecore.protocol.pend_reason`; no scheduler sends that reason per job). Only such
    jobs are decoded: O(page), and nothing when every queue is active."""
    if inactive and b'"state":"PEND"' in data:
        job = orjson.loads(data)
        if job.get("queue") in inactive:
            job["pend_reason"] = pend_reason(job.get("state"), job.get("pend_reason"), False)
            return orjson.Fragment(orjson.dumps(job))
    return orjson.Fragment(data)


def name_start(op: str, cursor: str | None) -> str:
    """Where a by-name page starts."""
    if cursor is None:
        return ""
    if not cursor.startswith("n"):
        raise RemoteError(ErrorCode.INVALID, f"{op}: 'cursor' is not one this op made (pass "
                          "back the 'next' of the previous page)", {"arg": "cursor"})
    return cursor[1:]


def name_cursor(name: str | None) -> str | None:
    return None if name is None else "n" + name


def hosts_page(st: ClusterState, args: dict[str, Any]) -> tuple[list[str], str | None]:
    """The host names of one page (``hosts`` given: those, each must exist)."""
    given = args.get("hosts")
    if given:
        for n in given:
            st.host(n)  # NOT_FOUND names it
        return list(given), None
    names, nxt = st.hosts_from(name_start("hostinfo", args.get("cursor")),
                               int(args.get("limit", LIST_LIMIT)))
    return names, name_cursor(nxt)


def members_page(st: ClusterState, limit: int, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A page of members by identity."""
    ids, nxt = st.members_from(name_start("status", cursor), limit)
    return [st.members[i] for i in ids], name_cursor(nxt)
