"""The state sync's resume token: which store, and up to which revision the member is complete.

Pure bookkeeping, no I/O (docs/protocol.md, "State sync"). The event-loop client feeds it
every push (:meth:`SyncToken.observe`) and sends :meth:`SyncToken.since` with every join, so
a member that re-joins within the controller's retention window is sent only what it missed.

The token is the highest revision the member is known to hold everything up to: ``S`` of the
last completed sync (``sync_end``), raised by the revisions of the pushes after it (pushes come
in commit order, so each one extends the complete prefix). While a *snapshot* streams the
member has forgotten its previous view, so the token is void until that sync ends: a link lost
in the middle makes the next join ask for a snapshot again. A *delta* that is cut short leaves
the old token valid: everything the member held is still there, and re-applying newer records
is harmless (newest revision wins).

The volatile values (no revisions) have a position of their own, the ``volatile`` of the last
completed sync's ``sync_begin`` (a primary's term and a sequence in it): sent back in
``since``, it lets the same primary send only the volatile values that changed. A sync that
sends them whole voids it until it ends; one that sends what changed leaves the old one valid.
"""

from __future__ import annotations

from typing import Any

REVISED = frozenset({"job", "host", "queue", "cluster", "job_removed"})
"""Ordinary pushes of durable changes: each carries the revision of the write that made it."""
VOLATILE = frozenset({"pend_reasons", "resvals", "jusage", "member"})
"""Ordinary pushes of volatile changes: each carries its ``vseq`` in the primary's term."""


def _rev(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


class SyncToken:
    """Store id and highest complete revision, from the pushes of one client's connections."""

    __slots__ = ("_syncing", "_volatile_next", "rev", "store", "syncs", "volatile")

    def __init__(self) -> None:
        self.store: str | None = None
        self.rev: int | None = None  # None: nothing complete to resume from
        self.volatile: dict[str, Any] | None = None  # {"epoch", "seq"} of the last sync
        self.syncs = 0  # completed syncs
        self._syncing = False
        self._volatile_next: dict[str, Any] | None = None

    def since(self) -> dict[str, Any] | None:
        """The join's ``since`` argument: ``{"store", "rev"}`` (and ``volatile`` when known),
        or None for a snapshot."""
        if self.store is None or self.rev is None:
            return None
        out: dict[str, Any] = {"store": self.store, "rev": self.rev}
        if self.volatile is not None:
            out["volatile"] = self.volatile
        return out

    def forget(self) -> None:
        """Ask for a snapshot at the next join (the member dropped what it held)."""
        self.rev = None
        self.volatile = None

    def observe(self, event: str, data: Any) -> None:
        """Account for one push (any event; those that do not concern the sync cost a lookup)."""
        if event in REVISED:
            if not self._syncing and self.rev is not None and isinstance(data, dict):
                rev = _rev(data.get("rev"))
                if rev is not None and rev > self.rev:
                    self.rev = rev
        elif event in VOLATILE:
            vol = self.volatile
            if not self._syncing and vol is not None and isinstance(data, dict):
                seq = _rev(data.get("vseq"))
                if seq is not None and seq > vol["seq"]:
                    self.volatile = {"epoch": vol["epoch"], "seq": seq}
        elif event == "sync_begin":
            if not isinstance(data, dict):
                return
            store = data.get("store")
            self._syncing = True
            if data.get("mode") != "delta" or store != self.store:
                # A snapshot replaces the member's view: nothing older is complete any more.
                self.rev = None
            self.store = store if isinstance(store, str) else None
            vol = data.get("volatile")
            self._volatile_next = None
            if isinstance(vol, dict):
                epoch, seq = vol.get("epoch"), _rev(vol.get("seq"))
                if isinstance(epoch, str) and seq is not None:
                    self._volatile_next = {"epoch": epoch, "seq": seq}
            if self.rev is None or not (isinstance(vol, dict) and vol.get("mode") == "delta"):
                self.volatile = None  # they are being replaced: nothing to resume from
        elif event == "sync_end":
            if not self._syncing or not isinstance(data, dict):
                return
            self._syncing = False
            rev = _rev(data.get("rev"))
            if rev is not None and self.store is not None:
                self.rev = rev if self.rev is None else max(self.rev, rev)
                self.volatile = self._volatile_next
                self.syncs += 1
