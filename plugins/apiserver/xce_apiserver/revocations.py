"""The API server's copy of the revoked-token list, and the check every request makes.

The list lives in the controller (``xce_controller.revocations``): a logout, a refresh and
``xce admin revoke-tokens USER`` are writes there, committed before they are answered, and
every API server holds the records in its replica (kind ``revocations``: the sync after each
join, then the ``revocation`` and ``revocations_removed`` pushes). A token is checked with two
dictionary lookups -- its own id (``t:<jti>``, for its own user only) and its user
(``u:<user>``: every token issued before a time) -- so the check costs the same however long
the list is. It is read and fed on the event loop only (as the replica, :mod:`xcecore.replica`).
"""

from __future__ import annotations

import time
from typing import Any

from xcecore.replica import Record, Replica

KIND = "revocations"


class RevocationList:
    """Answers "is this token revoked, and why" in O(1): the records of kind ``revocations``
    by key, kept by the store's replica observer (:meth:`changed`).

    A snapshot sync empties the replica's records at its start and sends them again; until it
    ends, the records held before it are still checked (:meth:`sync_begun`), so a revoked
    token is never accepted in between. Without a replica (an API server built without a
    controller, unit tests), :meth:`hold` is what feeds it.
    """

    def __init__(self, replica: Replica | None = None) -> None:
        self.replica = replica
        self.records: dict[str, Record] = {}
        self.before_sync: dict[str, Record] = {}  # what a snapshot under way replaces

    def why(self, jti: str, user: str, issued: float) -> str | None:
        """Why the token ``jti`` of ``user`` issued at ``issued`` is revoked, or None."""
        for held in (self.records, self.before_sync):
            one = held.get("t:" + jti)
            if one is not None and one.get("user") == user:
                return f"token revoked (logged out at {_when(one.get('at'))})"
            every = held.get("u:" + user)
            if every is not None:
                before = every.get("before")
                if isinstance(before, int | float) and issued < before:
                    return (f"token revoked: every token of {user} issued before "
                            f"{_when(before)} was revoked by {every.get('by') or 'an administrator'}")
            if not self.before_sync:
                break
        return None

    def hold(self, record: Any) -> None:
        """Hold a record the controller committed (a write's result) at once, before its push
        arrives: this server refuses the token from the moment the logout is answered."""
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            return
        if self.replica is not None:
            self.replica.put(KIND, record)  # newest wins; the observer calls changed()
        else:
            self.changed(record["key"], record)

    # -- fed by the store's replica observer -----------------------------------------------

    def changed(self, key: Any, new: Record | None) -> None:
        """The replica's record ``key`` is now ``new`` (None: removed)."""
        if new is None:
            self.records.pop(str(key), None)
        else:
            self.records[str(key)] = new

    def sync_begun(self, mode: str, kinds: frozenset[str]) -> None:
        """A sync started; a snapshot emptied the records (kept aside until it ends)."""
        if KIND in kinds and mode == "snapshot":
            self.before_sync = {**self.before_sync, **self.records}
            self.records = {}

    def sync_ended(self) -> None:
        """The sync is complete: the records are whole again."""
        self.before_sync = {}

    def __len__(self) -> int:
        return len(self.records)


def _when(t: Any) -> str:
    if not isinstance(t, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
