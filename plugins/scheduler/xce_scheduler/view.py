"""The scheduler's view of the cluster: the replica of what it schedules, and a journal of
changes for the picker thread.

The role feeds every push to :meth:`SchedulerView.apply` on the event loop. The replica
(:class:`xcecore.replica.Replica`) keeps the records by the state sync's rules; as its
observer, the view appends each change to a journal and sets ``wake`` when a change may let
a job be dispatched now (a new pending job, freed slots, a host or queue opened), so the
picker does not wait for its next tick. The picker thread takes the journal
(:meth:`SchedulerView.take`) at the start of each cycle and applies it to its own indexes
(:class:`xce_scheduler.board.Board`): the loop does O(1) per change and never waits for the
picker, and a cycle costs what changed, not a copy of every job.

Records are never mutated in place (a push brings a new dict), so the picker may hold the
replica's records without copying them.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from typing import Any

from xcecore.protocol import ACTIVE
from xcecore.replica import Replica, ReplicaObserver
from xcecore.role import Subscription

Record = dict[str, Any]
Entry = tuple[str, Any, Any]
"""A journal entry: ``(kind, key, new record or None)``, or a sync marker: ``("reset",
kinds, None)`` when a sync began (``kinds`` were emptied), ``("complete", None, None)`` when
it ended."""

SUBSCRIPTION = Subscription.of(cluster="all", queues="all", hosts="all", jobs="unfinished",
                               resvals="all", pend_reasons="all")
"""What the scheduler schedules from: pending and running jobs, hosts and their load values,
queues, the cluster configuration (site resources) and the pend reasons the controller has."""

RUNNING_STATES = ACTIVE


def is_array(job: Mapping[str, Any]) -> bool:
    """A job array's own record (its ``array`` holds pending indexes; an element's names
    the array it is ``of``, and is scheduled like any job)."""
    a = job.get("array")
    return isinstance(a, dict) and "of" not in a


def free_slots(host: Mapping[str, Any]) -> int:
    """Slots of ``host`` not used by running jobs (never negative)."""
    try:
        return max(0, int(host.get("max_slots", 0)) - int(host.get("used_slots", 0)))
    except (TypeError, ValueError):
        return 0


class SchedulerView(ReplicaObserver):
    """The replica, its journal for the picker, and the picker's wake-up event.

    ``syncs_begun`` counts syncs (every join and re-join starts one); ``complete`` is the
    replica's: false until the first sync has ended and while another streams.
    """

    def __init__(self, name: str = "scheduler") -> None:
        self.replica = Replica(SUBSCRIPTION, observer=self, name=name)
        self._lock = threading.Lock()
        self._journal: list[Entry] = []
        self.syncs_begun = 0
        self.wake = threading.Event()

    @property
    def complete(self) -> bool:
        """The view is whole (a sync has ended and none streams)."""
        return self.replica.complete

    def apply(self, event: str, data: Any) -> bool:
        """Feed one push (on the event loop); False for pushes that carry no records."""
        return self.replica.apply(event, data)

    def take(self) -> list[Entry]:
        """Everything journaled since the last call (the picker thread's drain)."""
        with self._lock:
            taken, self._journal = self._journal, []
        return taken

    def pending_entries(self) -> int:
        """Journal entries not yet taken (for status and tests)."""
        with self._lock:
            return len(self._journal)

    # ------------------------------------------------------------------ replica observer
    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        with self._lock:
            self.syncs_begun += 1
            self._journal.append(("reset", kinds, None))

    def sync_ended(self, mode: str) -> None:
        with self._lock:
            self._journal.append(("complete", None, None))
        self.wake.set()

    def changed(self, kind: str, key: Hashable, old: Record | None, new: Record | None) -> None:
        with self._lock:
            self._journal.append((kind, key, new))
        # is_set first: a sync of a million records would take the event's lock a million times
        if not self.wake.is_set() and _wakes(kind, old, new):
            self.wake.set()


def _wakes(kind: str, old: Record | None, new: Record | None) -> bool:
    """Whether a change may let a pending job be dispatched now."""
    if kind == "jobs":
        if new is not None and new.get("state") == "PEND":
            if old is not None and old.get("waiting") and not new.get("waiting"):
                return True  # its dependency holds now
            if old is not None and old.get("state") == "PEND" and is_array(new):
                return True  # an array that dispatched elements may have more to go
            return old is None or old.get("state") != "PEND"
        # A job that stopped running freed slots; the host push carries the new count, but
        # waking now lets the picker look as soon as both have arrived.
        return old is not None and old.get("state") in ACTIVE and (
            new is None or new.get("state") not in ACTIVE)
    if kind == "hosts":
        if new is None or new.get("state") != "ok":
            return False
        return old is None or old.get("state") != "ok" or free_slots(new) > free_slots(old)
    if kind == "queues":
        return new is not None and bool(new.get("active")) and (old is None or not old.get("active"))
    return kind == "cluster"
