"""The cluster commands: submit, jobs, job, hosts, host, queues, queue, run-job, status,
outcome, admin, task.

Each is one or a few controller calls through :class:`xcecore.cli.session.Session`; tables
are plain aligned text, ``--json`` output is stable for scripts, and every error is one line
and exit 1. These modules import nothing heavy: ``xce jobs`` costs the interpreter, the
config file, one socket and the table.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from xcecore.cli.session import (
    CommandError,
    JsonList,
    Session,
    StreamTable,
    echo,
    emit_json,
    parse_time,
    table,
    when,
)
from xcecore.cli.spec import Parsed, arg, command
from xcecore.protocol import JOB_STATES, UNFINISHED

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

JSON = arg("--json", dest="as_json", action="store_true", help="stable machine-readable output")


def _select(s: Session, text: str, found: list[dict[str, Any]], site: list[Any]) -> list[dict[str, Any]]:
    """The hosts of ``found`` that satisfy requirement ``text``, in its order (the configured
    evaluator: this loads the plugins)."""
    from xcecore.resreq import ResourceRegistry, ResreqError

    evaluator = s.plugin_manager().resreq_evaluator(ResourceRegistry(site))
    by_name = {h["name"]: h for h in found}
    try:
        matches = evaluator.select(text, [host_view(h) for h in found])
    except ResreqError as exc:
        raise CommandError(str(exc)) from None
    return [by_name[m.name] for m in matches]


def host_view(h: dict[str, Any]) -> dict[str, Any]:
    """A host record flattened into the mapping the resource-requirement evaluator reads."""
    view: dict[str, Any] = {**h.get("attrs", {}), **h.get("resvals", {})}
    view["hname"] = h["name"]
    view["status"] = h["state"]
    view["maxslots"] = h["max_slots"]
    view["slots"] = max(0, h["max_slots"] - h["used_slots"])
    return view


@command(
    "submit", "Submit COMMAND as a job (like bsub), or a job script whose #XCE, #BSUB or "
              "#SBATCH directives say how (like sbatch); prints the job id.",
    arg("-q", "--queue", help="queue to submit to (default: the cluster's default queue)"),
    arg("-R", "--resreq", help='resource requirement, e.g. "select[mem>4G] order[r1m]"'),
    arg("-J", "--name", help="job name; NAME[1-100:2]%10 submits a job array (as LSF)"),
    arg("-w", "--dependency", dest="depend", metavar="EXPR",
        help="run only once EXPR holds: done(ID) && (exit(ID, >2) || ended(NAME)), started(ID[I]) "
             "(as LSF -w), or afterok:ID:ID,afterany:ID (as Slurm)"),
    arg("--array", metavar="INDEXES", help="a job array (as Slurm): 1-100, 1-1000:2%50 (at most "
        "50 running), 1,5,9-12; each element gets XCE_ARRAY_INDEX"),
    arg("-n", "--ntasks", type=int, help="number of tasks (>= 1; default 1)"),
    arg("-P", "--project", help="project name"),
    arg("--cwd", help="working directory (default: the current one)"),
    arg("-M", "--mem", metavar="LIMIT", help="memory limit of the job on each host: 64MB, 2G, "
        "1.5GB, or a bare number in [cluster] unit_for_limits (default MB)"),
    arg("-W", "--time", metavar="[HOURS:]MINUTES", help="run limit: SIGTERM when it is reached, "
        "SIGKILL after the worker's kill_grace (time stopped does not count)"),
    arg("-o", "--output", dest="stdout", metavar="FILE", help="append the job's output to FILE "
        "(%J job id, %I array index, %A attempt; relative to the job's cwd); the errors too "
        "unless -e"),
    arg("-e", "--error", dest="stderr", metavar="FILE", help="append the job's errors to FILE"),
    arg("-i", "--input", dest="stdin", metavar="FILE", help="the job's input (default /dev/null)"),
    arg("-x", "--exclusive", action="store_true",
        help="the hosts to itself (recorded; not yet enforced by the scheduler)"),
    arg("--env", metavar="WHICH", help="variables the job gets from here: all (the default, as "
        "LSF), none, 'all,~VAR,VAR=value' or 'VAR,VAR=value,...'"),
    JSON,
    arg("command", nargs="...", help="the command and its arguments (after --), or a job script"),
    epilog="A job script is a COMMAND whose first word is a file starting with '#' (a #! line or\n"
           "a directive): its #XCE / #BSUB / #SBATCH lines at the top are read (see the operator's\n"
           "guide, 'Job scripts'); options given here override them. The job gets your\n"
           "environment (less variables the controller cannot take, named in a warning).",
)
def submit(s: Session, ns: Parsed) -> None:
    import os

    from xcecore.cli.submission import build

    args, warnings = build(ns, s.sections()[0], os.environ, os.getcwd())
    for text in warnings:
        echo(f"xce submit: {text}", err=True)
    if args["resreq"]:  # like bsub: a bad requirement is refused here, with its position
        _select(s, args["resreq"], [], s.call("clusterconf").get("resources", []))
    res = s.call("jobsubmit", args)
    if ns.as_json:
        emit_json(res)
    else:
        echo(f"Job <{res['jobid']}> is submitted to queue <{res['queue']}>.")


def _state(text: str) -> str:
    state = text.upper()
    if state not in JOB_STATES:
        raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(JOB_STATES)})")
    return state


FIRST_PAGE = 100
"""Jobs asked for in the first page of ``xce jobs``: the first lines show at once."""
PAGE = 1000
"""Jobs per later page (the controller's most per page)."""


@command(
    "jobs", "List jobs (like bjobs): your unfinished jobs unless filters say otherwise.",
    arg("-u", "--user", dest="owner", help="only jobs of this user ('all' for everyone)"),
    arg("-q", "--queue", help="only jobs of this queue"),
    arg("-s", "--state", type=_state, help=f"only jobs in this state ({', '.join(JOB_STATES)})"),
    arg("-a", "--all", dest="show_all", action="store_true", help="include finished jobs"),
    arg("-l", "--long", dest="long", action="store_true",
        help="every field of each job: times, hosts, limits, usage, exit reason (like bjobs -l)"),
    arg("-A", "--array", dest="array", type=int, metavar="ARRAY",
        help="the elements of this job array, one line each (without it an array is one line)"),
    JSON,
    arg("jobids", nargs="*", type=int, help="only these jobs"),
)
def jobs(s: Session, ns: Parsed) -> None:
    """Stream the matching jobs page by page (the controller's paged ``jobinfo``, in job id
    order): each page is printed as it arrives, so a million jobs start showing at once."""
    args: dict[str, Any] = {}
    if ns.jobids:
        args["jobids"] = list(ns.jobids)
    if ns.queue:
        args["queue"] = ns.queue
    if ns.state:
        args["state"] = ns.state
    elif not ns.show_all and not ns.jobids:
        args["states"] = sorted(UNFINISHED)
    if ns.array is not None:
        args["array"] = ns.array
    if ns.owner != "all" and not ns.jobids:
        args["owner"] = ns.owner or s.whoami()
    # An array's elements are folded into its one line unless asked for.
    fold = ns.array is None and not ns.jobids
    if ns.as_json:
        listing = JsonList()
        for page in _pages(s, args):
            listing.add(page)
        listing.close()
        return
    if ns.long:
        from xcecore.cli.joblong import long_format

        found = False
        for page in _pages(s, args):
            for j in page:
                echo(("\n" if found else "") + long_format(j))
                found = True
        if not found:
            echo("No matching job found")
        return
    out = StreamTable(["JOBID", "USER", "STAT", "QUEUE", "EXEC_HOST", "JOB_NAME", "SUBMIT_TIME",
                       "REASON"])
    for page in _pages(s, args):
        out.add([[_jobid(j), j["user"], j["state"], j["queue"],
                  " ".join(f"{a['ntasks']}*{a['host']}" if a["ntasks"] > 1 else a["host"]
                           for a in j["alloc"]),
                  _job_name(j), when(j["submit_time"]), _job_reason(j)]
                 for j in page if not (fold and (j.get("array") or {}).get("of"))])
    if not out.close():
        echo("No matching job found")


def _jobid(j: dict[str, Any]) -> str:
    """``12``, or ``12[3]`` for element 3 of array 12."""
    a = j.get("array")
    if a and "of" in a:
        return f"{a['of']}[{a['index']}]"
    return str(j["jobid"])


def _job_name(j: dict[str, Any]) -> str:
    a = j.get("array")
    if a and "of" not in a:
        return f"{j['name']}[{a['spec']}]"
    return str(j["name"] or j["command"][:30])


def _job_reason(j: dict[str, Any]) -> Any:
    a = j.get("array")
    if a and "of" not in a:  # an array's line: its elements by state, as bjobs -A counts them
        counts = dict(a["counts"])
        if a["left"]:
            key = "PSUSP" if a["held"] else "PEND"
            counts[key] = counts.get(key, 0) + a["left"]
        parts = [f"{counts[st]} {st}" for st in JOB_STATES if counts.get(st)]
        reason = j.get("pend_reason") if j["state"] == "PEND" else None
        return f"{a['size']} elements: {', '.join(parts)}" + (f"; {reason}" if reason else "")
    if j.get("waiting") and j["state"] in ("PEND", "PSUSP"):
        return j["waiting"]
    return j.get("pend_reason") if j["state"] == "PEND" else j.get("reason")


def _jobref(text: str) -> tuple[int, int | None]:
    """``12`` or ``12[3]`` (element 3 of array 12)."""
    head, bracket, rest = text.partition("[")
    try:
        if not bracket:
            return int(text), None
        if not rest.endswith("]"):
            raise ValueError
        return int(head), int(rest[:-1])
    except ValueError:
        raise ValueError(f"{text!r} is not a job id (ID, or ID[INDEX] for an array element)") from None


def _pages(s: Session, args: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """The pages of ``jobinfo`` for ``args``: the first small, then full ones, until the
    controller's ``next`` cursor is null."""
    body = {**args, "limit": FIRST_PAGE}
    while True:
        result = s.call("jobinfo", body)
        yield result["jobs"]
        cursor = result.get("next")
        if not cursor:
            return
        body = {**args, "limit": PAGE, "cursor": cursor}


@command(
    "job", "Control jobs: kill, stop, resume, requeue or checkpoint (like bkill/bstop/bresume).",
    arg("action", choices=["kill", "stop", "resume", "requeue", "checkpoint"]),
    arg("jobids", nargs="+", type=_jobref, metavar="JOBID",
        help="job ids; an array's id acts on all its elements, ID[INDEX] on one"),
    JSON,
)
def job(s: Session, ns: Parsed) -> int:
    results: list[dict[str, Any]] = []
    failed = 0
    for jobid, index in ns.jobids:
        body: dict[str, Any] = {"jobid": jobid, "action": ns.action}
        if index is not None:
            body["index"] = index
            jobid = f"{jobid}[{index}]"
        try:
            rec = s.call("jobctrl", body)
            results.append({"jobid": jobid, "ok": True, "state": rec["state"]})
            if not ns.as_json:
                echo(f"Job <{jobid}>: {ns.action} accepted (state {rec['state']})")
        except CommandError as exc:
            failed += 1
            results.append({"jobid": jobid, "ok": False, "error": str(exc)})
            if not ns.as_json:
                echo(f"Job <{jobid}>: {exc}", err=True)
    if ns.as_json:
        emit_json(results)
    return 1 if failed else 0


@command(
    "hosts", "List hosts (like bhosts / lshosts -R).",
    arg("-R", "--resreq", help="only hosts that satisfy this requirement, in its order"),
    JSON,
    arg("names", nargs="*", help="only these hosts"),
)
def hosts(s: Session, ns: Parsed) -> None:
    found = s.call("hostinfo", {"hosts": list(ns.names)} if ns.names else {})["hosts"]
    if ns.resreq:
        found = _select(s, ns.resreq, found, s.call("clusterconf").get("resources", []))
    if ns.as_json:
        emit_json(found)
        return
    rows = [[h["name"], h["state"], h["max_slots"], h["used_slots"], h["attrs"].get("type"),
             h["attrs"].get("ncpus"), h["attrs"].get("maxmem"), h["resvals"].get("r1m"),
             h["resvals"].get("mem"), h.get("comment")] for h in found]
    table(["HOST_NAME", "STATUS", "MAX", "RUN", "TYPE", "NCPUS", "MAXMEM", "r1m", "mem", "COMMENT"], rows)


@command(
    "host", "Open or close a host (admin; like badmin hopen/hclose).",
    arg("action", choices=["open", "close"]),
    arg("host"),
    arg("-C", "--comment", default="", help="why (shown by `xce hosts`)"),
)
def host(s: Session, ns: Parsed) -> None:
    rec = s.call("hostctrl", {"host": ns.host, "action": ns.action, "comment": ns.comment})
    echo(f"Host <{ns.host}>: {ns.action} done (state {rec['state']})")


@command("queues", "List queues (like bqueues).", JSON)
def queues(s: Session, ns: Parsed) -> None:
    info = s.call("queueinfo")
    found = info["queues"]
    counts: dict[str, dict[str, int]] = {}
    for name, by_state in info.get("counts", {}).items():  # the controller's counts: no listing
        c = counts.setdefault(name, {"PEND": 0, "RUN": 0, "SUSP": 0})
        for state, n in by_state.items():
            if state in UNFINISHED:  # UNKWN jobs hold their slots: counted as running
                c["RUN" if state in ("RUN", "UNKWN") else state if state == "PEND" else "SUSP"] += n
    zero = {"PEND": 0, "RUN": 0, "SUSP": 0}
    if ns.as_json:
        emit_json([{**q, **counts.get(q["name"], zero)} for q in found])
        return
    rows = []
    for q in found:
        c = counts.get(q["name"], zero)
        rows.append([q["name"], q["priority"], q["status"], c["PEND"], c["RUN"], c["SUSP"]])
    table(["QUEUE_NAME", "PRIO", "STATUS", "PEND", "RUN", "SUSP"], rows)


@command(
    "queue", "Open, close, activate or inactivate a queue (admin; like badmin qopen/qclose/qact/qinact).",
    arg("action", choices=["open", "close", "activate", "inactivate"]),
    arg("queue"),
)
def queue(s: Session, ns: Parsed) -> None:
    rec = s.call("queuectrl", {"queue": ns.queue, "action": ns.action})
    echo(f"Queue <{ns.queue}>: {ns.action} done ({rec['status']})")


@command(
    "run-job", "Force a pending job to run on named hosts (admin; like brun).",
    arg("jobid", type=int),
    arg("-m", "--hosts", dest="hostlist", required=True, help="host(s) to run on, comma-separated"),
)
def run_job(s: Session, ns: Parsed) -> None:
    names = [h.strip() for h in ns.hostlist.split(",") if h.strip()]
    if not names:
        raise CommandError("run-job: -m: name at least one host")
    rec = s.call("jobinfo", {"jobids": [ns.jobid]})["jobs"]
    if not rec:
        raise CommandError(f"job {ns.jobid} not found")
    ntasks = int(rec[0]["ntasks"])
    share, extra = divmod(ntasks, len(names))
    counts = [share + (1 if i < extra else 0) for i in range(len(names))]
    alloc = [{"host": h, "ntasks": n} for h, n in zip(names, counts, strict=True) if n > 0]
    res = s.call("jobdispatch", {"jobid": ns.jobid, "alloc": alloc, "force": True})
    echo(f"Job <{ns.jobid}> is being forced to run on {', '.join(a['host'] for a in res['alloc'])}.")


@command("status", "Show the controller candidates and which one is primary.", JSON)
def status(s: Session, ns: Parsed) -> None:
    client = s.client()
    st = s.call("status")
    rows = [{"candidate": str(cand), "state": client.probe(cand, timeout=1.0)}
            for cand in client.config.candidates]
    members = st.get("member_list", [])
    if ns.as_json:
        emit_json({"candidates": rows, "primary": st["primary"], "jobs": st["jobs"], "hosts": st["hosts"],
                   "members": st["members"], "member_list": members, "backend": st.get("backend")})
        return
    table(["CANDIDATE", "STATE"], [[r["candidate"], r["state"]] for r in rows], title="controller candidates")
    echo(f"primary {st['primary']} since {when(st['since'])}: {st['jobs']} jobs, {st['hosts']} hosts, "
         f"{st['members']} members joined")
    be = st.get("backend")
    if isinstance(be, dict) and be.get("backend") == "etcd":
        echo(f"backend etcd {','.join(be.get('endpoints', []))} prefix {be.get('prefix')}: lease holder "
             f"{be.get('leader')}, TTL {be.get('lease_ttl')} s ({be.get('lease_left')} s left)")
    elif isinstance(be, dict):
        echo(f"backend {be.get('backend')}")
    # Every member, with the attributes it joined with (a worker's are its host's: xce hosts).
    table(["MEMBER", "ROLE", "JOINED", "LAST SEEN", "PUSHES", "ATTRIBUTES"],
          [[m["identity"], m["role"], when(m.get("joined_at")), when(m.get("last_seen")),
            m.get("pushes"), " ".join(f"{k}={v}" for k, v in sorted((m.get("attrs") or {}).items()))]
           for m in members], title="members")


EVENTS_PAGE = 1000  # the controller's hard cap of one events page
FOLLOW_EVERY = 1.0  # seconds between two looks of --follow


def _event_line(ev: dict[str, Any]) -> str:
    return f"{when(ev.get('time'))}  {ev.get('seq'):>8}  {ev.get('kind', ''):<12}  {ev.get('text', '')}"


@command(
    "events", "Show the cluster's events (promotions, members, hosts, queues, admin actions), "
              "oldest first.",
    arg("-n", dest="count", type=int, default=20, help="the newest N events (default 20; "
        f"1 to {EVENTS_PAGE})"),
    arg("--kind", help="only this kind: promotion, member_join, member_leave, host_state, "
        "queue_state, reconfig, shutdown"),
    arg("--since", metavar="TIME", help="events at or after TIME (12h, 30m, 7d ago; an ISO date "
        "or time; epoch seconds): every one of them, not only the newest N"),
    arg("--follow", "-f", action="store_true", help="then wait for new events and print them "
        "as they come (Ctrl-C ends)"),
    JSON,
)
def events(s: Session, ns: Parsed) -> None:
    if not 1 <= ns.count <= EVENTS_PAGE:
        raise CommandError(f"-n {ns.count}: give 1 to {EVENTS_PAGE}")
    args: dict[str, Any] = {"limit": ns.count, "last": True}
    if ns.kind:
        args["kind"] = ns.kind
    if ns.since:
        args.update(since_time=parse_time(ns.since), limit=EVENTS_PAGE, last=False)
    shown: list[dict[str, Any]] = []
    page = s.call("events", args)
    while True:  # --since: every page after the first, while a full page is waiting
        shown.extend(page["events"])
        if not (ns.since and page["more"]):
            break
        page = s.call("events", {**args, "since_seq": page["next"]})
    if ns.as_json and not ns.follow:
        emit_json(shown)
        return
    for ev in shown:
        echo(emit_line(ev, ns.as_json))
    if not ns.follow:
        if not shown and not ns.as_json:
            echo("no events")
        return
    import time

    cursor = page["next"]
    follow = {k: v for k, v in args.items() if k in ("kind",)}
    try:
        while True:
            time.sleep(FOLLOW_EVERY)
            page = s.call("events", {**follow, "since_seq": cursor, "limit": EVENTS_PAGE})
            for ev in page["events"]:
                echo(emit_line(ev, ns.as_json))
            sys.stdout.flush()
            cursor = page["next"]
    except KeyboardInterrupt:
        return


def emit_line(ev: dict[str, Any], as_json: bool) -> str:
    """One event as one line: aligned text, or (``--json`` with ``--follow``) one JSON object."""
    if as_json:
        import json

        return json.dumps(ev, sort_keys=True, ensure_ascii=False)
    return _event_line(ev)


@command(
    "outcome", "Say what became of a write whose outcome was unknown (by its idempotency key).",
    arg("rid", help="the idempotency key an 'outcome unknown' error named"),
    JSON,
    epilog="Answers applied (with the result), pending (ask again) or not applied. A 'not\n"
           "applied' answer is final: the key can no longer be applied, so submit again if\n"
           "the write is still wanted.",
)
def outcome(s: Session, ns: Parsed) -> int:
    res = s.call("outcome", {"rid": ns.rid})
    if ns.as_json:
        emit_json(res)
    elif res["outcome"] == "applied":
        echo(f"{ns.rid}: applied; result {res['result']}")
    elif res["outcome"] == "pending":
        echo(f"{ns.rid}: pending (being committed now); ask again")
    else:
        echo(f"{ns.rid}: not applied (final: it can no longer be applied)")
    return 0


@command(
    "admin", "Administrator commands (administrators only: [controller] admins, root).",
    arg("action", choices=["shutdown", "reconfig", "revoke-tokens"],
        help="shutdown: shut down the primary controller candidate (a standby takes over); "
             "reconfig: the primary reads its configuration file again (like badmin reconfig); "
             "revoke-tokens USER...: every REST token of each USER issued before now is refused "
             "by every API server (a compromised account; new logons work)"),
    arg("users", nargs="*", help="revoke-tokens: the users"),
)
def admin(s: Session, ns: Parsed) -> None:
    if ns.action != "revoke-tokens" and ns.users:
        raise CommandError(f"admin {ns.action} takes no users")
    if ns.action == "revoke-tokens":
        if not ns.users:
            raise CommandError("admin revoke-tokens: name the user(s) whose tokens to revoke")
        for user in ns.users:
            res = s.call("revoke_tokens", {"target": user})
            echo(f"revoked every token of {user} issued before "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(res['record']['before']))}")
        return
    if ns.action == "shutdown":
        res = s.call("shutdown")
        echo(f"controller {res['server']} is shutting down")
        return
    res = s.call("reconfig")
    echo(f"reconfigured: queues added {', '.join(res['queues_added']) or 'none'}, changed "
         f"{', '.join(res['queues_changed']) or 'none'}")
    if res["restart_needed"]:
        echo(f"changed in the file but applied only at a restart: {', '.join(res['restart_needed'])}")


TASK_ENDED = ("DONE", "EXIT")


@command(
    "task", "Parallel jobs' tasks: launch them from inside a job (like blaunch), or block and "
            "unblock a job's launches.",
    arg("action", choices=["launch", "block", "unblock"]),
    arg("-w", "--wait", dest="wait", type=float, default=60.0, metavar="SECONDS",
        help="launch: how long to wait while the job's launches are blocked (default 60)"),
    arg("words", nargs="...", metavar="ARGS",
        help="launch: HOST [HOST...] -- CMD [ARG...]; block, unblock: JOBID"),
    epilog="xce task launch runs inside a job (it reads XCE_JOBID and XCE_TASK_SECRET): it\n"
           "starts CMD once on each HOST (hosts of the job's allocation, XCE_HOSTS), waits\n"
           "for every task and exits with the worst exit status. The tasks write to the\n"
           "job's output and error files. While the job's launches are blocked it waits\n"
           "(--wait), then fails saying so.",
)
def task(s: Session, ns: Parsed) -> int:
    words: list[str] = list(ns.words)
    if ns.action != "launch":
        if len(words) != 1 or not words[0].isdigit():
            raise CommandError(f"task {ns.action}: name one job id")
        rec = s.call("task_block", {"jobid": int(words[0]), "action": ns.action})
        echo(f"Job <{rec['jobid']}>: task launches {ns.action}ed")
        return 0
    if "--" not in words:
        raise CommandError("task launch: HOST [HOST...] -- CMD [ARG...]: the '--' is missing")
    cut = words.index("--")
    hosts, argv = words[:cut], words[cut + 1:]
    if not hosts or not argv:
        raise CommandError("task launch: name at least one host before '--' and a command after")
    import os
    import shlex

    jobid, secret = os.environ.get("XCE_JOBID", ""), os.environ.get("XCE_TASK_SECRET", "")
    if not jobid.isdigit() or not secret:
        raise CommandError("task launch runs inside a job of several tasks: XCE_JOBID and "
                           "XCE_TASK_SECRET are not set")
    body = {"jobid": int(jobid), "hosts": hosts, "secret": secret,
            "command": argv[0] if len(argv) == 1 else shlex.join(argv)}
    ids = _launch(s, body, ns.wait)
    return _await_tasks(s, int(jobid), ids)


def _launch(s: Session, body: dict[str, Any], wait: float) -> list[int]:
    import time

    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            return list(s.call("task_launch", body)["tasks"])
        except CommandError as exc:
            if not exc.data.get("blocked"):
                raise
            if not told:
                told = True
                echo(f"xce task launch: job {body['jobid']}'s task launches are blocked; "
                     f"waiting up to {wait:g} s", err=True)
            if time.monotonic() >= deadline:
                raise CommandError(f"task launch: job {body['jobid']}'s task launches stayed "
                                   f"blocked for {wait:g} s (xce task unblock {body['jobid']}); "
                                   "nothing launched") from None
            time.sleep(0.2)  # asking again: the controller has no "unblocked" push for users


def _await_tasks(s: Session, jobid: int, ids: list[int]) -> int:
    """Poll the job's record until the tasks ``ids`` ended; the worst exit status."""
    import time

    mine = set(ids)
    interval = 0.02
    while True:
        found = s.call("jobinfo", {"jobids": [jobid]})["jobs"]
        job = found[0] if found else {}
        recs = [r for r in (job.get("tasks") or {}).get("list", ()) if r.get("task") in mine]
        if len(recs) == len(mine) and all(r.get("state") in TASK_ENDED for r in recs):
            break
        if not found:
            raise CommandError(f"task launch: job {jobid} is gone")
        time.sleep(interval)
        interval = min(0.5, interval * 1.5)
    worst = 0
    for r in sorted(recs, key=lambda r: r["task"]):
        code = r.get("exit_status")
        if r.get("reason"):
            echo(f"xce task launch: task {r['task']} on {r['host']}: {r['reason']}", err=True)
        worst = max(worst, code if isinstance(code, int) else 1)
    return worst
