"""Keeping etcd's raft leader off the primary's host (``[etcd] local_member``).

Why: when one host holds both the primary and the etcd member leading raft, losing that host
(power-off, a freeze, a cut) costs etcd an election first (0.6-1.2 s with the operator's
flags), and a new raft leader renews every lease by its TTL plus an election timeout: the dead
primary's lease then lives about 2.5 s past the fault instead of one TTL. With the raft leader
on another host, the same fault costs what a SIGKILL costs: one lease TTL.

So a primary asks the etcd member on its own host, when it wins and then every
:data:`CHECK_EVERY` seconds while it is primary (one ``Maintenance.Status``: cheap), whether
it leads raft; if so it asks that member to hand leadership to another member
(``Maintenance.MoveLeader``, which only the leader takes: the JSON gateway's
``/v3/maintenance/transfer-leadership``). The target is the answering member with the
highest applied raft index (the most caught up, so the handover is quickest).

Which member is on the candidate's host is configured or derived: ``local_member`` is one of
the ``[etcd] endpoints`` (a URL) or ``"auto"`` (the default): the one endpoint whose host is
the host of the candidate's advertised address, as on a host that runs both with one address
(the bed, ``examples/configs/three-hosts.toml``); ``"none"`` turns this off (etcd elsewhere,
the site's own). Derived rather than asked of etcd because only the candidate knows which
address is its host's, and the endpoints are what it reaches etcd by; configurable because
a host may advertise one address and serve etcd on another. A derivation that finds no
endpoint, or several (every member on one host: nothing to gain), logs once and does
nothing.

**Writes go to the raft leader.** The same check learns which member leads (every member's
status names the leader; ``Maintenance.Status`` of each endpoint names its member) and points
the store's write transactions at it (:meth:`~xce_etcd.client.EtcdClient.write_to`): a
transaction sent to a follower is forwarded to the leader, and the follower answers only once
it has applied the entry itself, which it learns from the leader's next message -- two more
hops between processes per commit than at the leader (measured in RESULTS.md's etcd
section). Everything else keeps going to the local member first. When the leader changes, a
write in flight to the old one gets no answer and is resolved as any unknown outcome, the
next goes to the next endpoint, and the next check (at most :data:`CHECK_EVERY` later)
points the writes at the new leader. This runs whether or not a local member is known.

The check runs on a thread of its own, never the lease keeper's: a move takes a raft round
trip or more and must not delay a keep-alive. A move is safe at any time: etcd renews every
lease on a leader change (longer leases at etcd only make the standbys wait longer; the
primary's own deadline is counted from its keep-alives), and a write in flight during the
handover that gets no answer is resolved by the store as any unknown outcome.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from loguru import logger

from xce_etcd.client import EtcdClient, EtcdError, EtcdUnavailable, OutcomeUnknown
from xce_etcd.settings import EtcdSettings
from xcecore.candidates import CandidateError, parse_address

CHECK_EVERY = 2.0  # seconds between two checks of a primary (one status request)
AUTO, NONE = "auto", "none"


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """What a member's ``Maintenance.Status`` says, reduced to what placement needs."""

    endpoint: str
    member_id: int
    leader: int
    applied: int


def status_of(endpoint: str, raw: Mapping[str, Any]) -> MemberStatus:
    """A :class:`MemberStatus` from the gateway's status answer."""
    return MemberStatus(endpoint, int(raw.get("header", {}).get("member_id", 0) or 0),
                        int(raw.get("leader", 0) or 0), int(raw.get("raftAppliedIndex", 0) or 0))


def local_endpoint(spec: str, endpoints: tuple[str, ...], advertise: str) -> str | None:
    """The endpoint of the etcd member on this candidate's host, or None (``spec`` "none", or
    "auto" and no endpoint's host is the advertised one). ValueError for a URL that is not
    one of the endpoints."""
    if spec == NONE:
        return None
    if spec != AUTO:
        wanted = spec.rstrip("/")
        if wanted not in (e.rstrip("/") for e in endpoints):
            raise ValueError(f"etcd.local_member {spec!r} is not one of etcd.endpoints "
                             f"({', '.join(endpoints)}), \"auto\" or \"none\"")
        return wanted
    try:
        host = parse_address(advertise).host
    except CandidateError:
        return None
    here = [e.rstrip("/") for e in endpoints if urlsplit(e).hostname == host.lower()]
    return here[0] if len(here) == 1 else None  # several: one host runs them all, no gain


def move_target(local: MemberStatus, others: list[MemberStatus]) -> MemberStatus | None:
    """Where leadership should go: None unless ``local`` leads; else the most caught-up other
    member that answered (None when none did: better a leader here than none)."""
    if not local.member_id or local.leader != local.member_id:
        return None
    rest = [m for m in others if m.member_id and m.member_id != local.member_id]
    return max(rest, key=lambda m: m.applied, default=None)


class LeaderPlacement:
    """The thread that keeps the raft leader off this candidate's host while it is primary."""

    def __init__(self, settings: EtcdSettings, advertise: str, is_primary: Callable[[], bool],
                 client_for: Callable[[str], EtcdClient] | None = None,
                 on_leader: Callable[[str], bool] | None = None) -> None:
        self.settings = settings
        self.on_leader = on_leader  # told the raft leader's endpoint (True: a new route)
        self.routes = 0  # how often the writes were pointed at a new leader (tests)
        self.advertise = advertise
        self.is_primary = is_primary
        self.local = local_endpoint(settings.local_member, settings.endpoints, advertise)
        self.moves = 0  # for tests and benchmarks
        self._client_for = client_for or self._new_client
        self._clients: dict[str, EtcdClient] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._complained = 0.0
        if self.local is None and settings.local_member == AUTO:
            logger.info("controller {}: etcd: not one endpoint on this candidate's host ({}); the "
                        "raft leader is not kept off it (set [etcd] local_member to name its "
                        "member)", advertise, ", ".join(settings.endpoints))

    def _new_client(self, endpoint: str) -> EtcdClient:
        s = self.settings
        return EtcdClient([endpoint], timeout=s.request_timeout, ca_file=s.ca_file,
                          cert_file=s.cert_file, key_file=s.key_file)

    def _client(self, endpoint: str) -> EtcdClient:
        c = self._clients.get(endpoint)
        if c is None:
            c = self._clients[endpoint] = self._client_for(endpoint)
        return c

    def start(self) -> None:
        """Start the thread (nothing to do without a local member nor a route to keep)."""
        if (self.local is not None or self.on_leader is not None) and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="xce-etcd-placement", daemon=True)
            self._thread.start()

    def nudge(self) -> None:
        """Check now (the candidate just became primary)."""
        self._wake.set()

    def stop(self) -> None:
        """End the thread and close its clients."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(2 * self.settings.request_timeout + 1)
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(CHECK_EVERY)
            self._wake.clear()
            if self._stop.is_set() or not self.is_primary():
                continue
            try:
                self.check()
            except (EtcdUnavailable, OutcomeUnknown, EtcdError) as exc:
                now = time.monotonic()
                if now - self._complained > 30.0:
                    self._complained = now
                    logger.warning("controller {}: etcd: cannot check where the raft leader is "
                                   "({}); checking again every {:g} s", self.advertise, exc,
                                   CHECK_EVERY)

    def _status(self, endpoint: str, timeout: float) -> MemberStatus:
        return status_of(endpoint, self._client(endpoint).status(timeout=timeout))

    def check(self) -> bool:
        """One check: True when it moved leadership away from the local member. Points the
        writes at the leader (``on_leader``) either way."""
        timeout = self.settings.request_timeout
        statuses: list[MemberStatus] = []
        local: MemberStatus | None = None
        failures: list[str] = []
        for e in self.settings.endpoints:
            e = e.rstrip("/")
            try:
                st = self._status(e, timeout if e == self.local else timeout / 2)
            except (EtcdUnavailable, OutcomeUnknown, EtcdError) as exc:
                failures.append(f"{e}: {exc}")
                continue  # down or cut off: not a target
            statuses.append(st)
            if e == self.local:
                local = st
        if not statuses:
            raise EtcdUnavailable("no member answered a status: " + "; ".join(failures))
        leader = next((st.leader for st in statuses if st.leader), 0)
        moved = False
        target = None if local is None else move_target(local, [s for s in statuses if s is not local])
        if local is not None and target is not None:
            start = time.monotonic()
            self._client(local.endpoint).post("/v3/maintenance/transfer-leadership",
                                              {"targetID": str(target.member_id)}, 2 * timeout)
            self.moves += 1
            moved, leader = True, target.member_id
            logger.info("controller {}: etcd: moved raft leadership from the member on this host "
                        "({}, {:x}) to {} ({:x}) in {:.0f} ms, so that losing this host costs one "
                        "lease TTL", self.advertise, local.endpoint, local.member_id,
                        target.endpoint, target.member_id, (time.monotonic() - start) * 1e3)
        at = next((st.endpoint for st in statuses if leader and st.member_id == leader), None)
        if at is not None and self.on_leader is not None and self.on_leader(at):
            self.routes += 1
            logger.debug("controller {}: etcd: write transactions go to the raft leader, {}",
                         self.advertise, at)
        return moved
