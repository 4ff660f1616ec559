"""``xce hist JOBID`` and ``xce acct``: the history, through the controller's delegated ops.

Both talk to the controller only (``history.job``, ``history.jobs``, ``history.summary``),
which forwards to the accounting role with the caller's identity; they never open the
accounting database themselves.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from datetime import UTC, datetime
from typing import Any

import click

from xcecore.cli.options import Options
from xcecore.cli.session import CommandError, Session, echo, emit_json, table, when

COLUMNS = ("jobid", "attempt", "user", "queue", "project", "state", "hosts", "slots",
           "submit_time", "start_time", "end_time", "wait_time", "wall_time", "cpu_time",
           "max_mem", "exit_status", "reason", "name")
DEFAULT_COLUMNS = "jobid,attempt,user,queue,state,hosts,end_time,wall_time,cpu_time,reason"
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
PAGE = 1000


def parse_time(text: str, now: float | None = None) -> float:
    """``30d``, ``12h``, ``90m`` (that long ago), an ISO date or time (local unless it says),
    or seconds since 1970."""
    now = time.time() if now is None else now
    found = _SPAN.match(text.strip())
    if found:
        return now - float(found.group(1)) * _UNIT[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"time {text!r}: give a span ago (30d, 12h, 90m, 45s, 2w), an ISO "
                           "date or time (2026-11-30, 2026-11-30T08:00), or epoch seconds") from None
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # local time, as bacct -C reads it
    return stamp.astimezone(UTC).timestamp()


def _session(ctx: click.Context) -> Session:
    obj = ctx.obj or {}
    opts = Options()
    opts.config, opts.timeout, opts.log_level = obj.get("config_path"), obj.get("timeout"), obj.get("log_level")
    return Session(opts)


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


def _run(fn: Any) -> None:
    try:
        fn()
    except CommandError as exc:
        raise click.ClickException(str(exc)) from None


def add_commands(group: click.Group) -> None:
    """Add ``hist`` and ``acct`` to ``group``."""

    @group.command("hist")
    @click.argument("jobid", type=click.IntRange(1))
    @click.option("--json", "as_json", is_flag=True, help="stable machine-readable output")
    @click.pass_context
    def hist(ctx: click.Context, jobid: int, as_json: bool) -> None:
        """A finished or running job's recorded history (like bhist -l)."""
        def go() -> None:
            s = _session(ctx)
            try:
                found = s.call("history.job", {"jobid": jobid})
            finally:
                s.close()
            if as_json:
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
                echo("(more events: xce acct does not page them; use REST /xce/v1/history/events)")
        _run(go)

    @group.command("acct")
    @click.option("-u", "--user", help="only this user's jobs (administrators; 'all' for everyone)")
    @click.option("-q", "--queue", help="only this queue")
    @click.option("-P", "--project", help="only this project")
    @click.option("-m", "--host", help="only attempts that ran on this host")
    @click.option("--state", type=click.Choice(["DONE", "EXIT", "REQUEUED"]), help="how it ended")
    @click.option("--since", help="ended since: 30d, 12h, an ISO date, epoch seconds")
    @click.option("--until", help="ended before (same forms)")
    @click.option("-l", "--list", "listing", is_flag=True, help="list the attempts, not only the summary")
    @click.option("--limit", type=click.IntRange(1), default=None, help="at most this many rows (-l)")
    @click.option("--format", "fmt", default=None, help=f"columns of -l, from {','.join(COLUMNS)}")
    @click.option("--json", "as_json", is_flag=True, help="stable machine-readable output")
    @click.pass_context
    def acct(ctx: click.Context, user: str | None, queue: str | None, project: str | None,
             host: str | None, state: str | None, since: str | None, until: str | None,
             listing: bool, limit: int | None, fmt: str | None, as_json: bool) -> None:
        """Accounting summary of finished jobs (like bacct); -l lists them (like sacct)."""
        def go() -> None:
            columns = (fmt or DEFAULT_COLUMNS).split(",")
            bad = [c for c in columns if c not in COLUMNS]
            if bad:
                raise CommandError(f"--format: unknown column(s) {', '.join(bad)}; columns: "
                                   f"{','.join(COLUMNS)}")
            s = _session(ctx)
            # The default filter is the real uid's name (never $LOGNAME); the controller enforces it.
            owner = None if user == "all" else (user or pwd.getpwuid(os.getuid()).pw_name)
            args = _args(owner, queue, project, host, state, since, until)
            try:
                summary = s.call("history.summary", args)
                rows: list[dict[str, Any]] = []
                if listing or fmt:
                    cursor = None
                    while limit is None or len(rows) < limit:
                        want = PAGE if limit is None else min(PAGE, limit - len(rows))
                        page = s.call("history.jobs", {**args, "limit": want,
                                                       **({"cursor": cursor} if cursor else {})})
                        rows += page["rows"]
                        cursor = page["next"]
                        if cursor is None:
                            break
            finally:
                s.close()
            if as_json:
                emit_json({"summary": summary, **({"rows": rows} if listing or fmt else {})})
                return
            if listing or fmt:
                table([c.upper() for c in columns], [[_fmt(c, r.get(c)) for c in columns] for r in rows])
                echo()
            _summary(summary)
        _run(go)


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
