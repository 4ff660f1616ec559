"""The command-line client: submit, jobs, job, hosts, host, queues, queue, run-job, status, admin.

Each command is one or a few controller calls through :mod:`xce_cli.session`; tables are
rich, ``--json`` output is stable for scripts, and every error is one line and exit 1.
"""

from __future__ import annotations

import time
from typing import Any

import click

from xce_cli.session import emit_json, session
from xcecore.protocol import JOB_STATES, UNFINISHED

JSON = click.option("--json", "as_json", is_flag=True, help="Stable machine-readable output.")


def _table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """Print an aligned plain-text table, as bjobs and bhosts do.

    Plain columns, not rich: ``xce jobs`` with thousands of rows must answer in milliseconds,
    and scripts that cut columns want no box characters or colour codes.
    """
    cells = [columns, *(["-" if v is None or v == "" else str(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = [title] if title else []
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    click.echo("\n".join(out))


def _when(epoch: float | None) -> str:
    return time.strftime("%b %d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


@click.command()
@click.option("-q", "--queue", help="Queue to submit to (default: the cluster's default queue).")
@click.option("-R", "--resreq", default="", help='Resource requirement, e.g. "select[mem>4G] order[r1m]".')
@click.option("-J", "--name", default="", help="Job name.")
@click.option("-n", "--ntasks", default=1, type=click.IntRange(min=1), help="Number of tasks.")
@click.option("-P", "--project", default=None, help="Project name.")
@click.option("--cwd", default=None, help="Working directory (default: the current one).")
@JSON
@click.argument("command", nargs=-1, required=True)
@click.pass_context
def submit(ctx: click.Context, queue: str | None, resreq: str, name: str, ntasks: int,
           project: str | None, cwd: str | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Submit COMMAND as a job (like bsub); prints the job id."""
    import os
    import shlex

    args: dict[str, Any] = {
        "command": shlex.join(command) if len(command) > 1 else command[0],
        "resreq": resreq, "name": name, "ntasks": ntasks, "cwd": cwd or os.getcwd(),
    }
    if queue:
        args["queue"] = queue
    if project:
        args["project"] = project
    with session(ctx) as s:
        if resreq:  # like bsub: a bad requirement is refused here, with its position
            _select(ctx, resreq, [], s.call("clusterconf").get("resources", []))
        res = s.call("jobsubmit", args)
    if as_json:
        emit_json(res)
    else:
        click.echo(f"Job <{res['jobid']}> is submitted to queue <{res['queue']}>.")


@click.command()
@click.option("-u", "--user", "owner", help="Only jobs of this user ('all' for everyone).")
@click.option("-q", "--queue", help="Only jobs of this queue.")
@click.option("-s", "--state", type=click.Choice(JOB_STATES, case_sensitive=False), help="Only jobs in this state.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Include finished jobs.")
@JSON
@click.argument("jobids", nargs=-1, type=int)
@click.pass_context
def jobs(ctx: click.Context, owner: str | None, queue: str | None, state: str | None, show_all: bool,
         as_json: bool, jobids: tuple[int, ...]) -> None:
    """List jobs (like bjobs): your unfinished jobs unless filters say otherwise."""
    args: dict[str, Any] = {}
    if jobids:
        args["jobids"] = list(jobids)
    if queue:
        args["queue"] = queue
    if state:
        args["state"] = state.upper()
    elif not show_all and not jobids:
        args["states"] = sorted(UNFINISHED)
    with session(ctx) as s:
        if owner != "all" and not jobids:
            args["owner"] = owner or s.user
        found = s.call("jobinfo", args)["jobs"]
    if as_json:
        emit_json(found)
        return
    if not found:
        click.echo("No matching job found")
        return
    rows = [[j["jobid"], j["user"], j["state"], j["queue"],
             " ".join(f"{a['ntasks']}*{a['host']}" if a["ntasks"] > 1 else a["host"] for a in j["alloc"]),
             j["name"] or j["command"][:30], _when(j["submit_time"]),
             j["pend_reason"] if j["state"] == "PEND" else j.get("reason")] for j in found]
    _table(["JOBID", "USER", "STAT", "QUEUE", "EXEC_HOST", "JOB_NAME", "SUBMIT_TIME", "REASON"], rows)


@click.command()
@click.argument("action", type=click.Choice(["kill", "stop", "resume", "requeue", "checkpoint"]))
@click.argument("jobids", nargs=-1, type=int, required=True)
@JSON
@click.pass_context
def job(ctx: click.Context, action: str, jobids: tuple[int, ...], as_json: bool) -> None:
    """Control jobs: kill, stop, resume, requeue or checkpoint (like bkill/bstop/bresume)."""
    results = []
    failed = 0
    with session(ctx) as s:
        for jobid in jobids:
            try:
                rec = s.call("jobctrl", {"jobid": jobid, "action": action})
                results.append({"jobid": jobid, "ok": True, "state": rec["state"]})
                if not as_json:
                    click.echo(f"Job <{jobid}>: {action} accepted (state {rec['state']})")
            except click.ClickException as exc:
                failed += 1
                results.append({"jobid": jobid, "ok": False, "error": exc.message})
                if not as_json:
                    click.echo(f"Job <{jobid}>: {exc.message}", err=True)
    if as_json:
        emit_json(results)
    if failed:
        ctx.exit(1)


def host_view(h: dict[str, Any]) -> dict[str, Any]:
    """A host record flattened into the mapping the resource-requirement evaluator reads."""
    view: dict[str, Any] = {**h.get("attrs", {}), **h.get("resvals", {})}
    view["hname"] = h["name"]
    view["status"] = h["state"]
    view["maxslots"] = h["max_slots"]
    view["slots"] = max(0, h["max_slots"] - h["used_slots"])
    return view


@click.command()
@click.option("-R", "--resreq", help="Only hosts that satisfy this requirement, in its order.")
@JSON
@click.argument("names", nargs=-1)
@click.pass_context
def hosts(ctx: click.Context, resreq: str | None, as_json: bool, names: tuple[str, ...]) -> None:
    """List hosts (like bhosts / lshosts -R)."""
    with session(ctx) as s:
        found = s.call("hostinfo", {"hosts": list(names)} if names else {})["hosts"]
        if resreq:
            conf = s.call("clusterconf")
            found = _select(ctx, resreq, found, conf.get("resources", []))
    if as_json:
        emit_json(found)
        return
    rows = [[h["name"], h["state"], h["max_slots"], h["used_slots"], h["attrs"].get("type"),
             h["attrs"].get("ncpus"), h["attrs"].get("maxmem"), h["resvals"].get("r1m"),
             h["resvals"].get("mem"), h.get("comment")] for h in found]
    _table(["HOST_NAME", "STATUS", "MAX", "RUN", "TYPE", "NCPUS", "MAXMEM", "r1m", "mem", "COMMENT"], rows)


def _select(ctx: click.Context, text: str, found: list[dict[str, Any]], site: list[Any]) -> list[dict[str, Any]]:
    from xcecore.cli import XceGroup
    from xcecore.resreq import ResourceRegistry, ResreqError

    root = ctx.find_root()
    assert isinstance(root.command, XceGroup)
    evaluator = root.command.plugin_manager(root).resreq_evaluator(ResourceRegistry(site))
    by_name = {h["name"]: h for h in found}
    try:
        matches = evaluator.select(text, [host_view(h) for h in found])
    except ResreqError as exc:
        raise click.ClickException(str(exc)) from None
    return [by_name[m.name] for m in matches]


@click.command()
@click.argument("action", type=click.Choice(["open", "close"]))
@click.argument("host")
@click.option("-C", "--comment", default="", help="Why (shown by `xce hosts`).")
@click.pass_context
def host(ctx: click.Context, action: str, host: str, comment: str) -> None:
    """Open or close a host (admin; like badmin hopen/hclose)."""
    with session(ctx) as s:
        rec = s.call("hostctrl", {"host": host, "action": action, "comment": comment})
    click.echo(f"Host <{host}>: {action} done (state {rec['state']})")


@click.command()
@JSON
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """List queues (like bqueues)."""
    with session(ctx) as s:
        found = s.call("queueinfo")["queues"]
        jobs_ = s.call("jobinfo", {"states": sorted(UNFINISHED)})["jobs"]
    counts: dict[str, dict[str, int]] = {}
    for j in jobs_:
        c = counts.setdefault(j["queue"], {"PEND": 0, "RUN": 0, "SUSP": 0})
        c[j["state"] if j["state"] in ("PEND", "RUN") else "SUSP"] += 1
    if as_json:
        emit_json([{**q, **counts.get(q["name"], {"PEND": 0, "RUN": 0, "SUSP": 0})} for q in found])
        return
    rows = []
    for q in found:
        c = counts.get(q["name"], {"PEND": 0, "RUN": 0, "SUSP": 0})
        rows.append([q["name"], q["priority"], q["status"], c["PEND"], c["RUN"], c["SUSP"]])
    _table(["QUEUE_NAME", "PRIO", "STATUS", "PEND", "RUN", "SUSP"], rows)


@click.command()
@click.argument("action", type=click.Choice(["open", "close", "activate", "inactivate"]))
@click.argument("queue")
@click.pass_context
def queue(ctx: click.Context, action: str, queue: str) -> None:
    """Open, close, activate or inactivate a queue (admin; like badmin qopen/qclose/qact/qinact)."""
    with session(ctx) as s:
        rec = s.call("queuectrl", {"queue": queue, "action": action})
    click.echo(f"Queue <{queue}>: {action} done ({rec['status']})")


@click.command("run-job")
@click.argument("jobid", type=int)
@click.option("-m", "--hosts", "hostlist", required=True, help="Host(s) to run on, comma-separated.")
@click.pass_context
def run_job(ctx: click.Context, jobid: int, hostlist: str) -> None:
    """Force a pending job to run on named hosts (admin; like brun)."""
    names = [h.strip() for h in hostlist.split(",") if h.strip()]
    if not names:
        raise click.BadParameter("name at least one host", param_hint="-m")
    with session(ctx) as s:
        rec = s.call("jobinfo", {"jobids": [jobid]})["jobs"]
        if not rec:
            raise click.ClickException(f"job {jobid} not found")
        ntasks = int(rec[0]["ntasks"])
        share, extra = divmod(ntasks, len(names))
        counts = [share + (1 if i < extra else 0) for i in range(len(names))]
        alloc = [{"host": h, "ntasks": n} for h, n in zip(names, counts, strict=True) if n > 0]
        res = s.call("jobdispatch", {"jobid": jobid, "alloc": alloc, "force": True})
    click.echo(f"Job <{jobid}> is being forced to run on {', '.join(a['host'] for a in res['alloc'])}.")


@click.command()
@JSON
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the controller candidates and which one is primary."""
    from xcecore.runtime import client_config
    from xcecore.testing.cluster import probe

    obj = ctx.find_root().ensure_object(dict)
    with session(ctx) as s:
        st = s.call("status")
    cfg = client_config(obj["config"], "cli@status")
    rows = []
    for cand in cfg.candidates:
        ans = probe(cand.host, cand.port, cfg.key, timeout=1.0)
        state = (ans or {}).get("state", "down") if (ans or {}).get("ok") else "down"
        rows.append({"candidate": str(cand), "state": state})
    members = st.get("member_list", [])
    if as_json:
        emit_json({"candidates": rows, "primary": st["primary"], "jobs": st["jobs"], "hosts": st["hosts"],
                   "members": st["members"], "member_list": members})
        return
    _table(["CANDIDATE", "STATE"], [[r["candidate"], r["state"]] for r in rows], title="controller candidates")
    click.echo(f"primary {st['primary']} since {_when(st['since'])}: {st['jobs']} jobs, {st['hosts']} hosts, "
               f"{st['members']} members joined")
    # Every member, with the attributes it joined with (a worker's are its host's: xce hosts).
    _table(["MEMBER", "ROLE", "JOINED", "LAST SEEN", "PUSHES", "ATTRIBUTES"],
           [[m["identity"], m["role"], _when(m.get("joined_at")), _when(m.get("last_seen")),
             m.get("pushes"), " ".join(f"{k}={v}" for k, v in sorted((m.get("attrs") or {}).items()))]
            for m in members], title="members")


@click.group()
def admin() -> None:
    """Administrator commands, sent to the controller directly."""


@admin.command()
@click.pass_context
def shutdown(ctx: click.Context) -> None:
    """Shut down the primary controller candidate (a standby takes over)."""
    with session(ctx, role="admin") as s:
        res = s.call("shutdown")
    click.echo(f"controller {res['server']} is shutting down")


COMMANDS: list[click.Command] = [submit, jobs, job, hosts, host, queues, queue, run_job, status, admin]
