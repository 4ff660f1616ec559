"""The checker: what every client saw, checked against what the cluster holds at the end.

Every client operation is recorded (:class:`History`): invoked, then ok, failed or unknown,
with the job name that is its own idempotency key (each write submits a uniquely named job or
controls one job) and the client's ``rid`` when the client reports it. :func:`check` then
verifies, from the final state and the evidence the cluster left:

- **no acknowledged write lost**: every acknowledged submission is a job, with the jobid it
  was acknowledged with; every acknowledged kill left its job not DONE;
- **none applied twice**: no two jobs carry one submission's name (an unknown write may be
  there once or not at all, never twice; once the controller said what became of it, through
  ``outcome(rid)``, it must be there if "applied" and absent if "not applied");
- **refused writes absent**: a write the controller refused (INVALID, CONFLICT, ...) is not
  applied;
- **no job run twice**: the run markers the jobs wrote (one line per run, on whichever host
  ran it) hold each (jobid, attempt) at most once;
- **legal state histories**: the states each job was seen in (pushes to an observer, then the
  final state) follow the job state machine, per attempt: PEND/PSUSP, then RUN/USUSP/SSUSP/UNKWN,
  then DONE or EXIT, never back; a new attempt only by requeue;
- **one primary at a time**: no candidate acknowledged a write invoked after another
  candidate's later promotion (promotion times from the candidates' logs), i.e. a fenced or
  replaced primary never acknowledged;
- **every role re-joined**: each expected member is joined to the final primary.

Times are ``time.time()`` of this machine (clients, controllers and logs share one clock).
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOKED, OK, FAILED, UNKNOWN = "invoked", "ok", "failed", "unknown"
RANK = {"PEND": 0, "PSUSP": 0, "RUN": 1, "USUSP": 1, "SSUSP": 1, "UNKWN": 1, "DONE": 2, "EXIT": 2}
LOG_SLACK = 0.002  # log times are truncated to the millisecond
# A line starts with an ISO 8601 time (xcecore.log), or, in logs of older versions, the local
# time of day only.
_PROMOTED = re.compile(r"^(?:(\d{4}-\d\d-\d\dT\S+)|(\d\d):(\d\d):(\d\d\.\d{3})) .*controller (\S+): "
                       r"acquired the state-dir lock; promoted to primary")


@dataclass
class Op:
    """One client operation and what became of it."""

    client: str
    kind: str  # "submit", "kill", "read"
    key: str  # the submission's job name, or "kill:<jobid>"
    invoked: float
    rid: str | None = None
    outcome: str = INVOKED
    completed: float | None = None
    server: str | None = None  # the candidate that acknowledged it
    result: Any = None
    error: str | None = None
    jobid: int | None = None
    resolved: str | None = None  # an unknown write's fate, asked afterwards: applied, not_applied


class History:
    """Thread-safe record of every operation, in invocation order."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def invoke(self, client: str, kind: str, key: str, jobid: int | None = None) -> Op:
        """Record an operation about to be sent."""
        op = Op(client, kind, key, time.time(), jobid=jobid)
        with self._lock:
            self.ops.append(op)
        return op

    def ok(self, op: Op, result: Any, server: str | None) -> None:
        """The operation was acknowledged by ``server``."""
        op.outcome, op.result, op.server, op.completed = OK, result, server, time.time()

    def fail(self, op: Op, outcome: str, error: str, rid: str | None = None) -> None:
        """The operation failed: ``outcome`` FAILED (refused, not applied) or UNKNOWN."""
        op.outcome, op.error, op.completed = outcome, error, time.time()
        op.rid = rid or op.rid

    def snapshot(self) -> list[Op]:
        """The operations so far."""
        with self._lock:
            return list(self.ops)

    def counts(self) -> dict[str, int]:
        """How many operations ended each way."""
        return dict(Counter(op.outcome for op in self.snapshot()))


@dataclass
class Verdict:
    """The checker's findings: ``ok`` when no property is violated."""

    violations: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was violated."""
        return not any(self.violations.values())

    def add(self, prop: str, what: str) -> None:
        """Record a violation of ``prop``."""
        self.violations.setdefault(prop, []).append(what)

    def summary(self) -> str:
        """One paragraph for a test failure or a benchmark report."""
        head = "checker: OK" if self.ok else "checker: VIOLATIONS"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        lines = [f"{head} ({counts})"]
        for prop, items in sorted(self.violations.items()):
            if items:
                lines.append(f"  {prop}: {len(items)}: " + "; ".join(items[:10])
                             + (" ..." if len(items) > 10 else ""))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """For result files."""
        return {"ok": self.ok, "counts": self.counts,
                "violations": {k: v for k, v in self.violations.items() if v},
                "notes": self.notes}


PROPERTIES = ("acknowledged write lost", "applied twice", "refused write applied",
              "job run twice", "illegal state history", "two primaries acknowledging",
              "role not re-joined")


def check(ops: Iterable[Op], jobs: Iterable[Mapping[str, Any]], *,
          runs: Iterable[tuple[int, int, str]] = (),
          seen: Mapping[int, list[tuple[int, str]]] | None = None,
          promotions: Iterable[tuple[float, str]] = (),
          expected_members: Iterable[str] = (),
          members: Iterable[str] = ()) -> Verdict:
    """Check a run; see the module docstring for each property.

    ``jobs``: every job of the final state; ``runs``: (jobid, attempt, host) per run marker;
    ``seen``: jobid -> the (attempt, state) observations in arrival order; ``promotions``:
    (time, address) of every promotion; ``members``: identities joined to the final primary.
    """
    v = Verdict(violations={p: [] for p in PROPERTIES})
    ops = list(ops)
    jobs = list(jobs)
    v.counts = dict(Counter(op.outcome for op in ops))
    v.counts.update(Counter(f"unknown, then {op.resolved}" for op in ops if op.resolved))
    v.counts["jobs"] = len(jobs)
    by_name: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    by_id = {int(j["jobid"]): j for j in jobs}
    for j in jobs:
        by_name[str(j.get("name", ""))].append(j)
    _check_submissions(v, ops, by_name)
    _check_kills(v, ops, by_id)
    _check_runs(v, list(runs))
    _check_histories(v, seen or {}, by_id)
    _check_primaries(v, ops, sorted(promotions))
    missing = sorted(set(expected_members) - set(members))
    for m in missing:
        v.add("role not re-joined", f"{m} is not joined to the final primary")
    return v


def _check_submissions(v: Verdict, ops: list[Op], by_name: Mapping[str, list[Mapping[str, Any]]]) -> None:
    for op in ops:
        if op.kind != "submit":
            continue
        found = by_name.get(op.key, [])
        if len(found) > 1:
            v.add("applied twice", f"{op.key}: jobs {sorted(j['jobid'] for j in found)}")
        if op.outcome == OK:
            jobid = op.result.get("jobid") if isinstance(op.result, dict) else None
            if not found:
                v.add("acknowledged write lost", f"{op.key} (acknowledged as job {jobid} by {op.server})")
            elif jobid is not None and all(j["jobid"] != jobid for j in found):
                v.add("acknowledged write lost", f"{op.key}: acknowledged as job {jobid}, "
                      f"found as {[j['jobid'] for j in found]}")
        elif op.outcome == FAILED and found:
            v.add("refused write applied", f"{op.key} ({op.error}) is job {found[0]['jobid']}")
        elif op.outcome == UNKNOWN and op.resolved == "applied" and not found:
            v.add("acknowledged write lost", f"{op.key}: outcome({op.rid}) said applied, yet it is gone")
        elif op.outcome == UNKNOWN and op.resolved == "not_applied" and found:
            v.add("refused write applied", f"{op.key}: outcome({op.rid}) said not applied, yet it is "
                  f"job {found[0]['jobid']}")


def _check_kills(v: Verdict, ops: list[Op], by_id: Mapping[int, Mapping[str, Any]]) -> None:
    for op in ops:
        if op.kind != "kill" or op.outcome != OK or op.jobid is None:
            continue
        job = by_id.get(op.jobid)
        if job is None:
            v.add("acknowledged write lost", f"{op.key}: job {op.jobid} is gone")
        elif job["state"] == "DONE" and (op.result or {}).get("attempt", 0) == job.get("attempt", 0):
            v.add("acknowledged write lost", f"{op.key}: job {op.jobid} was killed (acknowledged "
                  f"by {op.server}) yet ended DONE")


def _check_runs(v: Verdict, runs: list[tuple[int, int, str]]) -> None:
    where: dict[tuple[int, int], list[str]] = defaultdict(list)
    for jobid, attempt, host in runs:
        where[(jobid, attempt)].append(host)
    for (jobid, attempt), hosts in sorted(where.items()):
        if len(hosts) > 1:
            v.add("job run twice", f"job {jobid} attempt {attempt} ran {len(hosts)} times (on {', '.join(hosts)})")


def _check_histories(v: Verdict, seen: Mapping[int, list[tuple[int, str]]],
                     by_id: Mapping[int, Mapping[str, Any]]) -> None:
    for jobid in sorted(set(seen) | set(by_id)):
        history = list(seen.get(jobid, []))
        final = by_id.get(jobid)
        if final is not None:
            history.append((int(final.get("attempt", 0)), str(final["state"])))
        why = illegal(history)
        if why:
            v.add("illegal state history", f"job {jobid}: {why} in {history}")


def illegal(history: list[tuple[int, str]]) -> str | None:
    """Why this sequence of (attempt, state) observations is impossible, or None.

    Observations may skip states (a member that re-joins sees only the current state).
    """
    for (a0, s0), (a1, s1) in itertools.pairwise(history):
        if s0 not in RANK or s1 not in RANK:
            return f"unknown state {s0 if s0 not in RANK else s1}"
        if a1 < a0:
            return f"attempt went back from {a0} to {a1}"
        if a1 > a0:
            continue  # requeued: the new attempt starts over
        if RANK[s1] < RANK[s0]:
            return f"{s0} -> {s1} within attempt {a0}"
        if RANK[s0] == 2 and s1 != s0:
            return f"finished {s0} then {s1}"
    return None


def _check_primaries(v: Verdict, ops: list[Op], promotions: list[tuple[float, str]]) -> None:
    acked = [op for op in ops if op.outcome == OK and op.kind != "read" and op.server]
    if acked and not promotions:
        v.add("two primaries acknowledging", "no promotion found in the candidates' logs: "
              "cannot check which candidate was primary when")
        return
    for op in acked:
        assert op.completed is not None
        mine = [t for t, addr in promotions if addr == op.server and t <= op.completed + LOG_SLACK]
        if not mine:
            v.add("two primaries acknowledging", f"{op.key} acknowledged by {op.server}, which "
                  "had not been promoted")
            continue
        since = max(mine)
        later = [(t, addr) for t, addr in promotions
                 if addr != op.server and since < t < op.invoked - LOG_SLACK]
        if later:
            t, addr = later[0]
            v.add("two primaries acknowledging",
                  f"{op.key} acknowledged by {op.server} (primary since {_hms(since)}) though "
                  f"invoked at {_hms(op.invoked)}, after {addr} was promoted at {_hms(t)}")


def _hms(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


# -- evidence the cluster leaves -------------------------------------------------------------

def promotions_in_logs(logs: Iterable[Path], near: float | None = None) -> list[tuple[float, str]]:
    """(time, address) of every "promoted to primary" line in the candidates' logs.

    A line with an ISO 8601 time is taken as is; one with the local time of day only (older
    logs) is put on the day nearest ``near``.
    """
    near = time.time() if near is None else near
    out = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = _PROMOTED.match(line)
            if m is None:
                continue
            if m.group(1):
                out.append((dt.datetime.fromisoformat(m.group(1)).timestamp(), m.group(5)))
                continue
            base = dt.datetime.fromtimestamp(near).replace(hour=int(m.group(2)), minute=int(m.group(3)),
                                                           second=0, microsecond=0)
            t = base.timestamp() + float(m.group(4))
            for shift in (-86400.0, 86400.0):
                if abs(t + shift - near) < abs(t - near):
                    t += shift
            out.append((t, m.group(5)))
    return sorted(out)


def runs_in(markers: Mapping[str, Path]) -> list[tuple[int, int, str]]:
    """(jobid, attempt, host) from each host's run-marker file (``"JOBID ATTEMPT"`` lines)."""
    out = []
    for host, path in markers.items():
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                out.append((int(parts[0]), int(parts[1]), host))
    return out
