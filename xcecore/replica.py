"""A member's copy of the controller's records, kept by the state sync's rules.

Every role that keeps state (the scheduler, the API server, the worker, a third party's
auditor) feeds its pushes to one :class:`Replica` instead of parsing them by hand. The replica
holds ``kind -> key -> record`` for the kinds the role subscribed to and applies the rules of
docs/protocol.md ("State sync"):

- ``sync_begin`` opens a sync. A *snapshot* forgets what was held of every subscribed kind;
  a *delta* keeps it. Volatile kinds (resource values, pend reasons, job usage, members),
  which have no revisions, are sent whole and replaced, unless the delta's ``volatile`` says
  ``mode`` ``delta``: then only the volatile records that changed are sent, and kept.
- ``sync_records`` and the ordinary pushes (``job``, ``host``, ...) put records: a record is
  applied only if its ``rev`` is at least the one held for its key (newest wins), so frames of
  a snapshot produced while the cluster changed never undo a newer push. A key removed while a
  sync streams is remembered (with the removal's revision) until ``sync_end``, so an older copy
  of it in a later frame does not bring it back.
- ``sync_removed`` and ``job_removed`` remove; a removal removes whatever is held.
- ``sync_end`` closes the sync: the view is complete, consistent as of at least its ``rev``.
- A record outside the role's scope (a finished job for ``jobs: unfinished``, a job no longer
  active on the member's host for ``jobs: host``) leaves the replica: it is removed.

A :class:`ReplicaObserver` hears each change as it is applied (``changed``), and the start
and end of each sync, so a role keeps its own indexes (pending jobs per queue, paging order)
without scanning. The replica is not thread-safe: feed and read it on the event loop (the
role's ``push``), and hand what other threads need to them through the observer.

A snapshot of a million records is a million new objects; Python's cyclic garbage collector
would traverse the growing heap again and again while they arrive (measured here: 1,000,000
job records took 12 s to decode and apply with the collector on, 2.4 s with it off). Records
are plain JSON values, without cycles, so while a snapshot streams the replica pauses the
collector (``manage_gc``, on by default: a role owns its process), and at ``sync_end`` it
resumes it and moves what is held to the permanent generation (``gc.freeze``), so later
collections do not traverse the records either. A snapshot that does not end within
:data:`GC_PAUSE_MAX` seconds gets the collector back at its next frame.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

from loguru import logger

from xcecore.protocol import ACTIVE, UNFINISHED
from xcecore.role import Subscription

Record = dict[str, Any]
Key = Hashable

VOLATILE: frozenset[str] = frozenset({"resvals", "pend_reasons", "jusage", "members"})
"""Kinds without revisions: every sync sends them whole, and the replica replaces them."""

GC_PAUSE_MAX = 60.0
"""Seconds a snapshot may keep the cyclic garbage collector paused."""

CLUSTER_KEY = "cluster"
"""The one key of kind ``cluster`` (the cluster configuration)."""

SYNC_EVENTS: frozenset[str] = frozenset({"sync_begin", "sync_records", "sync_removed", "sync_end"})
RECORD_EVENTS: frozenset[str] = frozenset({"job", "host", "queue", "cluster", "job_removed",
                                           "member", "resvals", "pend_reasons", "jusage",
                                           "revocation", "revocations_removed"})
"""Ordinary pushes that change records (``signal`` and ``shutdown`` carry none)."""

_KEY_FIELD: dict[str, str] = {"queues": "name", "hosts": "name", "jobs": "jobid",
                              "members": "identity", "resvals": "host", "pend_reasons": "jobid",
                              "jusage": "jobid", "revocations": "key"}
_PUSH_KIND: dict[str, str] = {"job": "jobs", "host": "hosts", "queue": "queues",
                              "cluster": "cluster", "resvals": "resvals", "jusage": "jusage",
                              "revocation": "revocations"}
_REMOVAL_PUSH: dict[str, tuple[str, str]] = {"job_removed": ("jobs", "jobids"),
                                             "revocations_removed": ("revocations", "keys")}
"""Pushes that remove records: the kind, and the field listing the keys."""


class ReplicaObserver:
    """What a role overrides to follow a :class:`Replica` (every method is optional).

    Called on the thread that feeds the replica, right after the replica changed; an
    exception is logged and does not undo the change.
    """

    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        """A sync started (``mode`` ``snapshot`` or ``delta``); ``kinds`` were just emptied
        (every subscribed kind for a snapshot, the volatile ones for a delta)."""

    def changed(self, kind: str, key: Key, old: Record | None, new: Record | None) -> None:
        """``kind``/``key`` went from ``old`` to ``new`` (None: absent before / removed)."""

    def sync_ended(self, mode: str) -> None:
        """The sync is complete: the replica holds the member's whole view."""


def record_key(kind: str, record: Mapping[str, Any]) -> Key:
    """The key of ``record`` of ``kind`` (``KeyError``/``TypeError`` when it has none)."""
    if kind == "cluster":
        return CLUSTER_KEY
    key = record[_KEY_FIELD[kind]]
    if kind in ("jobs", "pend_reasons", "jusage"):
        if type(key) is not int:
            raise TypeError(f"{_KEY_FIELD[kind]} must be an integer, not {key!r:.40}")
        return key
    if not isinstance(key, str):
        raise TypeError(f"{_KEY_FIELD[kind]} must be a string, not {key!r:.40}")
    return key


def scope_filter(subscription: Subscription, host: str | None) -> dict[str, Callable[[Record], bool]]:
    """Per kind, whether a record is in the member's scope (kinds in scope ``all``: absent)."""
    out: dict[str, Callable[[Record], bool]] = {}
    jobs = subscription.scope("jobs")
    if jobs == "unfinished":
        out["jobs"] = lambda r: r.get("state") in UNFINISHED
    elif jobs == "host":
        def on_host(r: Record) -> bool:
            return r.get("state") in ACTIVE and any(
                isinstance(a, dict) and a.get("host") == host for a in r.get("alloc") or ())
        out["jobs"] = on_host
    for kind in ("hosts", "resvals"):
        if subscription.scope(kind) == "own":
            field = _KEY_FIELD[kind]
            out[kind] = lambda r, f=field: r.get(f) == host  # type: ignore[misc]
    return out


class Replica:
    """``kind -> key -> record`` for the kinds of ``subscription``; see the module docstring.

    ``host`` is the member's own host, for the ``own`` and ``host`` scopes. Read
    :meth:`records`, :meth:`get`; :attr:`complete` is true once a sync has ended and while no
    other streams. ``name`` prefixes the log lines (the role's identity).
    """

    def __init__(self, subscription: Subscription, *, host: str | None = None,
                 observer: ReplicaObserver | None = None, name: str = "replica",
                 manage_gc: bool = True) -> None:
        self.subscription = subscription
        self.kinds = subscription.kinds
        self.host = host
        self.observer = observer or ReplicaObserver()
        self.name = name
        self._data: dict[str, dict[Key, Record]] = {kind: {} for kind in self.kinds}
        self._in_scope = scope_filter(subscription, host)
        self._tombstones: dict[tuple[str, Key], int] = {}
        self.syncing = False
        self.mode: str | None = None  # of the sync in progress, or the last one
        self.store: str | None = None
        self.rev: int | None = None  # the last completed sync's rev
        self.syncs = 0  # completed syncs
        self.applied = 0  # records put or removed (for operators and tests)
        self._began = 0.0
        self._frames = 0
        self._applied_before = 0
        self.manage_gc = manage_gc
        self._gc_paused = False

    # ------------------------------------------------------------------ reading
    @property
    def complete(self) -> bool:
        """A sync has completed and no other is streaming: the view is whole."""
        return self.syncs > 0 and not self.syncing

    def records(self, kind: str) -> Mapping[Key, Record]:
        """Every record held of ``kind`` (an empty mapping for a kind not subscribed)."""
        return self._data.get(kind, {})

    def get(self, kind: str, key: Key) -> Record | None:
        """One record, or None."""
        return self._data.get(kind, {}).get(key)

    def count(self, kind: str) -> int:
        """How many records of ``kind`` are held."""
        return len(self._data.get(kind, ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    # ------------------------------------------------------------------ feeding
    def apply(self, event: str, data: Any) -> bool:
        """Apply one push; True if it was one of the sync's or a record push (handled here),
        False for the others (``signal``, ``shutdown``, ...), which are the role's.

        Malformed data is logged and skipped; it never raises.
        """
        if event in RECORD_EVENTS:
            handler = self._push
        elif event in SYNC_EVENTS:
            handler = self._sync
        else:
            return False
        try:
            handler(event, data)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            logger.warning("{}: malformed {} push ignored ({}: {})", self.name, event,
                           type(exc).__name__, exc)
        return True

    def _sync(self, event: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise TypeError(f"data is {type(data).__name__}, not an object")
        if event == "sync_records":
            kind = data["kind"]
            items = data["items"]
            if not isinstance(items, list):
                raise TypeError("items is not a list")
            self._frames += 1
            if self._gc_paused and time.monotonic() - self._began > GC_PAUSE_MAX:
                self._resume_gc(freeze=False)
            if kind not in self._data:
                return
            bad, why = 0, "not an object"
            for item in items:
                if not isinstance(item, dict):
                    bad += 1
                    continue
                try:
                    self.put(kind, item)
                except (TypeError, KeyError, ValueError) as exc:
                    bad += 1
                    why = f"{type(exc).__name__}: {exc}"
            if bad:
                logger.warning("{}: {} malformed {} record(s) in a sync frame skipped (last: {})",
                               self.name, bad, kind, why)
        elif event == "sync_removed":
            kind, keys = data["kind"], data["keys"]
            if not isinstance(keys, list):
                raise TypeError("keys is not a list")
            self._frames += 1
            if kind in self._data:
                for key in keys:
                    self.remove(kind, key)
        elif event == "sync_begin":
            self._begin(data)
        else:
            self._end(data)

    def _begin(self, data: dict[str, Any]) -> None:
        mode = data.get("mode")
        if mode not in ("snapshot", "delta"):
            raise ValueError(f"mode {mode!r} is neither 'snapshot' nor 'delta'")
        if mode == "delta" and (self.syncs == 0 or data.get("store") != self.store):
            # A delta to a view this replica never had: follow it, but say so (the token and
            # the replica are out of step: a bug, or a role that reset its replica alone).
            logger.warning("{}: a delta sync from store {} arrived but this replica holds no "
                           "complete view of it; applying it anyway", self.name, data.get("store"))
        self.syncing, self.mode = True, mode
        self.store = data.get("store") if isinstance(data.get("store"), str) else None
        self._tombstones.clear()
        self._began, self._frames, self._applied_before = time.monotonic(), 0, self.applied
        vol = data.get("volatile")
        volatile_delta = isinstance(vol, dict) and vol.get("mode") == "delta"
        emptied = (self.kinds if mode == "snapshot" else frozenset() if volatile_delta
                   else self.kinds & VOLATILE)
        for kind in emptied:
            self._data[kind] = {}
        if mode == "snapshot" and self.manage_gc and gc.isenabled() and self.kinds:
            gc.disable()
            self._gc_paused = True
        self._notify("sync_begun", mode, frozenset(emptied))

    def _end(self, data: dict[str, Any]) -> None:
        if not self.syncing:
            logger.warning("{}: sync_end without a sync in progress; ignored", self.name)
            return
        rev = data.get("rev")
        self.syncing = False
        self.rev = rev if type(rev) is int else self.rev
        self.syncs += 1
        self._tombstones.clear()
        self._resume_gc(freeze=True)
        counts = ", ".join(f"{len(self._data[k])} {k}" for k in sorted(self._data))
        logger.info("{}: {} sync complete (store {}, rev {}) in {:.3f} s, {} frame(s), {} "
                    "record(s) applied; holding {}", self.name, self.mode, self.store, self.rev,
                    time.monotonic() - self._began, self._frames,
                    self.applied - self._applied_before, counts or "nothing subscribed")
        self._notify("sync_ended", self.mode)

    def _resume_gc(self, *, freeze: bool) -> None:
        if not self._gc_paused:
            return
        self._gc_paused = False
        if freeze:
            gc.freeze()  # what is held now lives on: later collections need not traverse it
        gc.enable()

    def _push(self, event: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise TypeError(f"data is {type(data).__name__}, not an object")
        kind = _PUSH_KIND.get(event)
        if kind is not None:
            if kind in self._data:
                if "vseq" in data:  # the push's position (the resume token's), not the record's
                    data = {k: v for k, v in data.items() if k != "vseq"}
                self.put(kind, data)
        elif event in _REMOVAL_PUSH:
            kind, field = _REMOVAL_PUSH[event]
            if kind in self._data:
                keys = data[field]
                if not isinstance(keys, list):
                    raise TypeError(f"{field} is not a list")
                rev = data.get("rev")
                for key in keys:
                    self.remove(kind, key, rev if type(rev) is int else None)
        elif event == "member":
            if "members" in self._data:
                if data.get("joined", True):
                    self.put("members", {k: v for k, v in data.items()
                                         if k != "joined" and k != "vseq"})
                else:
                    self.remove("members", data["identity"])
        elif event == "pend_reasons" and "pend_reasons" in self._data:
            reasons = data["reasons"]
            if not isinstance(reasons, dict):
                raise TypeError("reasons is not an object")
            for text, reason in reasons.items():
                jobid = int(text)
                if reason is None:
                    self.remove("pend_reasons", jobid)
                else:
                    self.put("pend_reasons", {"jobid": jobid, "reason": reason})

    def put(self, kind: str, record: Record) -> bool:
        """Hold ``record`` unless an equal-or-newer one is held; True if it was applied.

        A record outside the member's scope removes the key instead.
        """
        key = record_key(kind, record)
        held = self._data[kind]
        old = held.get(key)
        rev = record.get("rev")
        if type(rev) is int:
            if old is not None:
                old_rev = old.get("rev")
                if type(old_rev) is int and rev < old_rev:
                    return False
            elif self._tombstones:
                gone = self._tombstones.get((kind, key))
                if gone is not None and rev <= gone:
                    return False
        keep = self._in_scope.get(kind)
        if keep is not None and not keep(record):
            if old is not None:
                del held[key]
                self.applied += 1
                self._changed(kind, key, old, None)
            return True
        held[key] = record
        self.applied += 1
        self._changed(kind, key, old, record)
        return True

    def remove(self, kind: str, key: Key, rev: int | None = None) -> bool:
        """Forget ``kind``/``key``; True if it was held. ``rev``: the removal's revision."""
        if self.syncing and rev is not None:
            self._tombstones[(kind, key)] = rev
        old = self._data[kind].pop(key, None)
        if old is None:
            return False
        self.applied += 1
        self._changed(kind, key, old, None)
        return True

    def _changed(self, kind: str, key: Key, old: Record | None, new: Record | None) -> None:
        try:
            self.observer.changed(kind, key, old, new)
        except Exception:
            logger.opt(exception=True).error("{}: the replica's observer failed on {} {!r:.60}",
                                             self.name, kind, key)

    def _notify(self, what: str, *args: Any) -> None:
        try:
            getattr(self.observer, what)(*args)
        except Exception:
            logger.opt(exception=True).error("{}: the replica's observer failed in {}",
                                             self.name, what)
