"""Hot standbys, and the load of a primary that has none to promote from.

A standby does not wait idle for the lock: a :class:`Follower` thread loads the whole state
from the store (one read transaction), then follows every commit of the primary (the rows
whose rev is above the one it holds, and the removals, through the store's rev indexes) and
keeps the state, the retention window and the committed idempotency keys in memory. When the
standby wins the election it stops the follower, reads what is left (:meth:`Follower.catch_up`:
only what the old primary committed since the last catch-up) and serves: promotion costs
what changed since, never a reload.

A candidate that becomes primary without a loaded follower (a lone controller's restart, or
a failover before a new standby has finished loading) reads the small part of the store
(meta, hosts, queues), starts taking the writes that need no job (submissions, queue
control, heartbeats, ``outcome``), and loads the jobs, the window and the keys on a thread
meanwhile (:func:`load_rest`); requests that need the jobs wait for them, each connection's
in order. So a restart's first acknowledged write does not wait for a million jobs to load.

The store interface these use (``head``, ``load_jobs``, ``load_window``, ``load_idem``,
``snapshot``, ``changes_since``, ``wait_changed``) is the ``Store`` protocol's
(:mod:`xce_controller.hookspecs`): another backend follows with a watch instead.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

from loguru import logger

from xce_controller.changes import ChangeRing
from xce_controller.jobs import JobTable
from xce_controller.ridfilter import RidFilter
from xce_controller.settings import ControllerSettings
from xce_controller.state import ClusterState
from xce_controller.storeread import Delta, Head

FOLLOW_WAIT = 0.25  # seconds a follower waits for a commit before it looks again anyway


def clean_width(settings: ControllerSettings) -> float:
    """The width of the finished-job buckets: a 64th of the clean period, 1 s to 60 s."""
    return min(60.0, max(1.0, settings.clean_period / 64)) if settings.clean_period > 0 else 60.0


@dataclass(slots=True)
class Caught:
    """What a catch-up did (for the promotion's log line and the tests)."""

    changes: int  # records changed or removed
    keys: int  # idempotency keys
    ms: float
    rev: int


class Follower:
    """A standby's copy of the state, loaded and kept current by its own thread."""

    def __init__(self, store: Any, settings: ControllerSettings, who: str) -> None:
        self.store = store
        self.settings = settings
        self.who = who
        self.state: ClusterState | None = None
        self.ring = ChangeRing(settings.change_retention)
        self.rids = RidFilter()
        self.rev = 0
        self.store_id = ""
        self.loaded = threading.Event()  # the snapshot is in
        self.lock = threading.Lock()  # held by a catch-up (the thread's, or the promotion's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.followed = 0  # changes applied since the snapshot (tests and status read it)
        self.snapshots = 0
        self.load_ms = 0.0

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xce-standby-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Make the thread return (after its current step); :meth:`join` waits for it."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; False if it is still running after ``timeout``."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.loaded.is_set():
                    if not self._load():  # no store yet (the first primary is creating it),
                        self._stop.wait(0.05)  # or it cannot be read now (a reload failed)
                    continue
                if self.store.wait_changed(FOLLOW_WAIT):
                    with self.lock:
                        if not self._stop.is_set():  # else the promotion catches up itself
                            self.catch_up()
        except Exception:
            logger.opt(exception=True).error(
                "controller {}: standby: following the state store failed; it stops following "
                "(on promotion it loads the state from the store instead)", self.who)
            self.loaded.clear()

    def _load(self) -> bool:
        t0 = time.perf_counter()
        rids = RidFilter()
        since = time.time() - self.settings.idem_ttl
        got = self.store.snapshot(self.settings.change_retention, clean_width(self.settings),
                                  since, rids.add)
        if got is None:
            return False
        head, table = got
        state = ClusterState(self.settings.conf, table.ends.width)
        state.take_head(head.hosts, head.queues, head.next_jobid, time.time(), head.revocations)
        state.take_jobs(table)
        self.state, self.rids, self.rev, self.store_id = state, rids, head.rev, head.store_id
        self.ring = ChangeRing(self.settings.change_retention, head.floor)
        self.ring.extend(head.changes)
        self.snapshots += 1
        self.load_ms = (time.perf_counter() - t0) * 1000
        gc.freeze()  # the state lives as long as the candidate: no collection re-scans it
        self.loaded.set()
        logger.info(
            "controller {}: standby: loaded {} jobs, {} hosts at rev {} in {:.0f} ms; following "
            "the primary's commits", self.who, len(table), len(state.hosts), head.rev,
            self.load_ms)
        return True

    def catch_up(self) -> Caught:
        """Apply what the store committed after :attr:`rev` (the thread's, or, once the
        thread has ended, the promoting candidate's call)."""
        t0 = time.perf_counter()
        delta = self.store.changes_since(self.rev)
        if delta is None:
            logger.warning("controller {}: standby: the store pruned removals above rev {}; "
                           "loading the state again", self.who, self.rev)
            self.loaded.clear()
            self._load()  # when it fails, ``loaded`` stays clear: the thread tries again, a
            # promotion loads cold
            return Caught(-1, 0, (time.perf_counter() - t0) * 1000, self.rev)
        self._apply(delta)
        return Caught(len(delta.changes), len(delta.idem), (time.perf_counter() - t0) * 1000,
                      self.rev)

    def _apply(self, delta: Delta) -> None:
        state = self.state
        if state is None:
            raise RuntimeError("catch_up before the standby loaded a snapshot")
        state.follow(delta.jobs, delta.hosts, delta.queues, delta.removed, delta.next_jobid,
                     time.time(), delta.revocations)
        self.ring.extend(c for c in delta.changes if c.rev > self.ring.last)
        for rid, ts in delta.idem:
            self.rids.add(rid, ts)
        self.followed += len(delta.changes)
        self.rev = max(self.rev, delta.rev)


@dataclass(slots=True)
class Rest:
    """What :func:`load_rest` loaded for a primary that serves already."""

    table: JobTable
    used: dict[str, int]  # slots taken per host by the table's active jobs
    ring: ChangeRing
    rids: RidFilter
    keys: int
    ms: float


def load_rest(store: Any, head: Head, settings: ControllerSettings) -> Rest:
    """On a thread: the jobs (ids up to the head's highest), the window up to the head's
    rev, and the idempotency keys within their TTL."""
    t0 = time.perf_counter()
    table = store.load_jobs(head.max_jobid, clean_width(settings))
    window, floor = store.load_window(settings.change_retention, head.floor)
    ring = ChangeRing(settings.change_retention, floor)
    ring.extend(c for c in window if c.rev <= head.rev)
    rids = RidFilter()
    keys = store.load_idem(time.time() - settings.idem_ttl, rids.add)
    return Rest(table, table.used_slots(), ring, rids, keys, (time.perf_counter() - t0) * 1000)
