"""The controller server: listener, handshake, per-connection reader and writer, HA roles.

A candidate starts as a standby: it listens, answers handshakes with ``state: standby`` and
every request with REDIRECT (or NO_PRIMARY), while a thread waits on the election. When the
election is won it promotes: loads the store, starts the writer thread, and serves as primary.

Each request is applied to the in-memory state on the event loop, in arrival order; a write's
rows go to the store's writer thread, and its reply (like every push and every later reply)
waits, in its connection's outbox, for that commit to be durable.

No request can end the process: each is answered on its own, every encoding of what it
produced happens before anything is queued or committed (:meth:`Controller.apply`), and its
arguments are checked to be encodable before its handler may change anything
(:mod:`xce_controller.isolation`). Every connection is bounded (:mod:`xce_controller.pushes`,
:mod:`xce_controller.framing`). A commit that fails rolls the state back and turns the primary
into a read-only one until the store works again (:mod:`xce_controller.storage`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import itertools
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import orjson
from anyio.abc import ByteStream, SocketAttribute, SocketStream, TaskStatus
from loguru import logger

from xce_controller import members, sync
from xce_controller.admission import Admission
from xce_controller.authz import Policy
from xce_controller.beat import LoopBeat
from xce_controller.changes import ChangeRing, VolatileLog
from xce_controller.delegate import SCHEMAS as DELEGATED_SCHEMAS
from xce_controller.delegate import Delegates
from xce_controller.election import Election, FileLockElection
from xce_controller.events import EventLog, row_key
from xce_controller.framing import FrameReader
from xce_controller.isolation import check_encodable, label, request_id
from xce_controller.jobs import Job
from xce_controller.metrics import CommitStats
from xce_controller.ops import OPS, WORKER, Caller, OpSpec, build_validators, check_call, now
from xce_controller.pushes import (
    ErrorFrame,
    Fanout,
    Gate,
    Limits,
    Outbox,
    Stalled,
    Total,
    encode,
    encode_events,
    encode_rows,
    reply_frame,
)
from xce_controller.ridfilter import RidFilter
from xce_controller.settings import ControllerSettings, parse_listen
from xce_controller.standby import Follower, clean_width, load_rest
from xce_controller.state import EXPIRE_BATCH, Changes, ClusterState, Event
from xce_controller.storage import Inflight, StorageGuard
from xce_controller.store import KINDS, Row, SQLiteStore, Write
from xce_controller.subscribe import Subscription
from xcecore import auth, wire
from xcecore.bridge import LoopBridge
from xcecore.log import bind_fields
from xcecore.protocol import format_hostport as format_address
from xcecore.schema.verdict import TAKEOVER_MS_MAX
from xcecore.tls import TLS, TLSFailed, handshake
from xcecore.wire import ErrorCode, RemoteError

ElectionFactory = Callable[[str, str], Any]
StoreFactory = Callable[[str], Any]
HANDSHAKE_MAX_FRAME = 64 * 1024
CLEAN_INTERVAL = 60.0  # longest pause between two passes of the finished-job cleaner
CLEAN_BATCH = 5000  # most finished jobs one cleaner pass removes
HOUSEKEEPING_INTERVAL = 5.0  # seconds between two store housekeeping writes
RECENT_SECONDS = 30.0  # how long a result committed during a store lookup is kept for it
SWEEP_PARTS = 16  # idempotency-filter partitions swept per host-expiry pass
EXPIRE_STEPS = 10  # host-expiry steps (EXPIRE_BATCH hosts each, a loop pass each) per period
ACCEPT_BATCH = 512  # most connections accepted per wake-up of the accept loop
MAX_HANDSHAKES = 256  # handshakes in progress at once (xce_controller.admission)
FREEZE_STEP = 1000  # more connections than at the last gc.freeze: freeze again (_freeze_growth)
ADMISSION_HOLD = 2.0  # longest a handshake in progress keeps its slot, seconds
AUTH_THREADS = 16  # handshakes verifying a blocking credential (munge) at once
ABANDONED_REPORT_INTERVAL = 5.0  # seconds between reports of handshakes clients gave up on


def _peer_of(sock: socket.socket) -> str:
    """The client's ``host:port`` for log lines ("?" when the socket cannot say).

    Asked of the accepted socket itself: anyio's ``extra()`` builds its table of every
    attribute for each lookup (about 10 % of a primary's CPU in a join storm, twice per
    connection)."""
    try:
        raw = sock.getpeername()
    except OSError:
        return "?"
    return f"{raw[0]}:{raw[1]}" if isinstance(raw, tuple) else str(raw)


async def _send_first(stream: ByteStream, sock: socket.socket | None, msg: dict[str, Any]) -> None:
    """Write a handshake message, straight to ``sock`` when it takes it all (nothing else is
    ever unsent on a connection during its handshake); the rest, if any, through ``stream``."""
    data = wire.encode(msg)
    sent = wire.write_now(sock, data)
    if sent < len(data):
        await stream.send(data[sent:])


TOMBSTONE = b'{"outcome":"not_applied","tombstone":true}'
"""The idempotency-table entry of a key that the ``outcome`` op declared not applied."""
LOOKUP_FAILED = b""
"""What a request's preparation found when the store could not be read (it is refused)."""


class Connection:
    """One client connection: its identity, outbox, and the scope that closes it."""

    def __init__(self, cid: int, caller: Caller, peer: str, outbox: Outbox,
                 sock: socket.socket | None = None) -> None:
        self.cid = cid
        self.caller = caller
        self.peer = peer
        self.outbox = outbox
        outbox.owner = self
        self.sock = sock
        self.scope: anyio.CancelScope | None = None
        self.tg: anyio.abc.TaskGroup | None = None  # the connection's tasks (its sync runs there)
        self.sync_scope: anyio.CancelScope | None = None  # the sync streaming to it, if any
        self.held_back = False  # its requests were left unread once (logged once)

    def close(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    def abort(self) -> None:
        """Close with a reset: a peer that takes nothing must not keep what the kernel still
        holds for it (a graceful close queues the FIN behind megabytes it will never read,
        and the socket lingers as an orphan)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()


class Controller:
    """One controller candidate."""

    def __init__(
        self,
        settings: ControllerSettings,
        election_factory: ElectionFactory = FileLockElection,
        store_factory: StoreFactory = SQLiteStore,
    ) -> None:
        self.settings = settings
        self._election_factory = election_factory
        self._store_factory = store_factory
        self.address = ""
        self.port = 0
        self.role = "standby"  # standby -> promoting -> primary -> stopping
        self.since = time.time()
        self.state = ClusterState(settings.conf)
        self.auth = settings.auth
        self.users = auth.Users()
        self.policy = make_policy(settings, self.users)
        self._auth_threads = anyio.CapacityLimiter(AUTH_THREADS)
        self.election: Election | None = None
        self.store: Any = None
        self.fanout = Fanout("")
        self.conns: dict[int, Connection] = {}
        # Revisions: the last one given to a write, the last one committed; the retention
        # window; which idempotency keys have a committed result (their results: the store).
        self.rev = 0
        self.committed_rev = 0
        self.store_id = ""
        self.ring = ChangeRing(settings.change_retention)
        self.volatile = VolatileLog(settings.change_retention)  # a new epoch every term
        self.rids = RidFilter()
        self.pending: dict[str, tuple[bytes, Gate]] = {}
        # Results committed while a store lookup was in flight (a lookup that found nothing
        # must still see a copy of its key that committed meanwhile), and the lookups' results.
        self._lookups = 0
        self._recent: dict[str, tuple[float, bytes]] = {}
        self._recalled: dict[str, bytes | None] = {}
        self.loading: anyio.Event | None = None  # set while a new primary loads its jobs
        self.follower: Follower | None = None  # a standby's copy of the state
        self.promotion: dict[str, Any] = {}  # how the last promotion went (status, tests)
        self.last_gate: Gate | None = None
        self.unstable: deque[Write] = deque()  # submitted, not yet reported by the writer
        self.storage = StorageGuard(self)
        self._store: Any = None  # made at start: a standby follows through it
        self.limits = Limits(settings.max_subscriber_queue, settings.max_inflight,
                             settings.max_unsent_bytes, settings.stall_timeout)
        self.promoted = anyio.Event()
        self.stopped = anyio.Event()
        self.promote_ms: float | None = None
        self.old_primary: str | None = None  # the primary this candidate saw while standby
        self._last_event: bytes | None = None  # the newest stored event, read at promotion
        self.requests: dict[str, int] = {}  # op -> requests answered (xce_controller.metrics)
        self._reloaded: ControllerSettings | Exception | None = None  # for the next reconfig
        self.conn_roles: dict[str, int] = {}  # claimed role -> connections (metrics)
        self.unsent = Total()  # bytes every connection's outbox holds unsent (metrics)
        self.commits = CommitStats()
        self._cids = itertools.count(1)
        self.abandoned = 0  # handshakes the client gave up on, since the last report
        self._loop_beat = LoopBeat()  # the loop's progress; beats once primary (_beat)
        self._frozen_conns = 0  # connections open at the last gc.freeze (_freeze_growth)
        self.admission = Admission(MAX_HANDSHAKES, ADMISSION_HOLD)
        self.admission.on_room = self._admission_opened
        self._admission_room: anyio.Event | None = None  # set when the accept loops may go on
        self._tg: anyio.abc.TaskGroup | None = None
        self._writer_done = anyio.Event()
        self._fenced: str | None = None  # why this primary may no longer acknowledge
        self.delegates = Delegates(self.conns, lambda: self.policy,
                                   lambda: self.settings.max_frame, self.spawn, lambda: self.address,
                                   settings.delegate_timeout)

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[Controller] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen, stand by, promote when elected, serve until shutdown or cancellation."""
        host, port = parse_listen(self.settings.listen)
        self.auth.check_peer_hosts([host])
        if self.auth.name == "key" and getattr(self.auth, "key", None) is None:
            logger.warning("controller: no cluster key configured; accepting loopback peers only")
        try:
            listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {format_address(host, port)}: "
                          f"{exc.strerror or exc}") from None
        self.port = int(listener.extra(SocketAttribute.local_port))
        self.address = self.settings.advertise or format_address(host, self.port)
        self.fanout.server = self.address
        self.election = self._election_factory(self.settings.state_dir, self.address)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for sub in getattr(listener, "listeners", [listener]):
                    tg.start_soon(self._accept_loop, sub.extra(SocketAttribute.raw_socket), tg)
                tg.start_soon(self._report_abandoned)
                self.election.register("standby")
                bind_fields(candidate=self.address)  # a JSON log line's "candidate"
                logger.info(
                    "controller {}: candidate started (state dir {}); standby until it holds the lock",
                    self.address, self.settings.state_dir,
                )
                pol = self.policy
                logger.info(
                    "controller {}: callers authenticate with {}{}; administrators: root, {}; "
                    "service users: root, {}; grants: {}", self.address, self.auth.name,
                    f" (every key holder is the owner, {pol.owner})" if pol.owner else "",
                    ", ".join(sorted(pol.admins - {"root"})) or "no others",
                    ", ".join(sorted(pol.service_users - {"root"})) or "no others",
                    "; ".join(f"{r}: {', '.join(sorted(o))}" for r, o in sorted(pol.grants.items()))
                    or "none")
                task_status.started(self)
                # Build the ops' validators while standing by (on a thread: the loop serves
                # meanwhile), so a promotion's first requests do not pay for them.
                tg.start_soon(anyio.to_thread.run_sync, self._build_validators)
                # Import SQLite now, while standing by, so promotion does not pay for it.
                await anyio.to_thread.run_sync(importlib.import_module, "sqlite3")
                self._store = self._store_factory(self.settings.state_dir)
                await self._wait_for_lock()
                tg.start_soon(self._beat)
                await self._promote()
                await self.stopped.wait()
                await self._stop_primary()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
                await self._cleanup()

    @staticmethod
    def _build_validators() -> None:
        build_validators(DELEGATED_SCHEMAS)

    async def _accept_loop(self, sock: socket.socket, tg: anyio.abc.TaskGroup) -> None:
        """Accept every pending connection at each wake-up, a task for each.

        anyio's ``serve`` accepts one connection per event-loop pass; with thousands of members
        connected, a pass is long, and a join storm then overflows the kernel's listen backlog:
        dropped SYNs come back only after TCP's 1, 3, 7, 15 s retransmissions.
        """
        admission = self.admission
        while True:
            if admission.room(time.monotonic()) <= 0:
                # Full: the next connections wait in the kernel's accept queue (see
                # xce_controller.admission) until a quarter of the slots is free or expires.
                room = self._admission_room = self._admission_room or anyio.Event()
                with anyio.move_on_after(admission.next_expiry(time.monotonic())):
                    await room.wait()
                continue
            await anyio.wait_readable(sock)
            for _ in range(min(ACCEPT_BATCH, admission.room(time.monotonic()))):
                try:
                    conn, _addr = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:  # EMFILE and the like: say so, back off, keep serving
                    logger.error("controller {}: cannot accept a connection: {}; retrying in 0.1 s",
                                 self.address, exc)
                    await anyio.sleep(0.1)
                    break
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tg.start_soon(self._accepted, conn, admission.admit(time.monotonic()))
                self._progress()
            await anyio.lowlevel.checkpoint()

    def _admission_opened(self) -> None:
        room, self._admission_room = self._admission_room, None
        if room is not None:
            room.set()

    async def _accepted(self, conn: socket.socket, handshake_done: Callable[[], None]) -> None:
        try:
            try:
                stream: ByteStream = await SocketStream.from_socket(conn)
            except OSError:  # the client is already gone
                conn.close()
                return
            peer = _peer_of(conn)
            tls = self.settings.tls
            if tls is not None:
                secured = await self._tls_handshake(stream, tls, peer)
                if secured is None:
                    return
                stream = secured
            await self._handle(stream, peer, conn, handshake_done)
        finally:
            handshake_done()

    async def _tls_handshake(self, stream: ByteStream, tls: TLS, peer: str) -> ByteStream | None:
        """``stream`` made TLS (within the handshake timeout), or None when it failed (said
        once, naming the client and the problem, and closed)."""
        try:
            with anyio.fail_after(self.settings.handshake_timeout):
                return await handshake(stream, tls, peer=f"client {peer}")
        except TLSFailed as exc:
            logger.warning("controller {}: TLS handshake refused: {}; closing", self.address, exc)
        except TimeoutError:
            logger.warning("controller {}: TLS handshake from {} timed out (a client without "
                           "[tls] waits for our hello); closing", self.address, peer)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # A probe (connect and close) or a client that gave up: nothing worth a line.
            logger.debug("controller {}: {} closed the connection during the TLS handshake",
                         self.address, peer)
        with anyio.CancelScope(shield=True), contextlib.suppress(OSError, anyio.BrokenResourceError):
            await stream.aclose()
        return None

    async def _report_abandoned(self) -> None:
        """One line every ``ABANDONED_REPORT_INTERVAL`` s while clients abandon handshakes."""
        while True:
            await anyio.sleep(ABANDONED_REPORT_INTERVAL)
            self._log_abandoned()

    def _log_abandoned(self) -> None:
        if self.abandoned:
            logger.warning(
                "controller {}: {} client(s) closed the connection before finishing the "
                "handshake in the last {:g} s at most (they gave up waiting: this candidate is "
                "busy, e.g. a join storm; they retry with back-off)",
                self.address, self.abandoned, ABANDONED_REPORT_INTERVAL,
            )
            self.abandoned = 0

    async def _wait_for_lock(self) -> None:
        """Block on the election in a daemon thread (a blocked flock cannot be cancelled);
        meanwhile a follower keeps a copy of the state (a hot standby)."""
        election = self.election
        assert election is not None
        won = anyio.Event()
        token = anyio.lowlevel.current_token()

        def waiter() -> None:
            ok = election.wait()
            if ok:
                try:
                    anyio.from_thread.run_sync(won.set, token=token)
                except Exception:  # the loop ended while we waited: let the lock go
                    election.release()

        if election.try_acquire():
            return
        primary = election.current_primary()
        self.old_primary = primary if primary != self.address else None
        logger.info(
            "controller {}: standby; primary is {}; following its commits, waiting on the "
            "state-dir lock", self.address, primary or "not known",
        )
        if hasattr(self._store, "snapshot"):
            self.follower = Follower(self._store, self.settings, self.address)
            self.follower.start()
        threading.Thread(target=waiter, name="xce-election-wait", daemon=True).start()
        await won.wait()

    async def _beat(self) -> None:
        """Beat from the moment this candidate holds the lock: a thread beats while the loop
        makes progress (:class:`~xce_controller.beat.LoopBeat`: a busy loop is not a hung one,
        a blocked, deadlocked or stopped one still stops beating); this timer is the progress
        of an idle loop, and checks that this primary may still acknowledge."""
        election = self.election
        assert election is not None
        interval = election.beat_interval
        beat = self._loop_beat
        beat.name = self.address
        beat.start(election, interval)
        try:
            while True:
                beat.progress()
                self._freeze_growth()
                # Also while idle: a primary whose election says it may no longer acknowledge
                # (an etcd lease it cannot prove live, a fence mark) gives the role up now.
                if self.role == "primary" and self._fenced is None and election.still_primary() is not None:
                    self._may_acknowledge(0)
                await anyio.sleep(interval)
        finally:
            beat.stop()

    def _freeze_growth(self) -> None:
        """Move the heap to the collector's permanent generation (``gc.freeze``) each time
        :data:`FREEZE_STEP` more connections are open than at the last freeze.

        A join storm's objects (a few hundred per connection) all survive: with the
        controller's thresholds (``plugin.GC_THRESHOLDS``) a generation-1 collection then
        walked up to a million of them, and full ones the whole heap, each in one piece on
        the loop: over 2 s under load, and the standbys fenced the primary during a
        collection (seen: "GC gen1 START" 2.05 s before the fence). Frozen, a connection's
        objects are never walked again; they are still freed by reference counting when it
        closes. The price: a reference cycle among objects frozen while alive is not
        collected when it becomes garbage (what a closed connection leaves in cycles); only
        growth by a whole step freezes, so steady churn never does."""
        n = len(self.conns)
        if n < self._frozen_conns:
            self._frozen_conns = n
        elif n >= self._frozen_conns + FREEZE_STEP:
            self._frozen_conns = n
            gc.freeze()

    def _progress(self) -> None:
        """The loop served something (a connection, a message, a writer's wake-up): what the
        beat thread reports to the standbys (:mod:`xce_controller.beat`). One clock read."""
        self._loop_beat.progress()

    async def _promote(self) -> None:
        assert self.election is not None and self._tg is not None
        t0 = time.perf_counter()
        self.role = "promoting"
        before = self.election.current_primary()  # still the old one's (file), or None
        if before and before != self.address:
            self.old_primary = before
        self.election.publish()
        store = self._store
        follower, self.follower = self.follower, None
        self.volatile = VolatileLog(self.settings.change_retention)
        hot = follower is not None and follower.loaded.is_set()
        if hot:
            assert follower is not None
            try:
                await self._promote_hot(store, follower)
            except Exception as exc:  # e.g. the store could not be read to catch up
                logger.opt(exception=True).warning(
                    "controller {}: promotion: the hot standby's catch-up failed ({}); loading "
                    "the state from the store instead", self.address, exc)
                hot = False
        if not hot:
            if follower is not None:
                follower.stop()  # not loaded yet: this candidate loads as a cold one
            await self._promote_cold(store)
        self.store = store
        log = self._event_log()
        self._tg.start_soon(self._run_writer, store)
        self._tg.start_soon(self._expire_hosts)
        self._tg.start_soon(self._housekeep)
        self.role = "primary"
        if self.settings.clean_period > 0:
            self._tg.start_soon(self._clean_finished)
        self.since = time.time()
        self.promote_ms = (time.perf_counter() - t0) * 1000
        self.promotion["ms"] = self.promote_ms
        self.election.register("primary")
        p = self.promotion
        log.record("promotion", time.time(), primary=self.address, old_primary=self.old_primary,
                   how=p["how"], takeover_ms=round(self.promote_ms, 3),
                   catch_up_ms=p.get("catch_up_ms"), changes=p.get("changes"),
                   jobs=p.get("jobs"))
        self._save_events()
        self.promoted.set()
        if p["how"] == "hot":
            logger.info(
                "controller {}: acquired the state-dir lock; promoted to primary (hot standby: "
                "caught up {} change(s) and {} idempotency key(s) since its last catch-up, at "
                "rev {}; {} jobs, {} hosts in memory) in {:.1f} ms", self.address, p["changes"],
                p["keys"], self.rev, len(self.state.jobs), len(self.state.hosts), self.promote_ms)
        else:
            logger.info(
                "controller {}: acquired the state-dir lock; promoted to primary (rev {}, {} "
                "hosts, {} queues; taking writes while {} jobs load) in {:.1f} ms",
                self.address, self.rev, len(self.state.hosts), len(self.state.queues),
                p["jobs"], self.promote_ms)

    async def _promote_hot(self, store: Any, follower: Follower) -> None:
        """Stop following, read what the old primary committed since, take the state."""

        def finish() -> Any:
            follower.stop()
            with follower.lock:  # the follower's thread may be inside a catch-up
                caught = follower.catch_up()
            if not follower.loaded.is_set():  # it had to reload, and that failed
                raise RuntimeError("the standby's copy could not be reloaded")
            store.open()
            self._last_event = self._newest_event(store)
            return caught

        caught = await anyio.to_thread.run_sync(finish)
        state = follower.state
        assert state is not None
        state.seen_all(now())  # every worker gets a full timeout to re-join
        self.state, self.ring, self.rids = state, follower.ring, follower.rids
        self.rev = self.committed_rev = follower.rev
        self.store_id = follower.store_id
        gc.freeze()  # what the follower built since its load lives on too
        self.promotion = {"how": "hot", "changes": caught.changes, "keys": caught.keys,
                          "catch_up_ms": caught.ms, "followed": follower.followed,
                          "snapshots": follower.snapshots, "jobs": len(state.jobs)}

    async def _promote_cold(self, store: Any) -> None:
        """Read meta, hosts and queues, and take writes; the jobs load on a thread."""

        def open_head() -> Any:
            store.open()
            self._last_event = self._newest_event(store)
            return store.head()

        head = await anyio.to_thread.run_sync(open_head)
        state = ClusterState(self.settings.conf, clean_width(self.settings))
        state.take_head(head.hosts, head.queues, head.next_jobid, now(), head.revocations)
        self.state = state
        self.rev = self.committed_rev = head.rev
        self.store_id = head.store_id
        self.ring = ChangeRing(self.settings.change_retention, head.rev)
        self.rids = RidFilter()
        self.rids.ready = False  # every key may be known until the keys are loaded
        self.loading = anyio.Event()
        self.promotion = {"how": "cold", "jobs": head.max_jobid, "changes": 0, "keys": 0}
        assert self._tg is not None
        self._tg.start_soon(self._load_rest, store, head)

    @staticmethod
    def _newest_event(store: Any) -> bytes | None:
        """The newest stored event (on the promotion's thread): its seq is continued."""
        load = getattr(store, "load_events", None)
        got = load(1) if load is not None else []
        return got[-1] if got else None

    def _event_log(self) -> EventLog:
        """The new primary's event log: continuing after the newest stored event at once,
        the older ones read on a thread (:meth:`_load_events`)."""
        s = self.settings
        log = EventLog(s.events_retention, s.events_max, candidate=self.address, loaded=False)
        last = self._last_event
        log.continue_after(orjson.loads(last) if last else None)
        self.state.events = log
        assert self._tg is not None
        self._tg.start_soon(self._load_events, log)
        return log

    async def _load_events(self, log: EventLog) -> None:
        """Read the stored events (the newest ``events_max``) into ``log``."""
        load = getattr(self.store, "load_events", None)
        if load is None:
            logger.warning("controller {}: its store keeps no cluster events; events start "
                           "with this primary", self.address)
            log.loaded = True
            return
        t0 = time.perf_counter()
        upto = log.base()

        def read() -> Any:
            loads = orjson.loads
            return EventLog.build_older((loads(b) for b in load(self.settings.events_max)), upto)

        try:
            older = await anyio.to_thread.run_sync(read)
        except Exception:
            logger.opt(exception=True).error(
                "controller {}: cannot read the stored cluster events; the events op answers "
                "with those recorded since this promotion only", self.address)
            log.loaded = True
            return
        log.take_older(older)
        logger.info("controller {}: loaded {} cluster events in {:.0f} ms (newest seq {})",
                    self.address, len(older.all), (time.perf_counter() - t0) * 1000, log.seq)

    def _save_events(self) -> None:
        """Hand the events recorded since the last call to the store, as one write of
        their own (no rev: they are no records), for a change that wrote no rows (a change
        with rows carries them in its own write: :meth:`_event_rows`). While the store
        fails they stay in memory only."""
        rows = self._event_rows()
        if rows:
            w = Write(rows, extra=Inflight(Gate(), "events"))
            self.store.submit(w)
            self.unstable.append(w)

    def _event_rows(self) -> list[Row]:
        """The ``events`` rows of the events recorded since the last call (none while there
        is no store to take them, or it fails)."""
        log = self.state.events
        if not log.pending:
            return []
        fresh = log.take_unsaved()
        if self.store is None or self.role not in ("primary", "promoting"):
            return []
        if not self.storage.writable():
            logger.debug("controller {}: {} cluster event(s) not stored (the store fails)",
                         self.address, len(fresh))
            return []
        return [("events", row_key(ev["seq"]), orjson.dumps(ev), None) for ev in fresh]

    def _expire_events(self) -> None:
        """Events past ``events_retention`` or over ``events_max`` leave (the oldest first;
        a bounded batch a pass) -- only while the store takes their deletion too."""
        if self.store is None or not self.storage.writable() or not self.state.events.loaded:
            return
        gone = self.state.events.expire(time.time())
        if gone:
            w = Write([("events", row_key(seq), None, None) for seq in gone],
                      extra=Inflight(Gate(), "expire events"))
            self.store.submit(w)
            self.unstable.append(w)

    async def _load_rest(self, store: Any, head: Any) -> None:
        """The cold path's second half: jobs, window and keys, then requests that need them."""
        try:
            rest = await anyio.to_thread.run_sync(load_rest, store, head, self.settings)
        except Exception:
            logger.opt(exception=True).critical(
                "controller {}: cannot load the jobs from the state store; giving up the "
                "primary role", self.address)
            self.give_up()
            return
        state = self.state
        state.take_jobs(rest.table, rest.used)
        rest.ring.extend(self.ring.after(head.rev, self.ring.capacity))
        self.ring = rest.ring
        rest.rids.merge(self.rids)
        self.rids = rest.rids
        loading, self.loading = self.loading, None
        gc.freeze()
        self.promotion.update(loaded_ms=rest.ms, keys=rest.keys)
        if loading is not None:
            loading.set()
        logger.info(
            "controller {}: loaded {} jobs and {} idempotency keys in {:.0f} ms; serving "
            "every request", self.address, len(state.jobs), rest.keys, rest.ms)

    async def _run_writer(self, store: SQLiteStore) -> None:
        """Run the store's writer loop on a worker thread until the store is stopped."""

        # The report is posted, not waited for: the writer goes on to its next transaction
        # while the loop takes this one's batch (reports run on the loop in commit order, the
        # order they were posted in). Waiting cost the writer a loop pass per commit, and the
        # loop anyio's blocking-call machinery per commit.
        bridge = LoopBridge()
        bridge.bind()
        written = self._written

        def on_done(batch: list[Write]) -> None:
            bridge.post(lambda: written(batch))

        async def stop_on_cancel() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                store.stop()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_cancel)
                await anyio.to_thread.run_sync(store.run_writer, on_done)
                tg.cancel_scope.cancel()
        finally:
            self._writer_done.set()

    def _written(self, batch: list[Write]) -> None:
        """On the loop, after the writer reported ``batch`` (committed, or not)."""
        try:
            for w in batch:  # reports come in submission order
                if self.unstable.popleft() is not w:
                    raise RuntimeError("the writer reported a write out of order")
            if batch[0].error is None:
                self._committed(batch)
            else:
                self.storage.failed(batch)
        except Exception:  # never into the writer thread: it would stop committing
            logger.opt(exception=True).critical(
                "controller {}: handling the outcome of {} write(s) failed; giving up the "
                "primary role", self.address, len(batch))
            self.give_up()

    def _committed(self, batch: list[Write]) -> None:
        """Record which keys have results, open the gates (replies and pushes go)."""
        if not self._may_acknowledge(len(batch)):
            return
        t = time.time()
        self.commits.observe(batch)
        if "first_keyed_commit_ms" not in self.promotion and any(w.rid for w in batch):
            # A failover's first client write, as the primary saw it (status "promotion"):
            # how much of the client's wait was this primary's, how much its reconnection.
            self.promotion["first_keyed_commit_ms"] = (t - self.since) * 1000
        recent = self._recent if self._lookups else None
        pending, remember = self.pending, self.rids.add
        top = self.committed_rev
        for w in batch:
            if w.rev > top:
                top = w.rev
            rid = w.rid
            if rid is not None:
                pending.pop(rid, None)
                remember(rid, w.committed_at or t)
                if recent is not None:
                    recent[rid] = (t, w.result)
            w.extra.gate.open()
        self.committed_rev = top
        self.storage.committed()

    def spawn(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` (a coroutine function) as a task of this candidate."""
        assert self._tg is not None
        self._tg.start_soon(fn)

    def give_up(self) -> None:
        """Stop being primary at once (a standby takes over from the last durable state)."""
        for conn in list(self.conns.values()):
            conn.close()
        self.stopped.set()

    def _may_acknowledge(self, writes: int) -> bool:
        """The check before acknowledging: is this candidate still the primary?

        A fenced primary that still runs (the fence's SIGKILL could not be delivered), or one
        whose lock file was replaced, gives the role up instead: its connections close, so
        nothing it committed since is acknowledged by it.
        """
        if self._fenced is None:
            assert self.election is not None
            self._fenced = self.election.still_primary()
            if self._fenced is None:
                return True
            logger.critical(
                "controller {}: no longer primary: {}; not acknowledging the {} write(s) just "
                "committed, closing every connection and giving up the role (clients retry on "
                "the next primary, which answers those writes once, from the store)",
                self.address, self._fenced, writes,
            )
            self.give_up()
        return False

    async def _expire_hosts(self) -> None:
        """Mark hosts unavail past ``host_timeout``; forget idempotency keys past their TTL."""
        period = max(0.05, min(1.0, self.settings.conf.host_timeout / 4))
        while True:
            await anyio.sleep(period)
            if self.storage.writable():  # a host that cannot be marked durably stays as it is
                # In bounded steps, each its own loop pass: when a join storm delays thousands
                # of heartbeats at once, one pass over all of them held the loop long enough
                # for the standbys to fence this primary as hung (then the next one).
                for _ in range(EXPIRE_STEPS):
                    if not self._expire_host_step():
                        break
                    await anyio.lowlevel.checkpoint()
                self._expire_lost_jobs()
                self._expire_events()
                self._expire_revocations()
            self.rids.sweep(time.time() - self.settings.idem_ttl, SWEEP_PARTS)

    def _expire_host_step(self) -> bool:
        """One bounded step of host expiry (:meth:`ClusterState.expire_hosts`); whether it
        looked at a full batch (more may be due)."""
        ch = self.state.expire_hosts(now(), EXPIRE_BATCH)
        lost = [row[1] for row in ch.rows if row[0] == "jobs"]
        for row in ch.rows:
            if row[0] == "hosts":
                logger.warning(
                    "controller {}: host {} sent no heartbeat for {:g} s; marked "
                    "unavail (its worker's re-join makes it ok again)",
                    self.address, row[1], self.settings.conf.host_timeout)
        if lost:
            logger.warning(
                "controller {}: job(s) {} on unavail hosts are UNKWN: RUN again when "
                "their worker re-joins with them alive, else {} after {:g} s",
                self.address, ", ".join(map(str, lost[:20])) + (" ..." if len(lost) > 20 else ""),
                self.settings.conf.lost_job_action, self.settings.conf.lost_job_timeout)
        self.apply_internal(ch, "expire hosts")
        return self.state.expiry_more

    def _expire_revocations(self) -> None:
        """Revocations whose tokens have all expired leave the list (one bounded batch, from
        the expiry heap: only what is due is looked at)."""
        ch = self.state.expire_revocations(now())
        gone = ch.result
        if gone:
            logger.info("controller {}: {} token revocation(s) dropped: the tokens they name "
                        "have expired", self.address, len(gone))
            self.apply_internal(ch, "expire revocations")

    def _expire_lost_jobs(self) -> None:
        """Jobs UNKWN past ``lost_job_timeout``: ``lost_job_action`` (one bounded batch)."""
        conf = self.settings.conf
        ch = self.state.expire_lost(now())
        for jobid, what in ch.result:
            logger.warning(
                "controller {}: job {} was UNKWN for {:g} s (its host stayed unavail); {}",
                self.address, jobid, conf.lost_job_timeout,
                "requeued as a new attempt" if what == "requeued" else "marked EXIT (host lost)")
        if ch.rows:
            self.apply_internal(ch, "expire lost jobs")

    async def _housekeep(self) -> None:
        """Every few seconds, one bounded housekeeping write: idempotency keys past their TTL
        and old removal records leave the store (on the writer's thread)."""
        keep = 10 * self.settings.change_retention  # removal records kept, in revs
        while self.role in ("primary", "promoting"):
            await anyio.sleep(HOUSEKEEPING_INTERVAL)
            if self.role != "primary" or not self.storage.writable():
                continue
            w = Write([], expire_before=time.time() - self.settings.idem_ttl,
                      prune_removed=self.committed_rev - keep if self.committed_rev > keep else None,
                      extra=Inflight(Gate(), "housekeeping"))
            self.store.submit(w)
            self.unstable.append(w)

    async def _clean_finished(self) -> None:
        """Purge finished jobs older than ``clean_period`` (LSF ``CLEAN_PERIOD``).

        A pass every ``min(60 s, clean_period / 4)`` (the first one right after promotion, or
        once the jobs are loaded) takes at most ``CLEAN_BATCH`` due jobs from the end-time
        buckets, so a pass costs what it removes; a full batch means more are due, and the
        next pass follows shortly. The removal is one durable write like any other, so a
        later primary never loads those jobs again.
        """
        period = self.settings.clean_period
        interval = max(0.05, min(CLEAN_INTERVAL, period / 4))
        if self.loading is not None:
            await self.loading.wait()
        while self.role == "primary":  # not while stopping: the writer takes no more writes
            removed = 0
            if self.storage.writable():
                ch = self.state.clean_finished(now(), period, CLEAN_BATCH)
                removed = len(ch.result)
            if removed:
                self.apply_internal(ch, "clean finished jobs")
                logger.info(
                    "controller {}: cleaned {} finished job(s) older than {:g} s",
                    self.address, removed, period,
                )
            await anyio.sleep(min(interval, 0.1) if removed >= CLEAN_BATCH else interval)

    async def _stop_primary(self) -> None:
        """Commit what is queued, let connections flush, then give up the lock."""
        self.role = "stopping"
        if self.store is not None:
            self.store.stop()
            with anyio.move_on_after(10):
                await self._writer_done.wait()
        with anyio.move_on_after(1):
            for conn in list(self.conns.values()):
                conn.outbox.close()
            while self.conns:
                await anyio.sleep(0.01)

    async def _cleanup(self) -> None:
        self._log_abandoned()
        if self.follower is not None:
            self.follower.stop()
        if self.store is not None:
            self.store.stop()
            with anyio.move_on_after(10):
                await self._writer_done.wait()
        if self.election is not None:
            self.election.abandon()
            was = self.role
            self.election.release()
            if was in ("primary", "stopping", "promoting"):
                logger.info("controller {}: gave up the primary role and the state-dir lock", self.address)
        store = self.store if self.store is not None else self._store
        if store is not None:
            if self.follower is not None:
                await anyio.to_thread.run_sync(self.follower.join, 5.0)
            await anyio.to_thread.run_sync(store.close)
        self.role = "stopped"

    async def _reload(self) -> None:
        """Read the configuration file again, off the loop, for the ``reconfig`` that follows
        (or a SIGHUP): :attr:`_reloaded` holds the new settings or the error that stops it."""
        reload = self.settings.reload
        if reload is None:
            self._reloaded = ValueError("this candidate was started without a configuration "
                                        "file to read again")
            return
        try:
            self._reloaded = await anyio.to_thread.run_sync(reload)
        except Exception as exc:  # ConfigError, an unreadable file: the op says which
            self._reloaded = exc

    def reconfigured(self, by: str) -> Changes:
        """Apply the settings :meth:`_reload` read (``reconfig``, SIGHUP): administrators,
        grants, service users and the cluster conf at once, queue records as a write (on the
        primary); settings that need a restart keep their running value and are listed."""
        new, self._reloaded = self._reloaded, None
        if not isinstance(new, ControllerSettings):
            raise RemoteError(ErrorCode.INVALID, f"reconfig: nothing changed: {new or 'no file read'}")
        old = self.settings
        later = old.reconfigurable(new)
        keep = {name: getattr(old, name) for name in later if "." not in name}
        conf = dataclasses.replace(new.conf, resources=old.conf.resources, name=old.conf.name)
        self.settings = dataclasses.replace(new, **keep, conf=conf, reload=old.reload)
        self.policy = make_policy(self.settings, self.users)
        ch = (self.state.reconfigure(conf, now(), by) if self.role == "primary"
              else Changes(result={}))
        if self.role != "primary":
            self.state.conf = conf
        ch.result = {**(ch.result or {}), "restart_needed": later}
        logger.warning("controller {}: reconfigured by {} ({}): queues added {}, changed {}; "
                       "administrators {}; {}", self.address, by, self.role,
                       ch.result.get("queues_added") or "none", ch.result.get("queues_changed") or "none",
                       ", ".join(sorted(conf.admins)) or "none",
                       f"needs a restart to change: {', '.join(later)}" if later else "all applied")
        return ch

    async def reconfigure_now(self, by: str) -> None:
        """SIGHUP: read the file and apply it (a file that does not load changes nothing)."""
        await self._reload()
        try:
            ch = self.reconfigured(by)
        except RemoteError as exc:
            logger.error("controller {}: {}; keeping the running configuration", self.address, exc.message)
            return
        if ch.rows or ch.events:
            self.apply_internal(ch, "reconfig")
        self._save_events()

    def request_shutdown(self, by: str) -> None:
        """``shutdown`` op: tell every member, then stop after the reply is flushed."""
        logger.warning("controller {}: shutdown requested by {}; stopping", self.address, by)
        self.state.events.record("shutdown", now(), server=self.address, by=by)
        self.apply_internal(Changes(events=[Event("shutdown", {"server": self.address})]),
                            "shutdown")
        self.stopped.set()

    # -- applying changes --------------------------------------------------------------------

    def apply(self, ch: Changes, rid: str | None, op: str, caller: Caller | None = None,
              ) -> tuple[Gate | None, bytes | None]:
        """Give ``ch``'s rows a rev, queue them for commit and its events for the members.

        Returns the gate every reply and push must now wait behind (None when nothing is
        uncommitted) and, for a change with rows, the result's JSON (stored with them).
        Everything is encoded first: if that raises, nothing was queued, pushed or stored
        and the rev was not taken (the caller rolls the records back).
        """
        encoded: dict[int, bytes] = {}
        result: bytes | None = None
        rows: list[Any] = []
        rev = self.rev + 1
        if ch.rows:
            for table, _key, rec in ch.rows:  # records carry the rev of their last write
                if isinstance(rec, Job):
                    rec.rev = rev
                elif isinstance(rec, dict) and table in KINDS:
                    rec["rev"] = rev
            for ev in ch.events:  # a removal's push carries the rev of the write (protocol.md)
                if ev.name in ("job_removed", "revocations_removed") and isinstance(ev.data, dict):
                    ev.data["rev"] = rev
            result = encode(ch.result)
            rows = encode_rows(ch.rows, encoded)
        events: list[tuple[Event, bytes]] = []
        if ch.events:
            self.volatile.note(ch.events)  # before encoding: the pushes carry their vseq
            fanout = self.fanout  # an event nobody gets now is not encoded
            if fanout.subs:
                events = encode_events([ev for ev in ch.events if fanout.reaches(ev)], encoded)
        gate: Gate | None
        if rows:
            assert result is not None
            self.rev = rev
            ring = self.ring
            for table, key, data, _spec in rows:
                if table in KINDS:
                    ring.append(rev, table, key, data is None)
            gate = Gate()
            if self.state.events.pending:  # the events it recorded: in the same write (one commit)
                rows += self._event_rows()
            w = Write(rows, rid, result, rev, extra=Inflight(gate, op, caller))
            self.store.submit(w)
            self.unstable.append(w)
            if rid is not None:
                self.pending[rid] = (result, gate)
            self.last_gate = gate
            # (the last write's gate: open_gate() without its call)
        else:
            gate = self.open_gate()
        if events:
            self.fanout.publish(events, gate)
        if self.state.events.pending:
            self._save_events()
        return gate, result

    def apply_internal(self, ch: Changes, what: str) -> None:
        """:meth:`apply` for the controller's own changes (timers, disconnects, shutdown)."""
        try:
            self.apply(ch, None, what)
        except Exception:
            logger.opt(exception=True).error(
                "controller {}: {}: the change cannot be encoded; rolling its records back",
                self.address, what)
            self.storage.discard(ch, what)

    def rolled_back(self) -> None:
        """After a rollback: revs and the window go back to the last commit."""
        gone = self.ring.truncate(self.committed_rev)
        if self.rev != self.committed_rev or gone:
            logger.info("controller {}: revs {}..{} were not committed; the next write is rev "
                        "{} again", self.address, self.committed_rev + 1, self.rev,
                        self.committed_rev + 1)
        self.rev = self.committed_rev

    # -- ServerView (used by op handlers) -------------------------------------------------------

    def status(self, limit: int = 1000, after: str = "") -> dict[str, Any]:
        """The ``status`` op: this candidate, counts, and a page of members by identity."""
        assert self.election is not None
        return members.status(self, limit, after)

    def plan_sync(self, caller: Caller, sub: Subscription, since: dict[str, Any] | None,
                  writes: bool) -> sync.Plan:
        """How the join being handled will sync (``writes``: the join itself writes a row,
        which takes the next rev)."""
        return sync.plan(self, sub, since, self.rev + (1 if writes else 0))

    def subscribe(self, caller: Caller) -> None:
        """Start ``caller``'s pushes: its sync, then deltas."""
        members.subscribe(self, caller)

    def resync(self, caller: Caller) -> None:
        """Sync a member again whose pushes were withdrawn (a rollback): a delta since the
        last commit when the window has it."""
        members.resync(self, caller)

    def replace_worker(self, caller: Caller, host: str) -> None:
        entry = self.fanout.workers.get(host)
        if entry is not None and entry[0] != caller.cid:
            old = self.conns.get(entry[0])
            self.fanout.remove(entry[0])
            if old is not None:
                logger.info(
                    "controller {}: worker of host {} re-joined from {}; closing its old connection",
                    self.address, host, caller.identity,
                )
                old.close()

    # -- connections --------------------------------------------------------------------------

    async def _handle(self, stream: ByteStream, peer: str, sock: socket.socket,
                      handshake_done: Callable[[], None]) -> None:
        """Serve one accepted connection (``sock``: its socket, under TLS too) to its end;
        ``handshake_done`` once its handshake is over (its admission slot is free)."""
        async with stream:
            reader = FrameReader(stream, self.settings.max_frame)
            caller = await self._handshake(stream, reader, peer,
                                           None if self.settings.tls is not None else sock)
            handshake_done()
            if caller is None:
                return
            outbox = Outbox(limits=self.limits, total=self.unsent, progress=self._progress)
            conn = Connection(next(self._cids), caller, peer, outbox, sock)  # sock: for abort()
            caller.cid = conn.cid
            self.conns[conn.cid] = conn
            role = caller.role
            self.conn_roles[role] = self.conn_roles.get(role, 0) + 1
            try:
                async with anyio.create_task_group() as tg:
                    conn.scope, conn.tg = tg.cancel_scope, tg
                    tg.start_soon(self._write_loop, conn, stream)
                    await self._read_loop(conn, reader)
                    outbox.close()  # the writer flushes what is queued, then the group ends
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            finally:
                self.conns.pop(conn.cid, None)
                left = self.conn_roles.get(role, 1) - 1
                if left:
                    self.conn_roles[role] = left
                else:
                    self.conn_roles.pop(role, None)
                outbox.unsent = 0  # what it still held is gone with it (the total unsent)
                self.fanout.remove(conn.cid)
                self.delegates.left(conn.cid)
                if caller.joined and self.role == "primary" and not self.still_joined(caller):
                    self.apply_internal(self.state.remove_member(caller.identity, now()),
                                        "member left")
                logger.debug("controller {}: {} ({}) disconnected", self.address, caller.identity, peer)

    def still_joined(self, caller: Caller) -> bool:
        """Whether another live connection is joined under ``caller``'s identity.

        A worker's is found through the fan-out's host index in O(1); other identities (a
        handful of schedulers, API servers, CLIs) by a scan of the non-worker members.
        """
        if caller.worker_host is not None:
            entry = self.fanout.workers.get(caller.worker_host)
            if entry is not None:
                other = self.conns.get(entry[0])
                if other is not None and other.caller.joined and \
                        other.caller.identity == caller.identity:
                    return True
        return any(
            c.caller.joined and c.caller.identity == caller.identity
            for cid in self.fanout.members if (c := self.conns.get(cid)) is not None
        )

    async def _write_loop(self, conn: Connection, stream: ByteStream) -> None:
        try:
            await conn.outbox.run_writer(stream, None if self.settings.tls is not None else conn.sock)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            conn.close()
        except Stalled as exc:
            logger.warning("controller {}: {} ({}) {}; dropping the connection",
                           self.address, conn.caller.identity, conn.peer, exc)
            conn.abort()

    async def _handshake(self, stream: ByteStream, reader: FrameReader, peer: str,
                         sock: socket.socket | None) -> Caller | None:
        """The hello, the client's answer, its identity; the verdict sent (None: refused or
        gone, said and closed). ``sock``: the plain socket its two messages are written to
        directly (None under TLS): one system call each instead of anyio's send, whose
        write-event round trip was about 13 % of a primary's CPU in a join storm."""
        challenge, hello = auth.server_hello(self.auth)
        hinted = self.role == "standby"
        if hinted:
            # Name the primary at once: a client that is only looking for it leaves without
            # authenticating (half the round trips and no credential work in a failover storm).
            hello.update(self._verdict())
        claimed = "?"
        try:
            with anyio.fail_after(self.settings.handshake_timeout):
                await _send_first(stream, sock, hello)
                answer = await wire.read_message(reader, HANDSHAKE_MAX_FRAME)
                self._progress()
                claimed = label(answer.get("from"), 80)
                who = await self._authenticate(challenge, answer)
                if self.role == "promoting":
                    await self.promoted.wait()
        except (auth.AuthFailed, auth.AuthError) as exc:
            logger.warning("controller {}: handshake from {} (claiming {}) refused: {}; closing",
                           self.address, peer, claimed, exc)
            error = exc.to_error() if isinstance(exc, auth.AuthFailed) else {
                "code": "DENIED", "message": f"handshake refused: {exc}"}
            with anyio.move_on_after(1), _quiet():
                await wire.write_message(stream, {"ok": False, "error": error})
            return None
        except TimeoutError:
            logger.warning("controller {}: handshake from {} timed out; closing", self.address, peer)
            return None
        except wire.WireError as exc:
            logger.warning("controller {}: bad handshake from {}: {}; closing", self.address, peer, exc)
            return None
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.ClosedResourceError, OSError):
            # A standby's client took the hint and left: the normal case, nothing to say. Else
            # the client gave up (its connect timeout) before we served it: in a join storm
            # there are thousands, so they are counted and reported every few seconds.
            if not hinted:
                self.abandoned += 1
                logger.debug("controller {}: {} closed the connection during the handshake",
                             self.address, peer)
            return None
        try:
            await _send_first(stream, sock, {"ok": True, **self._verdict(), "identity": who.to_wire()})
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return None
        return Caller(identity=who.sender, role=who.role, who=who)

    async def _authenticate(self, challenge: str, answer: dict[str, Any]) -> auth.Identity:
        """The caller's identity, admitted to the role it claims (raises AuthFailed/AuthError).

        A method that blocks (munge: a round trip to munged) runs on a thread, as does a uid
        lookup that is not cached: the event loop serves everyone else meanwhile."""
        def verify() -> auth.Identity:
            who = auth.authenticate(self.auth, challenge, answer, self.users)
            self.policy.admit(who)
            return who

        if self.auth.blocking:
            return await anyio.to_thread.run_sync(verify, limiter=self._auth_threads)
        return verify()

    def _verdict(self) -> dict[str, Any]:
        """What this candidate tells a client: primary, or standby and whom to go to.

        A standby about to fence a primary that stopped beating names none and says when it
        expects to take over (``takeover_ms``, :class:`xcecore.schema.verdict.StandbyVerdict`):
        the client waits for it here instead of timing out against the hung primary."""
        if self.role == "primary":
            return {"server": self.address, "state": "primary"}
        primary = self._primary()
        takeover_in = getattr(self.election, "takeover_in", None)
        eta = takeover_in(primary) if takeover_in is not None else None
        if eta is not None:
            return {"server": self.address, "state": "standby", "primary": None,
                    "takeover_ms": min(TAKEOVER_MS_MAX, round(eta * 1000))}
        return {"server": self.address, "state": "standby", "primary": primary}

    def _primary(self) -> str | None:
        """The primary a standby redirects to (never itself)."""
        if self.election is None:
            return None
        primary = self.election.current_primary()
        if primary is None or primary == self.address:
            return None
        if self.role == "standby":
            # Remembered for the promotion event: a backend whose leader record ends with its
            # holder (etcd's lease) no longer names the old primary when this one wins.
            self.old_primary = primary
        return primary

    async def _read_loop(self, conn: Connection, reader: FrameReader) -> None:
        timeout = self.settings.frame_timeout
        while True:
            try:
                msg = await reader.next_message(timeout)
            except TimeoutError:  # (an OSError: caught before the others)
                logger.warning(
                    "controller {}: {} ({}) began a frame and did not finish it within {:g} s "
                    "(frame_timeout); closing the connection",
                    self.address, conn.caller.identity, conn.peer, timeout,
                )
                conn.abort()
                return
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                    anyio.ClosedResourceError, OSError):
                return
            except wire.WireError as exc:
                logger.warning(
                    "controller {}: bad frame from {} ({}): {}; closing the connection",
                    self.address, conn.caller.identity, conn.peer, exc,
                )
                conn.outbox.reply(wire.encode(wire.reply_error(None, ErrorCode.INVALID, str(exc))), None)
                return
            outbox = conn.outbox
            if outbox.full():
                if not conn.held_back:
                    conn.held_back = True
                    logger.warning(
                        "controller {}: {} ({}) is not reading its replies ({} unsent, {} bytes; "
                        "bounds max_inflight {}, max_unsent_bytes/2 {}); its requests wait "
                        "unread until it does", self.address, conn.caller.identity, conn.peer,
                        outbox.queued_replies, outbox.unsent, self.limits.max_replies,
                        self.limits.pause_bytes,
                    )
                await outbox.wait_room()
            paused = self.storage.paused
            if paused is not None:  # a rollback is under way: it must see no new change
                await paused.wait()
            self._progress()
            if self.role == "primary":
                rid = self._to_prepare(msg)
                if rid is not None:
                    await self._prepare(msg, rid)
            self.handle_message(conn, msg)
            if self._recalled:
                self._recalled.clear()

    def _to_prepare(self, msg: dict[str, Any]) -> str | None:
        """Whether a request needs :meth:`_prepare` before it is handled: the idempotency key
        to look up ("" for none), or None when it needs nothing (nearly every request: it is
        handled without the cost of an awaited call)."""
        op = msg.get("op")
        rid = msg.get("rid")
        if op == "outcome":
            args = msg.get("args")
            rid = args.get("rid") if isinstance(args, dict) else None
        if not isinstance(rid, str) or not rid or rid in self.pending or \
                not self.rids.may_contain(rid):
            rid = ""
        if rid or op == "reconfig" or self.loading is not None:
            return rid
        return None

    async def _prepare(self, msg: dict[str, Any], rid: str) -> None:
        """Before a request is handled (its connection's next one waits, others do not):
        wait for the jobs if it needs them and they are still loading, and fetch from the
        store, off the loop, the result of idempotency key ``rid`` (from :meth:`_to_prepare`:
        "" for none) that the filter may know."""
        op = msg.get("op")
        if op == "reconfig":
            await self._reload()
        loading = self.loading
        if loading is not None:
            spec = OPS.get(op) if isinstance(op, str) else None
            if spec is not None and spec.needs_jobs:
                await loading.wait()
        if not rid or rid in self.pending or not self.rids.may_contain(rid):
            return  # (asked again: a copy of the key may have come in while this one waited)
        loading = self.loading
        if loading is not None and not self.rids.ready and getattr(self.store, "lookup_by_time", False):
            await loading.wait()  # (a store that files keys by time: the loaded keys' times)
            if not self.rids.may_contain(rid):
                return
        self._lookups += 1
        try:
            found = await anyio.to_thread.run_sync(self.store.lookup, rid,
                                                    self.rids.time_of(rid))
        except Exception:  # the store cannot say: the request is refused, never applied
            logger.opt(exception=True).error("controller {}: cannot look idempotency key {} up "
                                             "in the state store", self.address, label(rid))
            found = LOOKUP_FAILED
        finally:
            self._lookups -= 1
        if found is None:
            late = self._recent.get(rid)  # committed by another copy while we looked
            found = None if late is None else late[1]
        self._recalled[rid] = found
        if not self._lookups:
            self._recent.clear()
        elif self._recent:
            self._prune_recent()

    def _prune_recent(self) -> None:
        limit = time.time() - RECENT_SECONDS
        recent = self._recent
        while recent:
            first = next(iter(recent))
            if recent[first][0] >= limit:
                break
            del recent[first]

    def _stored(self, rid: str) -> bytes | None:
        """The committed result of ``rid`` if this request's preparation found one."""
        found = self._recalled.get(rid)
        if found is None and (late := self._recent.get(rid)) is not None:
            found = late[1]
        return found

    def handle_message(self, conn: Connection, msg: dict[str, Any]) -> None:
        """Answer one request (synchronously: applied in arrival order), whatever it holds."""
        op = msg.get("op")
        key = op if isinstance(op, str) and op in OPS else "other"  # never a client's string
        self.requests[key] = self.requests.get(key, 0) + 1
        try:
            self._answer(conn, msg)
        except Exception:  # the last guard: one request's data never ends the process
            logger.opt(exception=True).error(
                "controller {}: request {} from {} failed unexpectedly; answered INTERNAL",
                self.address, label(msg.get("op")), conn.caller.identity,
            )
            self._reply_error(conn, request_id(msg), RemoteError(
                ErrorCode.INTERNAL, "the controller failed to answer this request (logged)"))

    def _answer(self, conn: Connection, msg: dict[str, Any]) -> None:
        try:
            req = wire.parse_request(msg)
        except RemoteError as exc:
            self._refused(conn, label(msg.get("op")), exc)
            self._reply_error(conn, request_id(msg), exc)
            return
        if self.role != "primary":
            primary = self._primary()
            if primary is None:
                err = wire.reply_error(req.id, ErrorCode.NO_PRIMARY, "standby; no primary known", primary=None)
            else:
                err = wire.reply_error(req.id, ErrorCode.REDIRECT, f"standby; primary is {primary}", primary=primary)
            conn.outbox.reply(wire.encode(err), None)
            return
        if self.delegates.handles(req.op):  # answered by a member (xce_controller.delegate)
            self.delegates.call(conn, req)
            return
        if req.rid is not None:
            # (nothing recalled or recent, the common case: no result can be stored for it)
            stored = self._stored(req.rid) if self._recalled or self._recent else None
            if stored == LOOKUP_FAILED:
                self._reply_error(conn, req.id, RemoteError(
                    ErrorCode.STORAGE, f"{req.op}: not applied: the controller cannot read the "
                    f"record of idempotency key {req.rid} from its store; retry"))
                return
            if stored is not None:
                conn.outbox.reply(self._repeat(req, stored), self.open_gate())
                return
            pending = self.pending.get(req.rid)
            if pending is not None:
                conn.outbox.reply(self._repeat(req, pending[0]), pending[1],
                                  self._storage_error(req.id, req.op))
                return
        try:
            spec, args = check_call(req.op, conn.caller, req.args, self.state, self.policy)
            if spec.kind == "write" and not self.storage.writable() and \
                    not (req.op == "join" and conn.caller.role != WORKER):  # joins store no rows
                raise self.storage.refusal(req.op)
            if args:  # before the handler: a refusal changes nothing
                check_encodable(req.op, args)
            ch = spec.handler(self, conn.caller, args, now())
        except RemoteError as exc:
            self._refused(conn, req.op, exc)
            self._reply_error(conn, req.id, exc)
            return
        except Exception as exc:
            logger.opt(exception=True).error("controller {}: op {} from {} failed", self.address, req.op,
                                             conn.caller.identity)
            self._reply_error(conn, req.id, RemoteError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))
            return
        self._finish(conn, req, spec, args, ch)
        if req.op == "join":
            self.delegates.joined(conn, args.get("attrs"))

    def _finish(self, conn: Connection, req: wire.Request, spec: OpSpec, args: dict[str, Any],
                ch: Changes) -> None:
        """Commit, push and answer the change a handler made."""
        try:
            gate, result = self.apply(ch, req.rid if spec.dedupe else None, req.op, conn.caller)
        except Exception as exc:
            # check_encodable let through something that cannot be encoded: nothing was
            # queued or pushed, and the records the handler changed go back to the store's.
            logger.opt(exception=True).error(
                "controller {}: {} from {}: the outcome cannot be encoded ({}); rolling its "
                "records back", self.address, req.op, conn.caller.identity, exc)
            self.storage.discard(ch, req.op, conn.caller)
            self._reply_error(conn, req.id, RemoteError(
                ErrorCode.INVALID, f"{req.op}: the outcome cannot be encoded ({exc}); nothing "
                "was changed"))
            return
        try:
            data = (wire.encode(wire.reply_ok(req.id, ch.result)) if result is None
                    else reply_frame(req.id, result))
        except Exception as exc:  # a read's result that cannot be encoded: nothing changed
            logger.opt(exception=True).error("controller {}: {} from {}: the result cannot be "
                                             "encoded", self.address, req.op, conn.caller.identity)
            self._reply_error(conn, req.id, RemoteError(
                ErrorCode.INVALID, f"{req.op}: the outcome cannot be encoded ({exc}); nothing "
                "was changed"))
            return
        if len(data) - 4 > self.settings.max_frame:
            text = (f"{req.op}: the result ({len(data)} bytes) exceeds the maximum frame; "
                    "narrow the query (filters, limit)")
            data = wire.encode(wire.reply_error(req.id, ErrorCode.INVALID, text))
        # Should the commit this reply waits on fail: a change of its own was rolled back (its
        # answer becomes STORAGE), a read may show what was rolled back (it is answered again
        # from the rolled-back state), a volatile update's answer stays true.
        again: ErrorFrame | None = None
        if gate is not None and ch.rows:
            again = self._storage_error(req.id, req.op)
        elif gate is not None and spec.kind == "read":
            again = lambda reason: self._read_again(conn, req, spec, args)  # noqa: E731
        conn.outbox.reply(data, gate, again)
        if ch.after is not None:
            try:
                ch.after()
            except Exception:
                logger.opt(exception=True).error(
                    "controller {}: {} from {}: the follow-up failed; closing the connection "
                    "(the member re-joins)", self.address, req.op, conn.caller.identity)
                conn.close()

    def _read_again(self, conn: Connection, req: wire.Request, spec: OpSpec,
                    args: dict[str, Any]) -> bytes:
        """A read's answer, computed again after a rollback (from the restored state)."""
        try:
            data = wire.encode(wire.reply_ok(req.id, spec.handler(self, conn.caller, args, now()).result))
            if len(data) - 4 <= self.settings.max_frame:
                return data
            exc = RemoteError(ErrorCode.INVALID, f"{req.op}: the result exceeds the maximum frame")
        except RemoteError as err:
            exc = err
        except Exception as err:
            logger.opt(exception=True).error("controller {}: {} from {} failed when answered again",
                                             self.address, req.op, conn.caller.identity)
            exc = RemoteError(ErrorCode.INTERNAL, f"{type(err).__name__}: {err}")
        return wire.encode(wire.reply_error(req.id, exc.code, exc.message))

    def _reply_error(self, conn: Connection, mid: int | None, exc: RemoteError) -> None:
        try:
            data = wire.encode(wire.reply_error(mid, exc.code, exc.message, **exc.data))
        except Exception:  # the error's data came from the request and cannot be encoded
            data = wire.encode(wire.reply_error(mid, exc.code, exc.message))
        conn.outbox.reply(data, None)

    def _storage_error(self, mid: int, op: str) -> ErrorFrame:
        """The reply to send instead, should the commit a reply waits on fail."""
        return lambda reason: self.storage.error_frame(mid, op, reason)

    def _repeat(self, req: wire.Request, stored: bytes) -> bytes:
        """The answer to a request whose rid is recorded: its stored result, or -- for a key an
        ``outcome`` query declared not applied -- a refusal (it must never be applied now)."""
        if stored == TOMBSTONE:
            return wire.encode(wire.reply_error(
                req.id, ErrorCode.CONFLICT,
                f"{req.op}: idempotency key {req.rid} was declared not applied by an outcome "
                "query; it can no longer be applied (send the request again with a new key)",
                rid=req.rid, outcome="not_applied"))
        return reply_frame(req.id, stored)

    def outcome(self, rid: str) -> dict[str, Any]:
        """The ``outcome`` op: what became of the keyed write ``rid`` (ServerView).

        Applied: its stored result. Applied but not yet committed: "pending". Neither (never
        received, refused, or lost with a dead primary): a tombstone is committed under the key
        -- the reply waits for it like any write's -- so the request arriving late (still in a
        socket buffer, say) is refused instead of applied, and "not applied" stays true.
        """
        stored = self._stored(rid)
        if stored == LOOKUP_FAILED:
            raise RemoteError(ErrorCode.STORAGE, f"outcome: the controller cannot read the "
                              f"record of idempotency key {rid} from its store; ask again")
        if stored is None and (pending := self.pending.get(rid)) is not None:
            if pending[0] != TOMBSTONE:
                return {"rid": rid, "outcome": "pending"}
            stored = pending[0]  # another query's tombstone, committing: this reply waits too
        if stored is None:
            if not self.storage.writable():  # the tombstone could not be made durable
                raise self.storage.refusal("outcome")
            gate = Gate()
            self.rev += 1
            w = Write([], rid, TOMBSTONE, self.rev, extra=Inflight(gate, "outcome"))
            self.store.submit(w)
            self.unstable.append(w)
            self.pending[rid] = (TOMBSTONE, gate)
            self.last_gate = gate
            logger.info("controller {}: outcome of {} asked; never applied here, recorded as "
                        "not applied (a late arrival of it is refused)", self.address, rid)
            stored = TOMBSTONE
        if stored == TOMBSTONE:
            return {"rid": rid, "outcome": "not_applied"}
        return {"rid": rid, "outcome": "applied", "result": orjson.loads(stored)}

    def open_gate(self) -> Gate | None:
        """The gate of the last uncommitted write, or None when everything is committed."""
        gate = self.last_gate
        if gate is not None and gate.is_open():
            gate = self.last_gate = None
        return gate

    def _refused(self, conn: Connection, op: str, exc: RemoteError) -> None:
        # A member reconnected after a failover beats before it re-joins: that NOT_JOINED is the
        # normal way it learns to re-join, not news for an operator. Writes refused during a
        # storage fault are counted and reported when it ends.
        if exc.code == ErrorCode.NOT_JOINED and op == "heartbeat":
            log = logger.debug
        elif exc.code == ErrorCode.STORAGE:
            self.storage.refused += 1
            log = logger.debug
        elif exc.code in (ErrorCode.NOT_FOUND, ErrorCode.CONFLICT, ErrorCode.NOT_JOINED):
            log = logger.info
        else:
            log = logger.warning
        log("controller {}: {} from {} refused: {} {}", self.address, op, conn.caller.label(),
            exc.code, label(exc.message, 300))


def make_policy(settings: ControllerSettings, users: auth.Users) -> Policy:
    """The authorization policy of ``settings``. Under ``auth = "key"`` every caller is the
    cluster's owner: this process's own user (pinned in ``users``, named by its uid if the
    host has no name for it)."""
    owner = None
    if settings.auth.name == "key":
        uid = os.geteuid()
        try:
            owner = users.name(uid)
        except auth.AuthFailed:
            owner = str(uid)
        users.pin(uid, owner)
    return Policy(admins=settings.conf.admins, service_users=settings.service_users,
                  grants=settings.grants, owner=owner)


def _quiet() -> contextlib.suppress:
    """Suppress connection errors while writing a last message."""
    return contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)


async def serve(
    settings: ControllerSettings,
    *,
    election_factory: ElectionFactory = FileLockElection,
    store_factory: StoreFactory = SQLiteStore,
    task_status: TaskStatus[Controller] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run one controller candidate until it is shut down or cancelled.

    ``task_status.started`` receives the :class:`Controller` once it listens (as a standby; wait
    on ``controller.promoted`` for the primary role).
    """
    await Controller(settings, election_factory, store_factory).run(task_status=task_status)
