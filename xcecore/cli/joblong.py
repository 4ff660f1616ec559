"""``xce jobs -l``: one job record in long form, like ``bjobs -l`` / ``scontrol show job``.

A pure function of the record (the controller's job fields and the submission's, as
``jobinfo`` returns them): who, what, where, when, how it ended and why, its limits and its
usage. Fields a record lacks are left out, so records of older controllers print too.
Imports nothing heavy (the one-shot commands load it).
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

MB = 1 << 20


def _when(epoch: Any) -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(epoch))


def _mem(nbytes: int) -> str:
    from xcecore.jobspec import format_mem

    return format_mem(nbytes)


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def long_format(job: dict[str, Any], now: float | None = None) -> str:
    """The lines of one job's long listing (no trailing newline)."""
    def j(key: str, default: Any = None) -> Any:
        return job.get(key, default)

    head = [f"Job <{j('jobid')}>"]
    if j("name"):
        head.append(f"Job Name <{j('name')}>")
    head += [f"User <{j('user')}>", f"Project <{j('project', 'default')}>",
             f"Status <{j('state')}>", f"Queue <{j('queue')}>"]
    if j("attempt"):
        head.append(f"Attempt <{j('attempt')}>")
    lines = [", ".join(head), f"  Command <{j('command', '')}>"]
    if j("cwd"):
        lines.append(f"  Working directory <{j('cwd')}>")
    ask = [f"{j('ntasks', 1)} task(s)"]
    if j("resreq"):
        ask.append(f"requirement <{j('resreq')}>")
    if j("exclusive"):
        ask.append("exclusive hosts")
    lines.append("  Requested: " + ", ".join(ask))
    limits = []
    if j("mem_limit"):
        limits.append(f"memory {_mem(int(j('mem_limit')))}")
    if j("run_limit"):
        limits.append(f"run time {_duration(float(j('run_limit')))}")
    if limits:
        lines.append("  Limits: " + ", ".join(limits))
    files = [f"{k} <{j(k)}>" for k in ("stdin", "stdout", "stderr") if j(k)]
    if files:
        lines.append("  Files: " + ", ".join(files))
    lines.append(f"  {_when(j('submit_time'))}: Submitted")
    state = j("state")
    if state in ("PEND", "PSUSP") and j("pend_reason"):
        lines.append(f"  Pending reason: {j('pend_reason')}")
    hosts = " ".join(f"{a['ntasks']}*{a['host']}" if a.get("ntasks", 1) > 1 else str(a["host"])
                     for a in j("alloc") or ())
    if hosts:
        pid = f", pid {j('pid')}" if j("pid") else ""
        started = _when(j("start_time")) if j("start_time") else "(start not yet reported)"
        lines.append(f"  {started}: Dispatched to <{hosts}>{pid}")
    if state == "UNKWN" and j("lost_at"):
        lines.append(f"  {_when(j('lost_at'))}: Host unavail: status UNKNOWN (was "
                     f"{j('lost_from') or 'RUN'}) until its worker re-joins")
    if j("end_time") and state in ("DONE", "EXIT"):
        ran = ""
        if j("start_time"):
            ran = f" after {_duration(float(j('end_time')) - float(j('start_time')))}"
        how = "Done successfully" if state == "DONE" else "Exited"
        status = f" with exit status {j('exit_status')}" if j("exit_status") is not None else ""
        lines.append(f"  {_when(j('end_time'))}: {how}{status}{ran}")
    if j("reason") and state != "DONE":
        lines.append(f"  Reason: {j('reason')}")
    if j("signal") and state not in ("DONE", "EXIT"):
        lines.append(f"  Signal pending: {j('signal')}")
    lines += _tasks(j("tasks"))
    usage = j("usage") or {}
    if usage:
        parts = []
        if "cputime" in usage:
            parts.append(f"CPU time {usage['cputime']:.2f} s (user {usage.get('utime', 0):.2f}"
                         f", system {usage.get('stime', 0):.2f})")
        if "max_mem" in usage:
            parts.append(f"peak memory {usage['max_mem']:.1f} MB")
        if "mem" in usage and state not in ("DONE", "EXIT"):
            parts.append(f"memory now {usage['mem']:.1f} MB")
        if "swap" in usage:
            parts.append(f"swap {usage['swap']:.1f} MB")
        if "nprocs" in usage and state not in ("DONE", "EXIT"):
            parts.append(f"{usage['nprocs']} process(es)")
        if parts:
            lines.append("  Usage: " + ", ".join(parts))
    return "\n".join(lines)


def _tasks(tasks: Any) -> list[str]:
    """A parallel job's launched tasks (``xce task launch``), one line each."""
    if not isinstance(tasks, dict):
        return []
    recs = [r for r in tasks.get("list") or () if isinstance(r, dict)]
    out = []
    if recs or tasks.get("blocked"):
        out.append(f"  Tasks: {len(recs)} launched" + (", launches blocked" if tasks.get("blocked")
                                                      else ""))
    for r in recs:
        parts = [f"    task {r.get('task')} on <{r.get('host')}>: {r.get('state')}"]
        if r.get("pid"):
            parts.append(f"pid {r['pid']}")
        if r.get("start_time"):
            parts.append(f"started {_when(r['start_time'])}")
        if r.get("end_time"):
            parts.append(f"ended {_when(r['end_time'])}")
        if r.get("exit_status") is not None:
            parts.append(f"exit status {r['exit_status']}")
        if r.get("reason"):
            parts.append(r["reason"])
        out.append(", ".join(parts))
    return out
