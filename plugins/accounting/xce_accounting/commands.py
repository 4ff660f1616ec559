"""``xce hist JOBID`` and ``xce acct``: the history, through the controller's delegated ops.

Both talk to the controller only (``history.job``, ``history.jobs``, ``history.summary``),
which forwards to the accounting role with the caller's identity; they never open the
accounting database themselves. They are one-shot commands (this module is named by the
distribution's ``xce.commands`` entry points): ``xce hist`` imports this module and the
client, not the plugins, so it answers like ``xce jobs``.
"""

from __future__ import annotations

from xcecore.cli.session import CommandError, Session, echo, emit_json, parse_time, table, when
from xcecore.cli.spec import Parsed, arg, command

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (as xcecore.protocol)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["parse_time"]  # (moved to xcecore.cli.session: xce events reads times too)

COLUMNS = ("jobid", "attempt", "user", "queue", "project", "state", "hosts", "slots",
           "submit_time", "start_time", "end_time", "wait_time", "wall_time", "cpu_time",
           "max_mem", "exit_status", "reason", "name")
DEFAULT_COLUMNS = "jobid,attempt,user,queue,state,hosts,end_time,wall_time,cpu_time,reason"
PAGE = 1000


def _fmt(col: str, value: Any) -> Any:
    if value is None:
        return "-"
    if col.endswith("_time") and col not in ("wait_time", "wall_time", "cpu_time"):
        return when(value)
    if col in ("wait_time", "wall_time", "cpu_time"):
        return f"{value:.1f}"
    if col == "hosts":
        return ",".join(value) if value else "-"
    if col == "max_mem":
        return f"{value:.0f}M"
    return value


def _args(user: str | None, queue: str | None, project: str | None, host: str | None,
          state: str | None, since: str | None, until: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for key, value in (("owner", user), ("queue", queue), ("project", project), ("host", host),
                       ("state", state)):
        if value:
            args[key] = value
    if since:
        args["since"] = parse_time(since)
    if until:
        args["until"] = parse_time(until)
    return args


JSON = arg("--json", dest="as_json", action="store_true", help="stable machine-readable output")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{value} is not a positive number")
    return value


@command("hist", "A finished or running job's recorded history (like bhist -l).",
         arg("jobid", type=_positive), JSON)
def hist(s: Session, ns: Parsed) -> None:
    """Print the job's events and its attempts' outcomes."""
    jobid = ns.jobid
    found = s.call("history.job", {"jobid": jobid})
    if ns.as_json:
        emit_json(found)
        return
    echo(f"Job <{jobid}>, User <{found['user']}>")
    if found.get("gaps"):
        echo(f"  NOTE: the history has {found['gaps']} gap(s): accounting did not see "
             "every change of this job (see the 'gap' lines)")
    for e in found["events"]:
        echo(f"{when(e['time'])}: [{e['attempt']}] {_describe(e)}")
    for a in found["attempts"]:
        echo(f"Attempt {a['attempt']}: {a['state']}"
             + (f" ({a['reason']})" if a.get("reason") else "")
             + f"; hosts {','.join(a['hosts']) or '-'}; wait {_fmt('wait_time', a['wait_time'])} s; "
             f"run {_fmt('wall_time', a['wall_time'])} s; CPU {_fmt('cpu_time', a['cpu_time'])} s"
             + (f"; peak mem {a['max_mem']:.0f} MB" if a.get("max_mem") is not None else ""))
    if found.get("more_events"):
        echo("(more events: xce hist does not page them; use REST /xce/v1/history/events)")


@command(
    "acct", "Accounting summary of finished jobs (like bacct); -l lists them (like sacct).",
    arg("-u", "--user", help="only this user's jobs (administrators; 'all' for everyone)"),
    arg("-q", "--queue", help="only this queue"),
    arg("-P", "--project", help="only this project"),
    arg("-m", "--host", help="only attempts that ran on this host"),
    arg("--state", choices=["DONE", "EXIT", "REQUEUED"], help="how it ended"),
    arg("--since", help="ended since: 30d, 12h, an ISO date, epoch seconds"),
    arg("--until", help="ended before (same forms)"),
    arg("-l", "--list", dest="listing", action="store_true", help="list the attempts, not only the summary"),
    arg("--limit", type=_positive, help="at most this many rows (-l)"),
    arg("--format", dest="fmt", help=f"columns of -l, from {','.join(COLUMNS)}"),
    JSON,
)
def acct(s: Session, ns: Parsed) -> None:
    """The summary (and with -l or --format the rows, paged) for the filters."""
    listing, limit = ns.listing or bool(ns.fmt), ns.limit
    columns = (ns.fmt or DEFAULT_COLUMNS).split(",")
    bad = [c for c in columns if c not in COLUMNS]
    if bad:
        raise CommandError(f"--format: unknown column(s) {', '.join(bad)}; columns: "
                           f"{','.join(COLUMNS)}")
    # The default filter is the authenticated user (never $LOGNAME); the controller enforces it.
    owner = None if ns.user == "all" else (ns.user or s.whoami())
    args = _args(owner, ns.queue, ns.project, ns.host, ns.state, ns.since, ns.until)
    summary = s.call("history.summary", args)
    rows: list[dict[str, Any]] = []
    if listing:
        cursor = None
        while limit is None or len(rows) < limit:
            want = PAGE if limit is None else min(PAGE, limit - len(rows))
            page = s.call("history.jobs", {**args, "limit": want, **({"cursor": cursor} if cursor else {})})
            rows += page["rows"]
            cursor = page["next"]
            if cursor is None:
                break
    if ns.as_json:
        emit_json({"summary": summary, **({"rows": rows} if listing else {})})
        return
    if listing:
        table([c.upper() for c in columns], [[_fmt(c, r.get(c)) for c in columns] for r in rows])
        echo()
    _summary(summary)


def _describe(e: dict[str, Any]) -> str:
    d, kind = e["detail"], e["kind"]
    if kind == "submitted":
        return (f"Submitted from user <{d.get('user')}>, to queue <{d.get('queue')}>, project "
                f"<{d.get('project')}>, {d.get('ntasks')} task(s)"
                + (f", requirement <{d['resreq']}>" if d.get("resreq") else ""))
    if kind == "pending":
        return f"Pending: {d.get('reason')}"
    if kind == "dispatched":
        return f"Dispatched to <{','.join(d.get('hosts') or [])}>" + (" (forced)" if d.get("forced") else "")
    if kind == "started":
        return f"Started (pid {d.get('pid')})"
    if kind == "stopped":
        return f"Suspended by the {d.get('by')} ({d.get('state')})"
    if kind == "resumed":
        return f"Resumed ({d.get('state')})"
    if kind == "unknown":
        return f"State unknown: <{','.join(d.get('hosts') or [])}> stopped reporting (UNKWN)"
    if kind == "reported":
        return "Its host reports again (RUN)"
    if kind == "requeued":
        return f"Requeued: attempt {d.get('previous')} ended, attempt {d.get('attempt')} pending"
    if kind == "finished":
        if d.get("state") == "DONE":
            return "Done successfully"
        return f"Exited: {d.get('reason') or 'exit status ' + str(d.get('exit_status'))}"
    if kind == "gap":
        return f"GAP: {d.get('text')}"
    return f"{kind} {d}"


def _summary(s: dict[str, Any]) -> None:
    w = s["wait"]

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    echo("SUMMARY:")
    echo(f"  Jobs: {s['jobs']}  Done: {s['done']}  Exited: {s['exit']}  Requeued: {s['requeued']}")
    echo(f"  CPU hours: {s['cpu_hours']:.3f}  Wall hours (x slots): {s['wall_hours']:.3f}")
    echo(f"  Wait: p50 {sec(w['p50'])}  p90 {sec(w['p90'])}  p99 {sec(w['p99'])}  mean {sec(w['mean'])}")
    if s["failures"]:
        echo("  Failures by reason:")
        for reason, n in s["failures"].items():
            echo(f"    {n:>8}  {reason}")
