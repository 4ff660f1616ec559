"""A small model of the controller's side of the state sync, for member tests (no I/O).

It keeps records per kind with store-wide revisions and a bounded log of recent changes (the
retention window), and turns a join (subscription, ``since``) into the frames of
docs/protocol.md: ``sync_begin``, ``sync_records`` in chunks, ``sync_removed`` (delta only),
``sync_end``. Ordinary pushes come from :meth:`SyncSource.put` and :meth:`SyncSource.remove`.
Scopes are filtered with the member-side rule (``xcecore.replica.scope_filter``): the fake is
the members' counterpart, not a second controller.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any

from xcecore.replica import VOLATILE, record_key, scope_filter
from xcecore.role import ALL_PUSHES, Subscription

Frame = tuple[str, Any]
PUSH_OF = {"jobs": "job", "hosts": "host", "queues": "queue", "cluster": "cluster"}


def subscription_of(wire: dict[str, str] | None, role: str) -> Subscription:
    """The subscription a join's ``subscribe`` names (absent: the role's default)."""
    if wire is None:
        if role == "worker":
            return Subscription.of(cluster="all", queues="all", hosts="own", jobs="host", resvals="own")
        return ALL_PUSHES
    return Subscription(tuple(wire.items()))


class SyncSource:
    """Records with revisions, a change log of ``retention`` entries, and sync frames."""

    def __init__(self, retention: int = 10_000, chunk: int = 1000) -> None:
        self.store = uuid.uuid4().hex
        self.rev = 0
        self.chunk = chunk
        self.records: dict[str, dict[Hashable, dict[str, Any]]] = {}
        self.log: deque[tuple[int, str, Hashable]] = deque(maxlen=retention)
        self.removed_at: dict[tuple[str, Hashable], int] = {}
        self.joins: list[dict[str, Any]] = []  # what each join asked and got

    # ------------------------------------------------------------------ changes
    def put(self, kind: str, record: dict[str, Any]) -> Frame:
        """Store ``record`` (a new revision unless the kind is volatile); its push."""
        record = dict(record)
        if kind not in VOLATILE:
            self.rev += 1
            record["rev"] = self.rev
        key = record_key(kind, record)
        self.records.setdefault(kind, {})[key] = record
        if kind not in VOLATILE:
            self.log.append((self.rev, kind, key))
            self.removed_at.pop((kind, key), None)
        if kind == "resvals":
            return "resvals", record
        if kind == "members":
            return "member", {**record, "joined": True}
        if kind == "pend_reasons":
            return "pend_reasons", {"reasons": {str(record["jobid"]): record["reason"]}}
        return PUSH_OF[kind], record

    def remove(self, kind: str, keys: Iterable[Hashable]) -> Frame:
        """Remove records of ``kind`` (one revision for all); the ``job_removed`` push."""
        keys = list(keys)
        self.rev += 1
        for key in keys:
            self.records.get(kind, {}).pop(key, None)
            self.log.append((self.rev, kind, key))
            self.removed_at[(kind, key)] = self.rev
        return "job_removed", {"jobids": keys, "rev": self.rev}

    def oldest(self) -> int:
        """The oldest revision a ``since`` may name and still get a delta."""
        return self.log[0][0] - 1 if len(self.log) == self.log.maxlen else 0

    # ------------------------------------------------------------------ a join
    def join(self, subscribe: dict[str, str] | None, since: Any, role: str = "member",
             host: str | None = None) -> tuple[dict[str, Any], list[Frame]]:
        """The join reply's ``sync`` and the frames that carry it."""
        sub = subscription_of(subscribe, role)
        keep = scope_filter(sub, host)
        delta = (isinstance(since, dict) and since.get("store") == self.store
                 and type(since.get("rev")) is int and self.oldest() <= since["rev"] <= self.rev)
        mode = "delta" if delta else "snapshot"
        frames: list[Frame] = []
        counts: dict[str, int] = {}
        removed: dict[str, list[Hashable]] = {}
        for kind in sub.kinds:
            held = self.records.get(kind, {})
            if delta and kind not in VOLATILE:
                changed = {key for rev, k, key in self.log if k == kind and rev > since["rev"]}
                items = [held[key] for key in sorted(changed, key=repr) if key in held]
                removed[kind] = [key for key in sorted(changed, key=repr) if key not in held]
            else:
                items = list(held.values())
            test = keep.get(kind)
            if test is not None:
                out = [r for r in items if not test(r)]
                items = [r for r in items if test(r)]
                if delta and kind not in VOLATILE:  # left the scope: removed for the member
                    removed[kind] += [record_key(kind, r) for r in out]
            counts[kind] = len(items)
            for start in range(0, len(items), self.chunk):
                frames.append(("sync_records", {"kind": kind, "items": items[start:start + self.chunk]}))
        for kind, keys in removed.items():
            if keys:
                frames.append(("sync_removed", {"kind": kind, "keys": keys}))
        begin = {"mode": mode, "store": self.store, "rev": self.rev,
                 "since": since["rev"] if delta else None}
        if not delta:
            begin["counts"] = counts
        self.joins.append({"mode": mode, "since": since, "subscription": sub.to_wire(),
                           "frames": len(frames)})
        sync = {"mode": mode, "store": self.store, "rev": self.rev}
        return sync, [("sync_begin", begin), *frames, ("sync_end", {"rev": self.rev})]

    def wants(self, subscribe: dict[str, str] | None, role: str, host: str | None,
              event: str, data: Any, before: dict[str, Any] | None = None) -> bool:
        """Whether a member with this subscription is sent push ``event`` (its scope now, or
        the record's previous version was in it: a job leaving the scope is sent once more)."""
        sub = subscription_of(subscribe, role)
        kind = {"job": "jobs", "job_removed": "jobs", "host": "hosts", "queue": "queues",
                "cluster": "cluster", "member": "members", "resvals": "resvals",
                "pend_reasons": "pend_reasons", "jusage": "jusage"}.get(event)
        if kind is None:
            return event == "shutdown" or (event == "signal" and "jobs" in sub.kinds)
        if kind not in sub.kinds:
            return False
        test = scope_filter(sub, host).get(kind)
        if test is None or event == "job_removed":
            return True
        return bool(test(data) or (before is not None and test(before)))
