"""The accounting role: pushes in, batched rows out, history queries answered.

- ``push`` (on the event loop) only queues what arrived; when the queue is full it awaits
  room, which stops reading from the controller: the controller's per-member bounds then
  drop this member, which re-joins and catches up from the next full state. The controller
  never waits on accounting.
- The **writer** thread feeds the queue through the :class:`~xce_accounting.timeline.Tracker`
  and commits what it produced in batches (one transaction per batch, at most
  ``batch_max`` rows, at least every ``flush_interval``), and prunes by age and size.
- **Query** threads answer the delegated ``history.*`` calls the controller pushes
  (``delegate``), each from its own connection, through ``delegate_reply``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
from loguru import logger

from xce_accounting.queries import answer
from xce_accounting.store import Batch, Store, StoreError
from xce_accounting.timeline import Tracker
from xcecore.candidates import Candidate
from xcecore.replica import Replica, ReplicaObserver
from xcecore.role import Handled, Monitor, Role, RoleContext, Subscription
from xcecore.schema.delegated import DELEGATE_REPLY, DELEGATED_ARGS
from xcecore.wire import ErrorCode, RemoteError

SERVES = sorted(op for op in DELEGATED_ARGS if op.startswith("history."))
QUEUE_MAX = 10_000
"""Changes waiting for the writer before ``push`` waits (and the controller's bounds act)."""
SUBSCRIPTION = Subscription.of(hosts="all", jobs="all", members="all", pend_reasons="all")


class _Feed(ReplicaObserver):
    """Hands the replica's changes to the writer thread, in order."""

    def __init__(self, put: Callable[[tuple[str, Any, float]], None]) -> None:
        self.put = put
        self.mode = "snapshot"
        self.syncing = False

    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        self.mode, self.syncing = mode, True
        self.put(("sync_begin", mode, time.time()))

    def changed(self, kind: str, key: Any, old: Any, new: Any) -> None:
        self.put((kind, (key, old, new, self.syncing), time.time()))

    def sync_ended(self, mode: str) -> None:
        self.syncing = False
        self.put(("sync_end", mode, time.time()))


def open_store(section: dict[str, Any]) -> Store:
    """The store ``[accounting]`` configures."""
    if section["backend"] == "postgresql":
        if not section.get("dsn"):
            raise StoreError("[accounting] backend 'postgresql' needs dsn")
        return Store.postgresql(section["dsn"])
    from xce_accounting.plugin import default_state_dir

    path = section.get("path") or str(Path(section.get("state_dir") or default_state_dir()) / "accounting.db")
    return Store.sqlite(path)


class AccountingRole(Role):
    """Records finished attempts and timelines; serves ``history.*``."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        s = ctx.section
        self.section = s
        self.inbox: queue.Queue[tuple[str, Any, float]] = queue.Queue()  # bounded by push
        self.replica = Replica(SUBSCRIPTION, observer=_Feed(self.inbox.put), name="accounting")
        self.queries: queue.Queue[dict[str, Any] | None] = queue.Queue(1000)
        self.recorded = 0  # finished attempts committed (by this process)
        self.ready = threading.Event()  # the writer's store is open
        self.room = threading.Event()  # the writer's queue is below half of QUEUE_MAX

    def join_attributes(self) -> dict[str, Any]:
        """The ops it serves (the controller forwards them here) and where it writes."""
        where = "postgresql" if self.section["backend"] == "postgresql" else "sqlite"
        return {"serves": SERVES, "backend": where}

    subscription = SUBSCRIPTION

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """Feed the replica (its observer queues each change for the writer), or queue a
        delegated query; never blocks the loop."""
        if event == "delegate":
            try:
                self.queries.put_nowait(data)
            except queue.Full:
                return self._refuse_busy(data)
            return None
        self.replica.apply(event, data)
        if self.inbox.qsize() > QUEUE_MAX:
            return self._wait_room()
        return None

    def connection_state(self, state: str, candidate: Candidate | None, detail: str) -> Handled:
        """The primary the role is joined to (a promotion when it changes)."""
        if state in ("connected", "rejoined") and candidate is not None:
            self.inbox.put(("primary", str(candidate), time.time()))
        return None

    async def _wait_room(self) -> None:
        logger.warning("accounting: {} changes wait for the database; not reading from the "
                       "controller until there is room", self.inbox.qsize())
        self.room.clear()
        await anyio.to_thread.run_sync(self.room.wait)  # the writer sets it below half

    async def _refuse_busy(self, data: Any) -> None:
        client = self.ctx.client
        if client is not None and isinstance(data, dict):
            await client.call(DELEGATE_REPLY, {"call": data.get("call", 0), "error": {
                "code": ErrorCode.UNAVAILABLE, "message": "accounting: too many queries waiting"}})

    def monitors(self) -> Iterable[Monitor]:
        """The writer and the query threads."""
        threads = max(1, int(self.section["query_threads"]))
        return [Monitor("accounting-writer", self._writer),
                *(Monitor(f"accounting-query-{i}", self._query_loop) for i in range(threads))]

    # -- the writer -------------------------------------------------------------------------

    def _writer(self, stop: threading.Event) -> None:
        store = self._open(stop)
        if store is None:
            return
        try:
            tracker = Tracker(store.marks())
            self.ready.set()
            self._ingest(store, tracker, stop)
        finally:
            store.close()

    def _open(self, stop: threading.Event) -> Store | None:
        while not stop.is_set():
            try:
                store = open_store(self.section)
                logger.info("accounting: recording to {} (schema version {})", store.where,
                            store.version())
                return store
            except StoreError as exc:
                logger.error("accounting: {}; retrying in 5 s (the controller is not affected)", exc)
                stop.wait(5)
        return None

    def _ingest(self, store: Store, tracker: Tracker, stop: threading.Event) -> None:
        s = self.section
        batch_max, flush = int(s["batch_max"]), float(s["flush_interval"])
        next_prune = time.monotonic() + 1.0
        pending = Batch()
        first = time.monotonic()
        while not stop.is_set():
            if not self.room.is_set() and self.inbox.qsize() < QUEUE_MAX // 2:
                self.room.set()
            try:
                event, data, now = self.inbox.get(timeout=flush)
                pending.extend(self.apply(tracker, store, event, data, now))
                if len(pending) < batch_max and time.monotonic() - first < flush:
                    continue
            except queue.Empty:
                pass
            if len(pending):
                self._commit(store, pending, stop)
                pending = Batch()
            first = time.monotonic()
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + float(s["prune_interval"])
                self._prune(store)
        if len(pending):
            self._commit(store, pending, stop)

    def apply(self, tracker: Tracker, store: Store, what: str, data: Any, now: float) -> Batch:
        """One change of the replica (or a sync's start or end) through the tracker."""
        batch = Batch()
        if what == "sync_begin":
            tracker.sync_begin(data)
        elif what == "sync_end":
            batch = tracker.sync_end(now)
        elif what == "primary":
            tracker.on_primary(data, now, batch)
        elif what == "jobs":
            key, _old, new, synced = data
            if new is None:
                batch = tracker.on_removed([key], now)
            else:
                batch = tracker.on_job(new, now, store.views, synced=synced)
        elif what == "pend_reasons":
            key, _old, new, _synced = data
            batch = tracker.on_pend_reasons({str(key): None if new is None else new.get("reason")}, now)
        elif what == "hosts":
            _key, _old, new, _synced = data
            if new is not None:
                tracker.on_hosts([new], now, batch)
        elif what == "members":
            key, old, new, _synced = data
            if new is not None:
                batch = tracker.on_member({**new, "joined": True}, now)
            else:  # (a sync empties the volatile kinds without a change per record)
                batch = tracker.on_member({"identity": key, "role": (old or {}).get("role"),
                                           "joined": False}, now)
        return batch

    def _commit(self, store: Store, batch: Batch, stop: threading.Event) -> None:
        """Commit ``batch``, retrying while the database refuses (nothing is dropped)."""
        delay = 0.1
        while True:
            try:
                store.write(batch)
                self.recorded += len(batch.attempts)
                if batch.attempts or len(batch.events) > 100:
                    logger.debug("accounting: committed {} attempts, {} events, {} cluster events",
                                 len(batch.attempts), len(batch.events), len(batch.cluster))
                return
            except Exception as exc:
                if stop.is_set():
                    logger.error("accounting: stopping with {} rows not committed ({}); they are "
                                 "recorded from the controller's state at the next start",
                                 len(batch), exc)
                    return
                logger.error("accounting: cannot commit {} rows to {}: {}; retrying in {:g} s",
                             len(batch), store.where, exc, delay)
                stop.wait(delay)
                delay = min(5.0, delay * 2)

    def _prune(self, store: Store) -> None:
        s = self.section
        try:
            removed = store.prune(float(s["keep_days"]), int(s["max_rows"]), int(s["prune_batch"]))
        except Exception as exc:
            logger.error("accounting: pruning {} failed: {}; trying again later", store.where, exc)
            return
        if removed:
            logger.info("accounting: pruned {} rows (keep_days {}, max_rows {})", removed,
                        s["keep_days"], s["max_rows"])

    # -- queries ----------------------------------------------------------------------------

    def _query_loop(self, stop: threading.Event) -> None:
        while not self.ready.wait(0.5):  # the writer migrates the schema first
            if stop.is_set():
                return
        store: Store | None = None
        while not stop.is_set():
            try:
                item = self.queries.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                continue
            try:
                if store is None:
                    store = open_store(self.section)
                reply: dict[str, Any] = {"result": answer(store, item["op"], item.get("args") or {},
                                                          item.get("caller") or {})}
            except RemoteError as exc:
                reply = {"error": {"code": exc.code, "message": exc.message}}
            except Exception as exc:
                logger.opt(exception=True).error("accounting: {} failed", item.get("op"))
                reply = {"error": {"code": ErrorCode.INTERNAL,
                                   "message": f"accounting: {type(exc).__name__}: {exc}"}}
                if store is not None:  # a broken connection: open a new one next time
                    store.close()
                    store = None
            try:
                self.ctx.call(DELEGATE_REPLY, {"call": item.get("call", 0), **reply}, deadline=10)
            except Exception as exc:
                logger.warning("accounting: could not answer {} ({}); the caller times out",
                               item.get("op"), exc)
        if store is not None:
            store.close()
