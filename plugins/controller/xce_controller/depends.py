"""Job dependencies in the controller state: compiled once, re-evaluated only when a job they
name changes.

A submission's ``depend`` (LSF ``-w``, Slurm ``--dependency``: :mod:`xcecore.depspec`) is
parsed at submission, its job names resolved to the submitter's jobs of that name (so the
stored expression names ids only and means the same after a restart), every id checked, and
kept in the submission as that canonical text. While it does not hold, the job's ``waiting``
says which part holds it up -- "dependency not satisfied: done(12)" -- and the scheduler
leaves the job alone (``jobdispatch`` refuses it unless forced). :class:`Deps` keeps the
compiled expressions of waiting jobs and an index from each job they name (an array element
is watched through its array, whose record every element change writes) to its dependents;
a change of a job re-evaluates its dependents and nothing else. One that can never hold
("dependency never satisfied: ...") stays pending with that reason, or, with ``[controller]
kill_unsatisfiable``, ends EXIT with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from xce_controller.jobs import Job, JobTable
from xcecore import depspec
from xcecore.depspec import DepError, Facts, Node, Ref, Term
from xcecore.protocol import PENDING
from xcecore.wire import ErrorCode, RemoteError

NOT_YET = "dependency not satisfied: "
NEVER = "dependency never satisfied: "


class ClusterState(Protocol):
    """What this module uses of :class:`xce_controller.state.ClusterState`."""

    jobs: JobTable
    deps: Deps

    @property
    def kill_unsatisfiable(self) -> bool: ...

    def job_changed(self, ch: Any, job: Job, was: str, extra_hosts: Iterable[str] = ()) -> None: ...


def _invalid(message: str) -> RemoteError:
    return RemoteError(ErrorCode.INVALID, f"jobsubmit: {message}", {"arg": "depend"})


def compile_submitted(jobs: JobTable, user: str, text: str) -> str:
    """The canonical, id-only text of a submission's ``depend`` (INVALID when malformed or
    naming a job or element that does not exist)."""
    try:
        node = depspec.parse(text)
        node = _resolve(jobs, user, node)
        if sum(1 for _ in depspec.terms(node)) > depspec.TERMS_MAX:
            raise DepError(f"dependency: its job names stand for more than {depspec.TERMS_MAX} jobs")
    except DepError as exc:
        raise _invalid(str(exc)) from None
    return depspec.text(node)


def _resolve(jobs: JobTable, user: str, node: Node) -> Node:
    if isinstance(node, depspec.Not):
        return depspec.Not(_resolve(jobs, user, node.arg))
    if isinstance(node, depspec.All | depspec.Any_):
        return type(node)(tuple(_resolve(jobs, user, a) for a in node.args))
    ref = node.ref
    if ref.name is not None:  # the submitter's jobs of that name, all of them
        named = jobs.by_name.get(ref.name)
        ids = [j for j in named or () if jobs[j].user == user and jobs[j].array_of() is None]
        if not ids:
            raise DepError(f"dependency {node.text()}: you have no job named {ref.name!r}")
        terms = tuple(Term(node.kind, Ref(j), node.op, node.code) for j in ids[:depspec.TERMS_MAX + 1])
        return terms[0] if len(terms) == 1 else depspec.All(terms)
    assert ref.jobid is not None
    job = jobs.get(ref.jobid)
    if job is None:
        raise DepError(f"dependency {node.text()}: no such job: {ref.jobid}")
    if ref.element is not None:
        a = job.array
        if a is None or "of" in a:
            raise DepError(f"dependency {node.text()}: job {ref.jobid} is not an array")
        from xcecore.arrayspec import Ranges

        if (ref.jobid, ref.element) not in jobs.elements and ref.element not in Ranges(a["pending"]):
            raise DepError(f"dependency {node.text()}: array {ref.jobid} has no index {ref.element}")
    return node


def facts(jobs: JobTable, term: Term) -> Facts | None:
    """What a term's job (or array element) is now; None for one that is gone."""
    ref = term.ref
    if ref.jobid is None:
        return None
    if ref.element is not None:
        eid = jobs.elements.get((ref.jobid, ref.element))
        if eid is None:  # still a pending index of its array (or the array is gone)
            return Facts("PEND") if ref.jobid in jobs else None
        job = jobs.get(eid)
    else:
        job = jobs.get(ref.jobid)
    return None if job is None else Facts(job.state, job.exit_status)


class Deps:
    """Compiled expressions of the jobs that wait, and who waits on whom."""

    def __init__(self) -> None:
        self.compiled: dict[int, Node] = {}
        self.watchers: dict[int, set[int]] = {}  # job named -> jobs waiting on it

    def __len__(self) -> int:
        return len(self.compiled)

    def add(self, jobid: int, node: Node) -> None:
        self.compiled[jobid] = node
        for term in depspec.terms(node):
            if term.ref.jobid is not None:
                self.watchers.setdefault(term.ref.jobid, set()).add(jobid)

    def watch(self, jobid: int, text: str) -> None:
        """Watch for a job whose dependency is ``text`` (a canonical, checked one)."""
        self.add(jobid, depspec.parse(text))

    def drop(self, jobid: int) -> None:
        node = self.compiled.pop(jobid, None)
        if node is None:
            return
        for term in depspec.terms(node):
            ids = self.watchers.get(term.ref.jobid) if term.ref.jobid is not None else None
            if ids is not None:
                ids.discard(jobid)
                if not ids:
                    del self.watchers[term.ref.jobid]  # type: ignore[arg-type]

    def follow(self, job: Job) -> None:
        """A job taken from the store or the primary: watch again what it waits on."""
        self.drop(job.jobid)
        if job.waiting is not None and job.state in PENDING:
            text = orjson.loads(job._spec).get("depend")
            if isinstance(text, str):
                self.watch(job.jobid, text)


def settle(st: ClusterState, ch: Any, job: Job) -> None:
    """Evaluate ``job``'s dependency (compiled in ``st.deps``): clear ``waiting`` when it holds,
    say which part holds it up, or end it when it never can and the cluster says so."""
    node = st.deps.compiled.get(job.jobid)
    if node is None or job.state not in PENDING:
        st.deps.drop(job.jobid)
        return
    tbl = st.jobs

    def lookup(term: Term) -> Facts | None:
        return facts(tbl, term)
    verdict = depspec.evaluate(node, lookup)
    keys, was = tbl.keys(job), job.state
    if verdict == depspec.TRUE:
        st.deps.drop(job.jobid)
        waiting = None
    else:
        part = depspec.blocking(node, lookup)
        waiting = (NEVER if verdict == depspec.NEVER else NOT_YET) + (
            depspec.text(part) if part is not None else depspec.text(node))
        if verdict == depspec.NEVER:
            st.deps.drop(job.jobid)
            if st.kill_unsatisfiable:
                job.state, job.reason, job.pend_reason = "EXIT", waiting, None
                a = job.array
                if a is not None and "of" not in a and a["left"]:  # an array: its pending end too
                    a["counts"]["EXIT"] = a["counts"].get("EXIT", 0) + a["left"]
                    a["pending"].clear()
                    a["left"] = 0
                # The time the dependency became unsatisfiable: the latest end it names.
                job.end_time = max([j.end_time or 0.0 for j in _named(tbl, node)],
                                   default=0.0) or job.submit_time
    if waiting == job.waiting and job.state == was:
        return
    job.waiting = waiting
    tbl.reindex(job, keys)
    st.job_changed(ch, job, was)


def _named(tbl: JobTable, node: Node) -> list[Job]:
    out = []
    for term in depspec.terms(node):
        job = tbl.get(term.ref.jobid) if term.ref.jobid is not None else None
        if job is not None:
            out.append(job)
    return out


def job_changed(st: ClusterState, ch: Any, job: Job) -> None:
    """``job`` changed: re-evaluate the jobs that wait on it (only those)."""
    for dependent in sorted(st.deps.watchers.get(job.jobid, ())):
        other = st.jobs.get(dependent)
        if other is None:
            st.deps.drop(dependent)
        else:
            settle(st, ch, other)
