"""Revoked bearer tokens: the list the API servers check every token against.

The API servers sign their own tokens (JWTs with a shared key), so a token they issued is
valid on every one of them until it expires -- unless it is revoked. A revocation is a
durable record of kind ``revocations`` (table ``revocations`` of both stores), replicated to
every member that subscribes to the kind (the API servers) through the state sync like the
other records, and checked by them in O(1) per request (two dictionary lookups).

Two records, by key:

- ``t:<jti>`` -- one token (a logout, a refresh's old token): ``{"key", "user", "jti",
  "expires", "at", "by", "rev"}``. It applies only to a token whose own user (``sub``) is
  ``user``: the controller cannot see the token, so it records whom the request acted for,
  and a hostile user who names another user's token id revokes nothing of theirs.
- ``u:<user>`` -- every token of ``user`` issued before ``before`` (``xce admin revoke-tokens
  USER``, a compromised account): ``{"key", "user", "before", "expires", "by", "rev"}``. A
  later one replaces it (``before`` only moves forward).

Each record leaves the list when the tokens it names have expired anyway (``expires``): the
records are kept in a heap ordered by expiry, so dropping them costs what is dropped (no
scan). A user holds at most :data:`MAX_PER_USER` token records; past that the request is
refused with a CONFLICT that says to revoke all of the user's tokens instead, so nobody can
grow the list without bound.

Everything here is pure: :class:`Revocations` holds the records, its transitions check,
change them and return what changed; :class:`~xce_controller.state.ClusterState` makes the
rows to commit and the pushes of it (``revoked``, ``expire_revocations``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Final

from xcecore.wire import ErrorCode, RemoteError

Record = dict[str, Any]

TABLE: Final = "revocations"
"""The table (and the replicated kind) of the records."""
MAX_PER_USER: Final = 1000
"""Token records one user may hold at once (each lives until its token would expire)."""
MAX_LIFETIME: Final = 30 * 86400.0
"""The furthest ahead (s) a revocation may say its tokens expire: no token lives longer."""
EXPIRE_BATCH: Final = 1000
"""Records one expiry pass may drop."""
COMPACT_SLACK: Final = 1024
"""Stale heap entries tolerated beyond twice the records held before the heap is rebuilt."""


def token_key(jti: str) -> str:
    """The key of the revocation of token ``jti``."""
    return "t:" + jti


def user_key(user: str) -> str:
    """The key of the revocation of every older token of ``user``."""
    return "u:" + user


class Revocations:
    """The revocation records of one primary (or of a standby that follows), by key, with a
    heap by expiry and a count of token records per user."""

    __slots__ = ("_heap", "per_user", "records")

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.per_user: dict[str, int] = {}  # user -> its "t:" records
        self._heap: list[tuple[float, str]] = []  # (expires, key); stale entries are skipped

    def __len__(self) -> int:
        return len(self.records)

    # -- holding ---------------------------------------------------------------------------

    def put(self, rec: Record) -> None:
        """Hold ``rec`` (a new record, or a newer version of one held)."""
        key = str(rec["key"])
        old = self.records.get(key)
        if old is None and key.startswith("t:"):
            user = str(rec["user"])
            self.per_user[user] = self.per_user.get(user, 0) + 1
        self.records[key] = rec
        heap = self._heap
        heapq.heappush(heap, (float(rec["expires"]), key))
        if len(heap) > 2 * len(self.records) + COMPACT_SLACK:
            # Replaced and removed records leave their entries behind (a standby never
            # expires any): rebuilt from what is held, at most once per so many puts.
            self._heap = [(float(r["expires"]), k) for k, r in self.records.items()]
            heapq.heapify(self._heap)

    def drop(self, key: str) -> Record | None:
        """Forget ``key``; the record it held, or None."""
        old = self.records.pop(key, None)
        if old is not None and key.startswith("t:"):
            user = str(old["user"])
            left = self.per_user.get(user, 0) - 1
            if left > 0:
                self.per_user[user] = left
            else:
                self.per_user.pop(user, None)
        return old

    def take(self, records: Mapping[str, Record]) -> None:
        """Take over the records a load read from the store."""
        for rec in records.values():
            self.put(rec)

    def restore(self, key: str, image: Record | None) -> None:
        """Roll ``key`` back to what the store committed (None: no record)."""
        self.drop(key)
        if image is not None:
            self.put(image)

    # -- transitions -----------------------------------------------------------------------

    def revoke_token(self, jti: str, user: str, expires: float, by: str,
                     now: float) -> Record | None:
        """Revoke the token ``jti`` of ``user`` until ``expires``: the record now held, or
        None for a token that has expired already (it needs none)."""
        _check_expiry(expires, now)
        key = token_key(jti)
        old = self.records.get(key)
        if old is not None and old["user"] != user:
            # Someone named another user's token id: refuse rather than say which user holds it.
            raise RemoteError(ErrorCode.CONFLICT, f"revoke_token: token {jti} is revoked already")
        if expires <= now:
            return None
        if old is None and self.per_user.get(user, 0) >= MAX_PER_USER:
            raise RemoteError(ErrorCode.CONFLICT, (
                f"revoke_token: user {user} has {MAX_PER_USER} revoked tokens that have not "
                "expired yet; revoke all of the user's tokens at once instead (xce admin "
                f"revoke-tokens {user})"), {"user": user, "limit": MAX_PER_USER})
        rec: Record = {"key": key, "user": user, "jti": jti,
                       "expires": max(expires, float(old["expires"]) if old else 0.0),
                       "at": now, "by": by, "rev": 0}
        self.put(rec)
        return rec

    def revoke_user(self, user: str, until: float, by: str, now: float) -> Record:
        """Revoke every token of ``user`` issued before ``now``; the record (now held) lasts
        until ``until``, when the last such token would expire."""
        _check_expiry(until, now)
        key = user_key(user)
        old = self.records.get(key)
        rec: Record = {"key": key, "user": user, "before": now,
                       "expires": max(until, float(old["expires"]) if old else 0.0),
                       "by": by, "rev": 0}
        self.put(rec)
        return rec

    def expire(self, now: float, limit: int = EXPIRE_BATCH) -> list[str]:
        """Drop at most ``limit`` records whose tokens have all expired by ``now`` (from the
        heap: only what is due is looked at); the keys dropped."""
        heap, gone = self._heap, list[str]()
        while heap and heap[0][0] <= now and len(gone) < limit:
            expires, key = heapq.heappop(heap)
            rec = self.records.get(key)
            if rec is None or float(rec["expires"]) != expires:
                continue  # replaced by a later version (its own entry is further on), or gone
            self.drop(key)
            gone.append(key)
        return gone

    def follow(self, records: Mapping[str, Record], removed: Iterable[str]) -> None:
        """A hot standby applies what the primary committed."""
        for key in removed:
            if key not in records:
                self.drop(key)
        for key, rec in records.items():
            self.restore(key, rec)


def _check_expiry(expires: float, now: float) -> None:
    if expires > now + MAX_LIFETIME:
        raise RemoteError(ErrorCode.INVALID, (
            f"revocation: expires {expires:.0f} is more than {MAX_LIFETIME / 86400:g} days ahead; "
            "no token lives that long"), {"arg": "expires"})
