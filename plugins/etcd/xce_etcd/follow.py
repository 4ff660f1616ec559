"""A hot standby's follow on etcd: a watch on the cluster's prefix, and the Delta it makes.

Why a watch (``/v3/watch``, a stream over the JSON gateway) and not range reads with
``min_mod_revision``: a removal is a key *deleted* in etcd, and a range read never shows a
key that is gone (the file store keeps removal records for that; here they would cost an
operation per removal in every transaction). A watch gives every put and delete in revision
order, from any revision etcd still keeps, and says so when that revision was compacted
away: then the standby loads again.

:class:`Watcher` (one thread) keeps a watch open from the revision after the standby's
snapshot and buffers the events; the follower takes them (:meth:`Watcher.take_all`) and turns
them into a :class:`~xce_controller.storeread.Delta` with :func:`delta_of` (pure). At
promotion the buffered events may lag etcd; :func:`read_until` reads a fresh watch up to the
campaign's own revision, which is above every write the old primary could still commit
(its guard fails once the leader key changed), so the new primary misses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import orjson
from loguru import logger
from xce_controller.changes import Change
from xce_controller.jobs import Job, job_from_row
from xce_controller.storeread import Delta

from xce_etcd.client import Compacted, EtcdClient, EtcdUnavailable, Event, OutcomeUnknown, prefix_end
from xce_etcd.layout import group_rids, job_of, second_of, stamped

SILENT_TTLS = 2.0
"""Lease TTLs a standby's watch may be silent before it is opened again from the revision
after its last event. A live primary is never that silent: it commits, or it puts its beat
key every quarter TTL while idle (:mod:`xce_etcd.election`); so a silent watch is a primary
gone (opening it again costs one request) or a stream that stopped delivering (a frozen
member, or a gateway stream that went quiet with the member still serving: seen 2 times in 13
runs of a 60-write test, the cause not found), which would otherwise hold back everything the
standby should follow until its promotion's catch-up."""


class Watcher:
    """A thread that watches ``prefix`` from revision ``start`` and buffers the events."""

    def __init__(self, client: EtcdClient, prefix: bytes, start: int, who: str,
                 on_events: Callable[[list[Event]], None] | None = None, *,
                 idle: float = 2.0) -> None:
        self.client = client
        self.idle = idle  # seconds of silence after which the watch is opened again
        self.opened = 0  # watches etcd answered the creation of (tests read it)
        self.on_events = on_events  # called with every response's events (the election's)
        self.live = False  # the stream is open (etcd answered its creation)
        self.prefix = prefix
        self.next = start  # the revision the watch continues from
        self.who = who
        self.compacted = 0  # etcd's compact revision, once ``next`` fell behind it
        self._events: list[Event] = []
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xce-etcd-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        complained = 0.0
        while not self._stop.is_set():
            try:
                for events in self.client.watch(self.prefix, prefix_end(self.prefix), self.next,
                                                self.idle):
                    if self._stop.is_set():
                        return
                    if not self.live:
                        self.opened += 1
                    self.live = True
                    if self.on_events is not None:  # (an empty list: the watch is open)
                        self.on_events(events)
                    if events:
                        with self._cv:
                            self._events.extend(events)
                            self.next = events[-1].revision + 1
                            self._cv.notify_all()
            except Compacted as exc:
                self.live = False
                logger.warning("controller {}: standby: etcd compacted its history up to "
                               "revision {}, past the revision {} this standby follows from; it "
                               "loads the state again", self.who, exc.compact_revision, self.next)
                with self._cv:
                    self.compacted = exc.compact_revision
                    self._cv.notify_all()
                return
            except (OutcomeUnknown, EtcdUnavailable) as exc:
                self.live = False
                now = time.monotonic()
                if "ReadTimeout" in str(exc):
                    logger.debug("controller {}: standby: etcd watch silent for {:g} s; watching "
                                 "again from revision {}", self.who, self.idle, self.next)
                elif now - complained > 5:
                    complained = now
                    logger.warning("controller {}: standby: etcd watch broke ({}); watching again "
                                   "from revision {}", self.who, exc, self.next)
                self._stop.wait(0.05)
            except Exception as exc:
                self.live = False
                if self.client.closed:  # the candidate stops
                    return
                # Anything else (a bug, an answer this client cannot read): a thread that
                # ended here would leave the standby following nothing, silently.
                logger.opt(exception=True).error(
                    "controller {}: standby: etcd watch failed ({}: {}); watching again from "
                    "revision {}", self.who, type(exc).__name__, exc, self.next)
                self._stop.wait(0.5)

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until events are buffered (or the watch fell behind)."""
        with self._cv:
            return self._cv.wait_for(lambda: bool(self._events) or bool(self.compacted), timeout)

    def take_all(self) -> tuple[list[Event], int, int]:
        """The buffered events (revision order; the buffer is empty after), the revision the
        watch continues from and etcd's compact revision if it fell behind (else 0), all at
        one moment."""
        with self._cv:
            out, self._events = self._events, []
            return out, self.next, self.compacted

    def stop(self) -> None:
        """End the thread (within its current read: :attr:`idle` at most)."""
        self.live = False
        self._stop.set()


def read_until(client: EtcdClient, prefix: bytes, start: int, target: int, deadline: float
               ) -> list[Event]:
    """Every event of ``prefix`` from revision ``start`` through ``target`` (inclusive) on a
    fresh watch, by monotonic ``deadline``; raises Compacted, or OutcomeUnknown/
    EtcdUnavailable when it cannot be done in time."""
    out: list[Event] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise OutcomeUnknown(f"the watch did not reach revision {target} in time "
                                 f"(at {start})")
        try:
            for events in client.watch(prefix, prefix_end(prefix), start, left):
                out.extend(events)
                if events:
                    start = events[-1].revision + 1
                if start > target:
                    return out
        except (OutcomeUnknown, EtcdUnavailable):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def delta_of(events: Iterable[Event], state_prefix: bytes, idem_prefix: bytes, since: int) -> Delta:
    """What ``events`` (revision order) changed, as the controller's standby applies it.

    The last event of a key wins. A record's rev is its stamp; a removal's is the
    ``meta/rev`` its transaction wrote (the transaction's highest rev: a removal is at most
    re-sent to a member, never lost).
    """
    last: dict[bytes, Event] = {}
    txn_rev: dict[int, int] = {}  # etcd revision -> the controller rev its transaction wrote
    rev_key = state_prefix + b"meta/rev"
    for ev in events:
        last.pop(ev.key, None)
        last[ev.key] = ev
        if ev.key == rev_key and not ev.deleted:
            txn_rev[ev.revision] = int(ev.value)
    jobs_prefix = state_prefix + b"jobs/"
    jobs: list[Job] = []
    removed: list[tuple[str, int | str, int]] = []
    records: dict[str, dict[str, dict[str, object]]] = {"hosts": {}, "queues": {}, "revocations": {}}
    changes: list[Change] = []
    idem: list[tuple[str, float]] = []
    meta: dict[str, bytes] = {}
    for key, ev in last.items():
        if key.startswith(jobs_prefix):
            jobid = int(key[len(jobs_prefix):])
            if ev.deleted:
                removed.append(("jobs", jobid, txn_rev.get(ev.revision, since)))
            else:
                rev, data, spec = job_of(ev.value)
                jobs.append(job_from_row(spec, data))
                changes.append(Change(rev, "jobs", jobid, False))
        elif key.startswith(state_prefix):
            table, _, name_b = key[len(state_prefix):].partition(b"/")
            kind, name_s = table.decode(), name_b.decode()
            if kind == "meta":
                if not ev.deleted:
                    meta[name_s] = ev.value
            elif kind in records:
                if ev.deleted:
                    removed.append((kind, name_s, txn_rev.get(ev.revision, since)))
                else:
                    rev, blob = stamped(ev.value)
                    records[kind][name_s] = orjson.loads(blob)
                    changes.append(Change(rev, kind, name_s, False))
        elif key.startswith(idem_prefix) and not ev.deleted:  # (a deleted one expired)
            second = second_of(key[len(idem_prefix):])
            if second is not None:
                idem.extend((rid.decode(), float(second)) for rid in group_rids(ev.value))
    changes.extend(Change(rev, kind, key, True) for kind, key, rev in removed)
    changes.sort(key=lambda c: c.rev)
    rev = max([since, int(meta.get("rev", b"0")), *(c.rev for c in changes)])
    top = max((j.jobid for j in jobs), default=0)
    next_jobid = max(int(meta.get("next_jobid", b"1")), top + 1)
    return Delta(since, rev, next_jobid, jobs, records["hosts"], records["queues"], removed,
                 idem, changes, records["revocations"])
