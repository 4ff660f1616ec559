"""Storage faults: a commit that fails leaves the primary up, read-only, until the store works.

When the store cannot commit (ENOSPC, an I/O error, anything its commit raises), the primary:

1. rolls back every write not yet committed: the failed batch and every write queued after it
   (each was applied in memory on top of the ones before; the store fails them without an
   attempt, see :mod:`xce_controller.store`). Their records go back to what the store holds
   (:meth:`ClusterState.restore <xce_controller.state.ClusterState.restore>`), their replies
   become ``STORAGE`` errors, a read that was waiting behind them is answered again from the
   restored state, their pushes are withdrawn, and every member that was waiting for one of
   those pushes gets a fresh ``state``;
2. refuses new writes with ``STORAGE``, naming the cause and the database file, before they
   touch anything, while reads, heartbeats, volatile updates and pushes go on;
3. probes the store every ``storage_retry`` seconds with a write of :data:`PROBE_BYTES`
   (deleted in the same transaction) and, once one commits, takes writes again. Two log
   lines per episode: when it began and when it ended.

Why roll back rather than hold the failed batch and retry it until it commits: a held write
keeps its reply gated, and so every later reply and push of every connection that waits
behind it (ordering is per connection, commits complete in order): a disk that stays full
would stop heartbeat replies, clients would declare the primary dead, and reads would stop
too. Rolled back, nothing waits on the store, the state in memory is exactly the durable
state, and a refused write is simply absent: its client retries it (the worker's reports and
the scheduler's dispatches do) with its idempotency key.

While a rollback runs (a thread reads the committed records), no request is handled: the
read loops wait on :attr:`StorageGuard.paused`, so no change is built on the state being
rolled back. The same path rolls back a change that could not be encoded (a defect the
arguments check should have caught), after the writes in flight have been reported.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import orjson
from loguru import logger

from xce_controller.jobs import job_from_row
from xce_controller.ops import Caller
from xce_controller.pushes import Fanout, Gate, Outbox
from xce_controller.settings import ControllerSettings
from xce_controller.state import Changes, ClusterState
from xce_controller.store import StorageFault, Write
from xcecore import wire
from xcecore.wire import ErrorCode, RemoteError

Key = tuple[str, Any]
PROBE_BYTES = 256 * 1024  # what a probe of a failing store writes (and deletes)


class Primary(Protocol):
    """What the guard needs of the controller (:class:`xce_controller.server.Controller`)."""

    address: str
    role: str
    settings: ControllerSettings
    state: ClusterState
    store: Any
    fanout: Fanout
    conns: dict[int, Any]
    pending: dict[str, tuple[bytes, Gate]]
    unstable: deque[Write]

    def spawn(self, fn: Callable[[], Any]) -> None: ...

    def give_up(self) -> None: ...

    def resync(self, caller: Caller) -> None: ...

    def rolled_back(self) -> None: ...

    def apply_internal(self, ch: Changes, what: str) -> None: ...

    def still_joined(self, caller: Caller) -> bool: ...


@dataclass(slots=True)
class Inflight:
    """What the controller keeps with a write the store has not reported yet."""

    gate: Gate
    op: str  # the op (or the controller's own reason) that made the change
    caller: Caller | None = None  # who asked, for undoing a join
    doomed: bool = False  # rolled back: the store fails it without an attempt
    born: float = field(default_factory=time.monotonic)  # handed to the store (commit latency)


def decode_image(table: str, image: tuple[bytes, bytes | None] | None) -> Any:
    """A committed row (``(data, spec)`` from the store) as the state holds it."""
    if image is None:
        return None
    data, spec = image
    if table == "jobs":
        assert spec is not None
        return job_from_row(spec, data)
    return orjson.loads(data)


class StorageGuard:
    """The storage-fault state of one primary, and its rollbacks."""

    def __init__(self, ctl: Primary) -> None:
        self.ctl = ctl
        self.fault: StorageFault | None = None
        self.since = 0.0  # when the current fault began (monotonic)
        self.refused = 0  # writes refused with STORAGE during the current fault
        self.rollbacks = 0  # rollbacks done (tests read it)
        self.paused: anyio.Event | None = None  # set while a rollback runs (requests wait)
        self._keys: dict[Key, bool] = {}  # records to roll back -> keep volatile fields
        self._waiters: set[Outbox] = set()  # outboxes whose pushes were withdrawn
        self._gates: list[tuple[Gate, StorageFault]] = []  # to fail once the state is restored
        self._resume_store = False
        self._reported = anyio.Event()  # the writer reported something (rollback waits)

    # -- what the server asks ---------------------------------------------------------------

    def writable(self) -> bool:
        """False while the store is failing (writes are refused) or a rollback runs."""
        return self.fault is None and self.paused is None

    def refusal(self, op: str) -> RemoteError:
        """The STORAGE error for a write refused during a fault (nothing was changed)."""
        f = self.fault
        why = f"{f.cause} ({f.path})" if f is not None else "a rollback is under way"
        return RemoteError(
            ErrorCode.STORAGE,
            f"{op}: refused, nothing changed: the controller cannot store changes now: {why}; "
            "reads are served, and writes are taken again by themselves once the store works",
            self.error_data(),
        )

    def error_data(self) -> dict[str, Any]:
        """The fields a STORAGE error carries besides its message: ``path`` and ``cause``."""
        f = self.fault
        return {} if f is None else {"path": f.path, "cause": f.cause}

    def error_frame(self, mid: int, op: str, reason: Any) -> bytes:
        """The reply for request ``mid`` whose commit was rolled back (``reason``: why)."""
        if isinstance(reason, StorageFault):
            err = wire.reply_error(
                mid, ErrorCode.STORAGE,
                f"{op}: not applied (rolled back): the store cannot commit: {reason}",
                path=reason.path, cause=reason.cause)
        else:
            err = wire.reply_error(mid, ErrorCode.INTERNAL, f"{op}: not applied (rolled back): {reason}")
        return wire.encode(err)

    # -- what the writer reports ---------------------------------------------------------------

    def committed(self) -> None:
        """A batch committed: if the store was failing, it works again."""
        self._reported.set()
        if self.fault is not None:
            logger.warning(
                "controller {}: the state store ({}) commits again after {:.1f} s; taking writes "
                "again ({} refused meanwhile)", self.ctl.address, self.fault.path,
                time.monotonic() - self.since, self.refused,
            )
            self.fault = None
            self.refused = 0

    def failed(self, batch: list[Write]) -> None:
        """A batch was not committed: roll it back, and everything queued after it."""
        self._reported.set()
        ctl = self.ctl
        fault = batch[0].error
        assert fault is not None
        fresh = [w for w in batch if not w.extra.doomed]
        if not fresh:
            return  # rolled back already: the store failed it without an attempt
        doomed = fresh + [w for w in ctl.unstable if not w.extra.doomed]
        if ctl.role != "primary":  # stopping: nothing more is served; the store is the truth
            for w in doomed:
                w.extra.doomed = True
                w.extra.gate.fail(fault)
            logger.error("controller {}: the last {} write(s) could not be committed while "
                         "stopping ({}); they are not applied", ctl.address, len(doomed), fault)
            return
        if self.fault is None:
            self.fault, self.since, self.refused = fault, time.monotonic(), 0
            logger.error(
                "controller {}: cannot commit to the state store: {}; rolling back {} "
                "uncommitted write(s) (answered STORAGE) and refusing writes until it works "
                "again (a probe every {:g} s); reads, heartbeats and pushes go on",
                ctl.address, fault, len(doomed), ctl.settings.storage_retry,
            )
            ctl.spawn(self._probe)
        else:
            logger.debug("controller {}: the state store still fails ({}); rolling back {} write(s)",
                         ctl.address, fault.cause, len(doomed))
        for w in doomed:
            self._doom(w, fault)
        self._resume_store = True
        self._start()

    def discard(self, ch: Changes, op: str, caller: Caller | None = None) -> None:
        """Undo a change that was never queued (it could not be encoded): its records go back
        to the store's, volatile fields included, once every write in flight has been
        reported; a join's member is not joined."""
        if op == "join" and caller is not None and caller.joined:
            self._unjoin(caller)
        for table, key, _ in ch.rows:
            self._keys[(table, key)] = False
        if ch.rows:
            self._start()

    # -- rolling back ----------------------------------------------------------------------

    def _doom(self, w: Write, fault: StorageFault) -> None:
        ctl = self.ctl
        info: Inflight = w.extra
        info.doomed = True
        if w.rid is not None:
            entry = ctl.pending.get(w.rid)
            if entry is not None and entry[1] is info.gate:
                del ctl.pending[w.rid]
        for table, key, *_ in w.rows:
            self._keys.setdefault((table, key), True)
        # Failed once the state is rolled back: a read waiting on it is then answered anew.
        self._gates.append((info.gate, fault))
        caller = info.caller
        if info.op == "join" and caller is not None and caller.joined:
            self._unjoin(caller)

    def _unjoin(self, caller: Caller) -> None:
        """A join that was rolled back: the member is not joined (its next call re-joins)."""
        ctl = self.ctl
        caller.joined = False
        caller.worker_host = None
        ctl.fanout.remove(caller.cid)
        if not ctl.still_joined(caller):
            ctl.apply_internal(ctl.state.remove_member(caller.identity, time.time()),
                              "join rolled back")

    def _start(self) -> None:
        if self.paused is None:
            self.paused = anyio.Event()
            self.ctl.spawn(self._rollback)

    async def _rollback(self) -> None:
        ctl = self.ctl
        try:
            while True:
                # A change built on the records being rolled back must be rolled back too:
                # wait until every write in flight is reported (a doomed one already is).
                while any(not w.extra.doomed for w in ctl.unstable):
                    self._reported = anyio.Event()
                    await self._reported.wait()
                if not self._keys:
                    break
                keys, self._keys = self._keys, {}
                images = await anyio.to_thread.run_sync(ctl.store.committed, list(keys))
                for keep in (True, False):
                    part = {k: decode_image(k[0], b) for k, b in images.items() if keys[k] is keep}
                    if part:
                        ctl.state.restore(part, keep_volatile=keep)
            ctl.rolled_back()
            self._fail_gates()
            self.rollbacks += 1
            if self._resume_store:
                self._resume_store = False
                ctl.store.resume()
            waiters, self._waiters = self._waiters, set()
            for outbox in waiters:  # members that missed pushes: synced again
                conn = outbox.owner
                if conn is not None and conn.caller.joined and conn.cid in ctl.conns:
                    ctl.resync(conn.caller)
        except Exception:
            logger.opt(exception=True).critical(
                "controller {}: cannot roll the state back to the store's; giving up the "
                "primary role so a standby takes over from the last durable state", ctl.address)
            self._fail_gates()
            ctl.give_up()
        finally:
            paused, self.paused = self.paused, None
            if paused is not None:
                paused.set()

    def _fail_gates(self) -> None:
        gates, self._gates = self._gates, []
        for gate, fault in gates:
            if gate.waiters:  # their pushes are withdrawn: those members are synced again
                self._waiters |= gate.waiters
            gate.fail(fault)

    async def _probe(self) -> None:
        """While the store fails: a probe write every ``storage_retry`` s until one commits."""
        ctl = self.ctl
        while self.fault is not None and ctl.role == "primary":
            await anyio.sleep(ctl.settings.storage_retry)
            if self.fault is None or self.paused is not None:
                continue
            if any(w.extra.op == "storage probe" for w in ctl.unstable):
                continue  # the last probe is still in the writer's hands (a slow disk)
            # Written and deleted in one transaction: it needs PROBE_BYTES of room, so a disk
            # with only a few free pages does not count as working again (and flap).
            ctl.apply_internal(Changes(rows=[("meta", "storage_probe", "p" * PROBE_BYTES),
                                             ("meta", "storage_probe", None)]), "storage probe")
