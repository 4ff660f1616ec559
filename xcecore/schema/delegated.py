"""Argument models of the delegated ops: ops the controller forwards to a member that serves them.

A member declares at join (``attrs["serves"]``) the delegated ops it answers; the controller
validates a call's arguments against the model here, attaches the caller's identity, and
forwards it (``xce_controller.delegate``). Only ops with a model in :data:`DELEGATED_ARGS`
can be served, so no member can claim a controller op. The models follow the rules of
:mod:`xcecore.schema.ops` (strict types, unknown arguments refused, ``user`` accepted).

The history ops are served by the accounting role (``plugins/accounting``): finished job
attempts, a job's timeline and cluster events, paged with an opaque ``cursor``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict

from xcecore.schema import limits as lim
from xcecore.schema import types as t
from xcecore.schema.ops import ArgsSchema

_STRICT = ConfigDict(extra="forbid", strict=True)
PAGE_MAX = 1000
"""The most rows one page of a history query returns."""
CURSOR_MAX = 256


def _d(text: str) -> Any:
    return Field(description=text)


User = Annotated[t.Name, _d("the person a front end acts for (required from front ends)")]
Epoch = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False),
                  t.Shape("epoch", "seconds since 1970 (a number >= 0)")]
Limit = Annotated[int, Field(ge=1, le=PAGE_MAX), t.Shape("int", f"1 to {PAGE_MAX}")]
Cursor = Annotated[str, Field(min_length=1, max_length=CURSOR_MAX, pattern=r"^[0-9A-Za-z_.:-]+$"),
                   t.Shape("cursor", "the `next` of the previous page")]
AttemptState = Literal["DONE", "EXIT", "REQUEUED"]
REPLY: lim.Bound = lim.Bound(depth=8, items=PAGE_MAX + 24, string=lim.COMMAND_MAX, key=lim.LABEL_MAX,
                             strict=True)
"""The bound on a delegated answer: a page of rows (commands whole), a reason as a key."""
ReplyObject = Annotated[dict[str, Any], t._json_validator(REPLY, objects_only=True),
                        WithJsonSchema({"type": "object"}),
                        t.Shape("JSON object", "a JSON object " + REPLY.describe())]


@with_config(_STRICT)
class HistoryFilters(TypedDict):
    """Filters of finished job attempts (all optional, combined with AND)."""

    owner: NotRequired[Annotated[t.Name, _d("only this user's jobs (administrators; others "
                                            "always see only their own)")]]
    queue: NotRequired[Annotated[t.Name, _d("only this queue")]]
    project: NotRequired[Annotated[t.Name, _d("only this project")]]
    host: NotRequired[Annotated[t.Name, _d("only attempts that ran on this host")]]
    state: NotRequired[Annotated[AttemptState, _d("how the attempt ended: DONE, EXIT or REQUEUED")]]
    since: NotRequired[Annotated[Epoch, _d("ended at or after this time")]]
    until: NotRequired[Annotated[Epoch, _d("ended before this time")]]
    user: NotRequired[User]


@with_config(_STRICT)
class HistoryJobsArgs(HistoryFilters):
    """Finished job attempts, newest end first. Result: ``{"rows": [attempt, ...], "next":
    cursor | null}``; pass ``next`` as ``cursor`` for the following page."""

    cursor: NotRequired[Cursor]
    limit: NotRequired[Annotated[Limit, _d(f"rows per page (default 100, at most {PAGE_MAX})")]]


@with_config(_STRICT)
class HistorySummaryArgs(HistoryFilters):
    """A summary of the matching attempts, like ``bacct``. Result: ``{"jobs", "done", "exit",
    "requeued", "cpu_hours", "wall_hours", "wait": {"p50", "p90", "p99", "mean"},
    "failures": {reason: count}}``."""


@with_config(_STRICT)
class HistoryJobArgs(TypedDict):
    """One job's history, like ``bhist -l``. Result: ``{"jobid", "attempts": [...], "events":
    [...], "gaps": n}``; NOT_FOUND when nothing is recorded for it (or it is not the caller's)."""

    jobid: Annotated[t.JobId, _d("the job")]
    user: NotRequired[User]


@with_config(_STRICT)
class HistoryEventsArgs(TypedDict):
    """Events in time order. With ``jobid``: that job's timeline; without: cluster events
    (promotions, members joined/left, hosts opened/closed/unavail). Result: ``{"events":
    [...], "next": cursor | null}``."""

    jobid: NotRequired[Annotated[t.JobId, _d("this job's timeline")]]
    since: NotRequired[Annotated[Epoch, _d("at or after this time")]]
    until: NotRequired[Annotated[Epoch, _d("before this time")]]
    cursor: NotRequired[Cursor]
    limit: NotRequired[Annotated[Limit, _d(f"events per page (default 100, at most {PAGE_MAX})")]]
    user: NotRequired[User]


@with_config(_STRICT)
class DelegateReplyArgs(TypedDict):
    """A serving member's answer to a delegated call it was pushed (``delegate``): exactly one
    of ``result`` and ``error``. Result: ``{"relayed": bool}`` (false: the call had timed out
    or its caller had gone)."""

    call: Annotated[t.NonNegative, _d("the call id of the `delegate` push")]
    result: NotRequired[Annotated[ReplyObject, _d("the answer, relayed to the caller as is")]]
    error: NotRequired[Annotated[t.JsonObject, _d('`{"code", "message"}`, relayed as an error')]]
    user: NotRequired[User]


DELEGATED_ARGS: dict[str, Any] = {
    "history.jobs": HistoryJobsArgs,
    "history.summary": HistorySummaryArgs,
    "history.job": HistoryJobArgs,
    "history.events": HistoryEventsArgs,
}
"""Delegated op name -> its argument model."""

DELEGATE_REPLY = "delegate_reply"
"""The op a serving member answers a delegated call with (not itself delegated)."""


def compile_delegated() -> dict[str, ArgsSchema]:
    """Every delegated op's compiled schema, and ``delegate_reply``'s."""
    out = {op: ArgsSchema(op, model) for op, model in DELEGATED_ARGS.items()}
    out[DELEGATE_REPLY] = ArgsSchema(DELEGATE_REPLY, DelegateReplyArgs)
    return out


__all__ = ["DELEGATED_ARGS", "DELEGATE_REPLY", "PAGE_MAX", "compile_delegated"]
