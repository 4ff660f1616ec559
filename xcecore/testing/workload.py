"""Client load for the fault test bed: recorded writers and an observer of job states.

Writers are threads, each with its own blocking client, writing one operation at a time
(BENCHMARKS.md's method): submissions of short jobs (half of them to an inactive queue, so the
writes stay many while the workers keep up), some long jobs killed at once (the kill is an
acknowledged state change), some reads. Every operation goes through
:class:`~xcecore.testing.checker.History`, with the idempotency key (``rid``) the writer gives
it. A write not answered within the writer's deadline is unknown (``OutcomeUnknown``); the
writer goes on with new writes, and :func:`resolve_unknown` asks the controller what became
of each unknown one at the end (``outcome(rid)``).

The observer is a client joined as a third-party role, which receives every push: it records
each job's (attempt, state) as it changes, for the checker's state-history check.

Each job writes a run marker (``$XCE_JOBID $XCE_ATTEMPT``) to ``$XCE_BED_RUNS``, which the bed
sets in each worker's environment to a file on its host.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from loguru import logger

from xcecore import wire
from xcecore.testing.checker import FAILED, UNKNOWN, History, Op

RUNS_ENV = "XCE_BED_RUNS"
MARK = f'echo "$XCE_JOBID $XCE_ATTEMPT" >> "${RUNS_ENV}"'
DEFINITE = frozenset({"INVALID", "NOT_FOUND", "DENIED", "CONFLICT", "STORAGE"})
"""Error codes that say the write was not applied: refused before applying anything, or
(STORAGE) rolled back because the store could not commit it."""


def classify(exc: BaseException) -> tuple[str, str | None]:
    """(outcome, rid) of a failed call: FAILED (surely not applied) or UNKNOWN.

    - an error reply with a code in :data:`DEFINITE`: refused before applying -> FAILED;
    - ``BackendUnavailable``: the client never sent it (or no primary took it) -> FAILED;
    - ``OutcomeUnknown``: sent, never answered -> UNKNOWN, with its ``rid``;
    - anything else (another error reply, the client closed under the call) -> UNKNOWN.
    """
    from xcecore.client import BackendUnavailable, OutcomeUnknown

    if isinstance(exc, OutcomeUnknown):
        return UNKNOWN, exc.rid
    if isinstance(exc, wire.RemoteError):
        return (FAILED if exc.code in DEFINITE else UNKNOWN), None
    if isinstance(exc, BackendUnavailable):
        return FAILED, None
    return UNKNOWN, None


ClientFactory = Callable[[str], AbstractContextManager[Any]]
"""name -> a context manager giving a connected SyncClient (e.g. ``bed.client``)."""


class Writers:
    """``n`` sequential writers on threads; :meth:`stop` ends them and waits."""

    def __init__(self, history: History, open_client: ClientFactory, n: int, *, seed: int,
                 gap: float = 0.02, long_every: int = 5,
                 read_every: int = 7, job_seconds: float = 0.1,
                 parked_queue: str | None = None, deadline: float | None = 3.0) -> None:
        self.history, self.open_client, self.n = history, open_client, n
        self.seed, self.gap = seed, gap  # (jobs belong to the writers' authenticated user)
        self.parked_queue = parked_queue
        self.deadline = deadline  # a write not answered by then is unknown; the writer goes on
        self.long_every, self.read_every, self.job_seconds = long_every, read_every, job_seconds
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._clients: list[Any] = []

    def start(self) -> None:
        """Start every writer (each connects first)."""
        for k in range(self.n):
            t = threading.Thread(target=self._run, args=(k,), name=f"writer-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        name = f"w{k}"
        try:
            with self.open_client(name) as client:
                self._clients.append(client)
                n = 0
                while not self.stopping.is_set():
                    n += 1
                    if n % self.read_every == 0:
                        self._read(client, name)
                    elif n % self.long_every == 0:
                        jobid = self._submit(client, name, f"{name}-{n}", "sleep 30")
                        if jobid is not None and not self.stopping.is_set():
                            self._call(client, name, "kill", f"kill:{jobid}", "jobctrl",
                                       {"jobid": jobid, "action": "kill"}, jobid)
                    else:
                        seconds = round(rng.uniform(0, self.job_seconds), 3)
                        parked = self.parked_queue if n % 2 else None
                        self._submit(client, name, f"{name}-{n}", f"sleep {seconds}", parked)
                    self.stopping.wait(self.gap)
        except BaseException as exc:  # a writer that dies is a finding, not a hang
            logger.opt(exception=True).error("workload: writer {} died", name)
            self.errors.append(exc)

    def _submit(self, client: Any, who: str, key: str, command: str,
                queue: str | None = None) -> int | None:
        args = {"command": f"{MARK}; {command}", "name": key}
        if queue is not None:
            args["queue"] = queue
        result = self._call(client, who, "submit", key, "jobsubmit", args)
        return result.get("jobid") if isinstance(result, dict) else None

    def _read(self, client: Any, who: str) -> None:
        self._call(client, who, "read", "jobinfo", "jobinfo", {"limit": 1})

    def _call(self, client: Any, who: str, kind: str, key: str, op: str, args: dict[str, Any],
              jobid: int | None = None) -> Any:
        rec: Op = self.history.invoke(who, kind, key, jobid)
        rec.rid = f"bed-{self.seed}-{key}" if kind != "read" else None  # keys are unique per run
        try:
            result = client.call(op, args, deadline=self.deadline, rid=rec.rid)
        except BaseException as exc:
            outcome, rid = classify(exc)
            self.history.fail(rec, outcome, f"{type(exc).__name__}: {exc}", rid)
            if not isinstance(exc, Exception):
                raise
            return None
        self.history.ok(rec, result, str(client.client.candidate) if client.client.candidate else None)
        return result

    def stop(self, timeout: float = 60.0) -> None:
        """Stop writing; wait ``timeout`` for calls in flight, then close their clients (a call
        still waiting is recorded as unknown by its writer)."""
        self.stopping.set()
        for t in self._threads:
            t.join(timeout)
        for client in self._clients:
            if any(t.is_alive() for t in self._threads):
                with contextlib.suppress(Exception):
                    client.close()
        for t in self._threads:
            t.join(10)


def all_jobs(c: Any, args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every job ``jobinfo`` with ``args`` lists, page after page (the listing is paged)."""
    found: list[dict[str, Any]] = []
    page_args: dict[str, Any] = {**(args or {}), "limit": 1000}
    while True:
        page = c.call("jobinfo", page_args, deadline=30)
        found += page["jobs"]
        if page["next"] is None:
            return found
        page_args["cursor"] = page["next"]


def resolve_unknown(history: History, client: Any, deadline: float = 10.0) -> int:
    """Ask the controller (``outcome(rid)``) what became of every unknown write; how many
    were resolved. "not applied" is final (the key can no longer be applied)."""
    n = 0
    for op in history.snapshot():
        if op.outcome != UNKNOWN or op.rid is None or op.kind == "read":
            continue
        answer = client.outcome(op.rid, deadline=deadline)
        if answer.get("outcome") in ("applied", "not_applied"):
            op.resolved = answer["outcome"]
            n += 1
    return n


class Observer:
    """Client hooks of a third-party role: every job's (attempt, state) as pushes show it."""

    def __init__(self) -> None:
        self.seen: dict[int, list[tuple[int, str]]] = {}
        self._lock = threading.Lock()

    def reconnected(self, client: Any, candidate: Any) -> None:
        """Re-join after a failover (the heartbeat re-joins an idle client)."""
        client.mark_rejoin_pending()

    def connection_state(self, client: Any, state: str, candidate: Any, detail: str) -> None:
        """Not needed."""

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> None:
        """Record job states from ``job`` pushes and the jobs of a sync's frames."""
        if event == "job" and isinstance(data, dict):
            self._job(data)
        elif event == "sync_records" and isinstance(data, dict) and data.get("kind") == "jobs":
            for job in data.get("items", []):
                self._job(job)

    def _job(self, job: dict[str, Any]) -> None:
        obs = (int(job.get("attempt", 0)), str(job.get("state")))
        with self._lock:
            history = self.seen.setdefault(int(job["jobid"]), [])
            if not history or history[-1] != obs:
                history.append(obs)

    def snapshot(self) -> dict[int, list[tuple[int, str]]]:
        """A copy of what was seen."""
        with self._lock:
            return {k: list(v) for k, v in self.seen.items()}


@contextlib.contextmanager
def observing(open_client: Callable[..., AbstractContextManager[Any]], role: str = "checker"
              ) -> Iterator[tuple[Observer, Any]]:
    """``with observing(factory) as (observer, client):`` an observer joined as ``role``.

    ``open_client(role, hooks)`` must give a connected SyncClient built with those hooks.
    """
    obs = Observer()
    with open_client(role, obs) as client:
        client.join(deadline=30)
        yield obs, client
