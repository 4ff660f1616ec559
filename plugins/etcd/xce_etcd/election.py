"""The election on etcd: a lease per candidate, a leader key, and a fencing token.

Each candidate holds one lease (``[etcd] lease_ttl``) for its lifetime, renewed by a keeper
thread every quarter TTL; its registration (``<prefix>/candidates/<address>``) lives on it.
Campaigning is one transaction: *if* ``<prefix>/leader`` does not exist, put it (value: the
advertised address) on the candidate's lease. The winner's token is the leader key's
``mod_revision``; the store guards every write with ``mod_revision(leader) == token``, so
once the key is gone (the lease expired or was revoked) or belongs to another candidate, no
write of this one can commit, whatever it believes (a paused, partitioned or zombie primary).

Before every acknowledgement the primary checks a local deadline (:meth:`still_primary`):
the monotonic time at which its last successful keep-alive was *sent*, plus the TTL etcd
granted (less ``drift`` of it for clock-rate differences), less ``safety_margin``. etcd
counts the lease from when it received that keep-alive, which is later, so when the deadline
has not passed the lease is certainly live and no other candidate can hold the leader key.
A primary past its deadline stops acknowledging and gives the role up (the server checks at
every beat too, so it also leaves while idle).

The keeper renews only while the controller's event loop shows it runs (:meth:`heartbeat`
within half a TTL): a primary whose loop is stuck loses its lease like a frozen one, and a
standby takes over after the TTL, without any fencing by signal (there is no other host's
process to signal anyway).

Waiting standbys read the leader key every :data:`POLL` seconds and campaign when there is
none (every :data:`POLL_WATCHED` seconds while a hot standby's watch of the prefix is live:
the watch sees the leader key deleted or written and wakes the campaign at once, so two
standbys do not send etcd 100 reads a second; the campaign's failure branch reads the key,
so a lost race also learns who leads); after a primary's SIGKILL the key goes when etcd
expires its lease, about one TTL later; a graceful stop revokes the lease and the next poll
(or the watch) wins, and so does a primary giving the role up (past its deadline, its
guard failed): it retries the revocation while etcd does not answer (during an etcd
election, after which etcd would renew the lease by a whole TTL and more).

What a standby tells clients (:meth:`takeover_in`): an idle primary puts ``<prefix>/beat``
on its lease at each renewal while its loop runs (none while it commits: a commit is a sign
of life too); a hot standby's watch notes both (:meth:`watch_events`). After
:data:`SILENT_AFTER` TTLs without either, the standby stops naming the primary to clients and
says when it expects to take over, so a client whose link to a stopped, frozen or powered-off
primary went silent waits for the standby instead of dialing the silent primary (a connect
timeout). This is no fencing and decides nothing: the leader key's revision does that.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from loguru import logger

from xce_etcd.client import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Event,
    OutcomeUnknown,
    absent,
    prefix_end,
    put_op,
    range_op,
)
from xce_etcd.layout import BEAT, CHAIN
from xce_etcd.placement import LeaderPlacement
from xce_etcd.settings import EtcdSettings

POLL = 0.02  # seconds between two campaigns of a waiting standby
POLL_WATCHED = 0.2  # the same while its watch of the prefix is live (it wakes the campaign)
CANDIDATES_REFRESH = 1.0  # seconds between two reads of the candidate list (for status)
REVOKE_FOR = 3  # TTLs a candidate giving up keeps trying to revoke its lease (see _revoke)
SILENT_AFTER = 0.7  # TTLs without a sign of the primary after which a standby says it takes over
TAKEOVER_FOR = 2.5  # TTLs of silence after which, the leader key still there, it says so no more
LESSOR_TICK = 0.5  # seconds between two of etcd's checks for expired leases (its lessor loop)
MIN_ETA = 0.05  # the shortest wait a standby asks of a client while the primary is silent


def _safe(address: str) -> str:
    return "".join(c if c.isalnum() or c in ".-:" else "_" for c in address)


class EtcdElection:
    """One candidate's election on etcd (the ``Election`` protocol of ``xce_controller``)."""

    def __init__(self, client: EtcdClient, settings: EtcdSettings, advertise: str) -> None:
        self.client = client
        self.settings = settings
        self.advertise = advertise
        prefix = settings.prefix.encode()
        self.leader_key = prefix + b"/leader"
        self.candidates_prefix = prefix + b"/candidates/"
        self.my_key = self.candidates_prefix + _safe(advertise).encode()
        self.beat_interval = min(0.1, settings.lease_ttl / 10)
        self.lease = 0
        self.granted_ttl = 0
        self.token = 0  # the leader key's mod_revision while this candidate holds it
        self._deadline = 0.0  # monotonic: until then the lease is certainly live
        self._held = False
        self._lost: str | None = None  # why this primary may no longer acknowledge
        self._state = "standby"
        self._registered = ""  # the state last written to the registration (per lease)
        self._loop_beat = 0.0
        self._leader: str | None = None
        self._candidates: list[dict[str, Any]] = []
        self._candidates_at = 0.0
        self._abandoned = threading.Event()
        self._wake = threading.Event()  # the leader key changed: campaign now
        self.watched: Callable[[], bool] = lambda: False  # a live watch calls wake (the store's)
        self.beat_key = prefix + BEAT
        self._chain_key = prefix + CHAIN
        self.committed_at = 0.0  # monotonic: the store's last commit (a primary's sign of life)
        self._activity = 0.0  # monotonic: a standby's watch last saw a sign of the primary
        self._gone = False  # a standby saw the leader key deleted (and no new one yet)
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        # While primary: keep etcd's raft leader off this host and send the write
        # transactions to the raft leader (xce_etcd.placement); everything else asks this
        # host's member first, so that another host's loss costs no request a timeout (a
        # standby's polls, a primary's keep-alives)
        self.placement = LeaderPlacement(settings, advertise,
                                         lambda: self._held and self._lost is None,
                                         on_leader=client.write_to if client.grpc else None)
        if self.placement.local is not None:
            client.prefer(self.placement.local)
        self._keeper = threading.Thread(target=self._keep, name="xce-etcd-lease", daemon=True)
        self._keeper.start()
        self.placement.start()

    # -- the lease ---------------------------------------------------------------------------

    def _keep(self) -> None:
        """Grant, then renew every quarter TTL; register; refresh the cached views."""
        interval = self.settings.lease_ttl / 4
        complained = 0.0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._renew()
                self._refresh()
            except (EtcdUnavailable, OutcomeUnknown, EtcdError) as exc:
                now = time.monotonic()
                if now - complained > 5.0:
                    complained = now
                    logger.warning("controller {}: etcd: cannot renew this candidate's lease "
                                   "({}); retrying every {:g} s{}", self.advertise, exc, interval,
                                   "; as primary it stops acknowledging at its deadline"
                                   if self._held else "")
            self._beat(interval)
            # (from the start of this round: a slow read or beat never delays the next renewal)
            self._stop.wait(max(0.0, started + interval - time.monotonic()))

    def _renew(self) -> None:
        ttl = self.settings.grant_ttl
        timeout = self.settings.lease_ttl / 4
        if self._held and time.monotonic() - self._loop_beat > self.settings.lease_ttl / 2:
            return  # the event loop makes no progress: let the lease run out (see module doc)
        sent = time.monotonic()
        if self.lease:
            got = self.client.lease_keepalive(self.lease, timeout)
            if got <= 0:
                logger.warning("controller {}: etcd: lease {:x} expired{}", self.advertise,
                               self.lease, "; no longer primary" if self._held else "")
                self._lose("its lease expired at etcd")
                self.lease, self._registered = 0, ""
                return
        else:
            self.lease, got = self.client.lease_grant(ttl, timeout)
            self._registered = ""
        self.granted_ttl = got
        deadline = sent + got * (1 - self.settings.drift) - self.settings.safety_margin
        with self._mutex:
            self._deadline = max(self._deadline, deadline) if self.lease else 0.0

    def _beat(self, interval: float) -> None:
        """While primary and idle: put the beat key (on the lease), the standbys' sign that
        this primary still renews (a commit is one too: none while it commits anyway)."""
        now = time.monotonic()
        if not self._held or self._lost is not None or not self.live() or \
                now - self._loop_beat > self.settings.lease_ttl / 2 or now - self.committed_at < interval:
            return
        # Bounded (the next renewal waits for it); a beat missed only makes the standbys tell
        # clients to wait for them sooner, and is no fault of the lease's.
        with contextlib.suppress(EtcdUnavailable, OutcomeUnknown, EtcdError):
            self.client.put(self.beat_key, b"%d" % self.token, self.lease, timeout=interval / 2)

    def _refresh(self) -> None:
        state = self._state
        if state != self._registered and self.lease:
            body = {"address": self.advertise, "pid": os.getpid(), "host": socket.gethostname(),
                    "state": state, "since": time.time(), "lease": f"{self.lease:x}"}
            self.client.put(self.my_key, orjson.dumps(body), self.lease)
            self._registered = state
        now = time.monotonic()
        if now - self._candidates_at >= CANDIDATES_REFRESH:
            self._candidates_at = now
            kvs, _ = self.client.range(self.candidates_prefix, prefix_end(self.candidates_prefix))
            out = []
            for kv in kvs:
                with contextlib.suppress(orjson.JSONDecodeError):
                    entry = orjson.loads(kv.value)
                    if isinstance(entry, dict):
                        out.append(entry)
            self._candidates = out
            held, token = self._held, self.token  # as before the read (a campaign may win meanwhile)
            got = self.client.get(self.leader_key)
            if not held:
                if not self._held:
                    self._name_leader(got.value.decode(errors="replace") if got else None)
                    self._gone = got is None
            elif got is None or got.mod_revision != token:
                # Deleted or replaced under a live lease (by hand?): the guard would fail at
                # the next write; an idle primary must not keep answering as one meanwhile.
                self._lose(f"the leader key {self.leader_key.decode()} is no longer the one it "
                           f"wrote at revision {self.token}")

    def _lose(self, why: str) -> None:
        with self._mutex:
            if self._held and self._lost is None:
                self._lost = why
            self._deadline = 0.0

    def lost(self, why: str) -> None:
        """The store learnt this candidate is no longer the leader (its guard failed)."""
        self._lose(why)

    # -- the Election protocol ---------------------------------------------------------------------

    def live(self) -> bool:
        """True while the lease is certainly live (before the local deadline)."""
        return time.monotonic() < self._deadline

    def _campaign(self) -> bool:
        """Read the leader key; only when there is none, try to put it (one transaction).

        The read first because etcd proposes any transaction with a put through raft (a
        log entry every member writes and fsyncs) even when its compare fails: two standbys
        campaigning every 20 ms would be 100 such entries a second beside the primary's writes.
        A read is answered without the log (a leader's heartbeat round confirms it)."""
        if not self.lease or not self.live():
            return False
        if not self._gone:  # (the watch saw the key deleted: no read, the transaction at once)
            try:
                now = self.client.get(self.leader_key, timeout=self.settings.request_timeout)
            except (EtcdUnavailable, EtcdError, OutcomeUnknown):
                return False
            if now is not None:
                if now.lease == self.lease:  # an earlier campaign whose answer was lost
                    self._won(now.mod_revision)
                    return True
                self._name_leader(now.value.decode(errors="replace"))
                return False
            self._gone, self._leader = True, None
        try:
            res = self.client.txn([absent(self.leader_key)],
                                  [put_op(self.leader_key, self.advertise.encode(), self.lease)],
                                  [range_op(self.leader_key)], timeout=self.settings.request_timeout)
        except (EtcdUnavailable, EtcdError, OutcomeUnknown):
            # Unknown: if it took, the key is ours on our lease; the next campaign sees it.
            return False
        if res.succeeded:
            self._won(res.revision)
            return True
        kvs = res.ranged(0)
        if kvs and kvs[0].lease == self.lease:  # an earlier campaign whose answer was lost
            self._won(kvs[0].mod_revision)
            return True
        self._name_leader(kvs[0].value.decode(errors="replace") if kvs else None)
        self._gone = not kvs
        return False

    def _name_leader(self, leader: str | None) -> None:
        """A standby learnt who leads: another primary than the one it knew is a sign of
        life (the silence :meth:`takeover_in` measures is the new one's, from now)."""
        if leader is not None and leader != self._leader:
            self._activity = time.monotonic()
        self._leader = leader

    def _won(self, revision: int) -> None:
        with self._mutex:
            self.token, self._held, self._lost = revision, True, None
            self._loop_beat = time.monotonic()
            self._leader, self._gone = self.advertise, False
        logger.info("controller {}: etcd: won the election (leader key revision {}, lease {:x}, "
                    "TTL {} s)", self.advertise, revision, self.lease, self.granted_ttl)
        self.placement.nudge()

    def try_acquire(self) -> bool:
        """Campaign once (if the lease is granted already); never blocks for long."""
        return self._campaign()

    def wait(self) -> bool:
        """Campaign every :data:`POLL` s until won (True) or abandoned (False); every
        :data:`POLL_WATCHED` s while a live watch of the prefix wakes it (:meth:`wake`) at
        every change of the leader key."""
        while not self._abandoned.is_set():
            if self._campaign():
                return True
            self._wake.wait(POLL_WATCHED if self.watched() else POLL)
            self._wake.clear()
        return False

    def wake(self) -> None:
        """The leader key changed (a standby's watch saw it): campaign now."""
        self._wake.set()

    def watch_events(self, events: list[Event]) -> None:
        """A standby's watch of the prefix delivered ``events`` (empty: it was opened): note
        the primary's signs of life (its commits, its beats, a new leader key) and the leader
        key's deletion, and campaign at once when the leader key changed."""
        now = time.monotonic()
        if not events:  # (re)opened: silence counts from here, not from before it
            self._activity = now
            return
        keys = [ev.key for ev in events]  # (a standby's hot path: list scans in C, no loop)
        if self._chain_key in keys or self.beat_key in keys:  # (a beat's delete: the lease went,
            self._activity = now  # and the leader key's delete comes with it)
        if self.leader_key not in keys:
            return
        for ev in events:
            if ev.key == self.leader_key:
                with self._mutex:
                    if not self._held:
                        self._name_leader(None if ev.deleted else ev.value.decode(errors="replace"))
                    self._gone = ev.deleted
                if not ev.deleted:  # (a new leader key: a sign of life, whoever wrote it)
                    self._activity = now
        self._wake.set()

    def takeover_in(self, primary: str | None) -> float | None:
        """Seconds until this standby expects to take over from ``primary`` (what the
        controller tells a client instead of naming it, :meth:`current_primary`): 0 while
        the leader key is gone and it campaigns (or it won and promotes); while its live
        watch has shown no sign of ``primary`` (a commit, a beat) for :data:`SILENT_AFTER`
        TTLs, when etcd should expire its lease (at least :data:`MIN_ETA`): a primary that
        stopped, froze or lost its host. A client then waits for this standby instead of
        dialing the silent primary and timing out. None otherwise, and after
        :data:`TAKEOVER_FOR` TTLs of silence with the leader key still there (the silence
        was this standby's, not the primary's: name the primary again). Cheap: read-only."""
        if self._held:
            return 0.0 if self._lost is None else None
        if not self.lease or not self.live():
            return None  # this candidate cannot campaign now
        if self._gone:
            return 0.0
        if primary is None or primary != self._leader or not self.watched():
            return None
        ttl = self.granted_ttl or self.settings.grant_ttl
        now = time.monotonic()
        silent = now - self._activity
        if not SILENT_AFTER * ttl <= silent <= TAKEOVER_FOR * ttl:
            return None
        return max(MIN_ETA, self._activity + ttl + LESSOR_TICK / 2 - now)

    def abandon(self) -> None:
        """Make :meth:`wait` return False."""
        self._abandoned.set()
        self._wake.set()

    def publish(self) -> None:
        """Nothing to do: the leader key names this candidate since the campaign."""

    def current_primary(self) -> str | None:
        """The leader key's address as last read (never blocks: called on the event loop)."""
        return self._leader

    def register(self, state: str) -> None:
        """Record ``state`` (written by the keeper thread, on this candidate's lease)."""
        self._state = state

    def candidates(self) -> list[dict[str, Any]]:
        """The registered candidates as last read (every second)."""
        return list(self._candidates)

    def heartbeat(self, at: float | None = None) -> None:
        """The event loop made progress at ``at`` (monotonic; None: now): the keeper may keep
        renewing."""
        self._loop_beat = time.monotonic() if at is None else at

    def still_primary(self) -> str | None:
        """None while this candidate may acknowledge; else why not."""
        if not self._held:
            return "it does not hold the etcd leader key"
        if self._lost is not None:
            return self._lost
        left = self._deadline - time.monotonic()
        if left <= 0:
            return (f"it cannot prove its etcd lease live (no keep-alive answered for "
                    f"{self.granted_ttl - left:.2f} s of its {self.granted_ttl} s TTL)")
        return None

    def describe(self) -> dict[str, Any]:
        """The backend, the lease holder and its TTL (for ``status``)."""
        return {"backend": "etcd", "endpoints": list(self.settings.endpoints),
                "prefix": self.settings.prefix, "leader": self._leader,
                "lease_ttl": self.granted_ttl or self.settings.grant_ttl,
                "lease_left": round(max(0.0, self._deadline - time.monotonic()), 3) if self._held else None}

    def release(self) -> None:
        """Stop renewing and revoke the lease (the leader key and registration go with it)."""
        self._abandoned.set()
        self._stop.set()
        self.placement.stop()
        if threading.current_thread() is not self._keeper:  # its request ends within its timeout
            self._keeper.join(self.settings.lease_ttl)
        with self._mutex:
            lease, self.lease, self._held, self._deadline = self.lease, 0, False, 0.0
        if lease:
            self._revoke(lease)

    def _revoke(self, lease: int) -> None:
        """Revoke ``lease``, again while etcd does not answer, for as long as the lease may
        still live there: a new raft leader renews every lease by its TTL plus an election
        timeout, so a primary that gave up during an etcd election would otherwise hold the
        standbys off for that long after it. Safe at any time: this candidate acknowledges
        nothing any more, and every write it may still have in flight is guarded."""
        ttl = self.granted_ttl or self.settings.grant_ttl
        give_up = time.monotonic() + REVOKE_FOR * ttl
        tries = 0
        while True:
            tries += 1
            left = give_up - time.monotonic()
            try:
                self.client.lease_revoke(lease, max(0.05, min(self.settings.request_timeout, left)))
                if tries > 1:
                    logger.info("controller {}: etcd: revoked lease {:x} at try {}", self.advertise,
                                lease, tries)
                return
            except EtcdError as exc:  # answered: retrying cannot help
                logger.warning("controller {}: etcd: could not revoke lease {:x} ({}); it "
                               "expires in {} s", self.advertise, lease, exc, ttl)
                return
            except (EtcdUnavailable, OutcomeUnknown) as exc:
                if time.monotonic() + 0.05 >= give_up:
                    logger.warning("controller {}: etcd: could not revoke lease {:x} in {} tries "
                                   "({}); it expires on its own", self.advertise, lease, tries, exc)
                    return
            time.sleep(0.05)
