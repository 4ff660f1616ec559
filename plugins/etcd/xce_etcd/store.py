"""The state store on etcd: every group of writes is one transaction guarded by the fencing token.

Keys (``P`` is ``[etcd] prefix``): ``P/s/<table>/<key>`` holds a record (tables ``hosts``,
``queues``: ``<rev> <JSON>``, the rev of the write that last changed it; ``jobs``: ``<rev>
<fields JSON>\n<submission JSON>``, in one key because etcd's cost of a transaction grows
with its operations far more than with its bytes; ``meta``: its JSON, ``meta/rev`` the
highest committed rev), a job's key is its id in 20 digits (so keys sort by id);
``P/i/<second>/<group>`` the idempotency keys of one transaction and their results
(:mod:`xce_etcd.layout`: one operation per transaction, not one per key), ``P/store_id``
the store's random id, ``P/w`` the chain key (below), ``P/leader`` the election's key.

Idempotency lookups. The group's second (the transaction's commit time, to the second) is
what the controller remembers per key (``Write.committed_at``; a load and a standby's follow
give it too), and a lookup reads the groups of that second and the two around it (one range
read; the last few seconds read are kept, so the retries that follow a failover, all of the
last second or two, cost one read, not one each). A lookup without a time searches every group,
newest first (``lookup_by_time`` makes a cold primary hold keyed requests until it has loaded
the keys' times instead, so this is for other callers). Expiry deletes every group of the seconds before
``idem_ttl`` in one range delete inside a housekeeping transaction; a key is never deleted
before its second is older than the TTL (its commit was at or after that second).

A primary's cold load is :meth:`head`, :meth:`load_jobs`, :meth:`load_idem` (no retention
window: :meth:`load_window` gives an empty one whose floor is the loaded rev, so members
re-joining with an older ``since`` get a snapshot). A hot standby loads one consistent
:meth:`snapshot` (every read at one etcd revision), then follows with a watch on ``P/``
from the revision after it (:mod:`xce_etcd.follow`: :meth:`wait_changed`,
:meth:`changes_since`); its promotion reads the rest up to its own campaign's revision, never
the whole state again, unless its watch fell behind etcd's compaction.

The writer thread takes every write queued since its last commit, as the SQLite store does,
and commits them in transactions of at most ``max_txn_ops`` operations and
``max_request_bytes`` bytes (a write's rows never span two transactions; a write that alone
exceeds a limit fails with a STORAGE fault naming it). Each transaction carries the compare
``mod_revision(P/leader) == token``: it commits only while the leader key is still the one
this candidate's campaign wrote. Each transaction's writes are reported (``on_done``) as one
batch, after it committed, so a reply waits for its own commit; etcd's revision after the
transaction is the batch's revision.

Outcomes of a transaction:

- committed: reported;
- refused by etcd before it was proposed (``mvcc: database space exceeded``: the quota, a
  transaction over etcd's own limits): the batch fails with a :class:`StorageFault` (the
  controller answers STORAGE, rolls back, refuses writes and probes, as with a full disk),
  and every later write of the same epoch fails too (see ``xce_controller.store``);
- the guard failed (another candidate holds the leader key): this candidate is not primary
  any more; the election is told, nothing is reported, the writer returns, and the controller
  gives the role up at its next beat (its connections close: clients learn the outcome from
  the next primary, through the write's idempotency key);
- no answer (a member lost, a timeout, a leader change inside etcd): settled through another
  endpoint (:meth:`EtcdStore._commit_chunk`: a chain key makes "not yet committed" final by
  a fence, and the transaction is sent again); only when that cannot be done while the
  lease is provable (the majority unreachable) is the outcome unknown, and then it must not
  be answered either way: handled like a failed guard. The next primary loads whatever did
  commit.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from loguru import logger
from xce_controller.changes import Change
from xce_controller.jobs import Job, JobTable, normalise
from xce_controller.store import TABLES, StorageFault, Write, fail_doomed, take_batch
from xce_controller.storeread import Delta, Head, Images

from xce_etcd.client import (
    KV,
    Compacted,
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Op,
    OutcomeUnknown,
    Put,
    TxnResult,
    absent,
    mod_revision_is,
    prefix_end,
    put_op,
)
from xce_etcd.election import EtcdElection
from xce_etcd.follow import SILENT_TTLS, Watcher, delta_of, read_until
from xce_etcd.layout import (
    CHAIN,
    JOB_DIGITS,
    group_name,
    group_results,
    group_rids,
    group_value,
    job_of,
    job_value,
    record_of,
    second_bound,
    second_of,
)
from xce_etcd.settings import EtcdSettings

_STOP = object()
_T = TypeVar("_T")
OP_OVERHEAD = 32  # bytes an operation costs in the request besides its (base64) fields
LOOKUP_CACHE = 8  # seconds of idempotency groups a lookup keeps, newest read first


class TooLarge(Exception):
    """One write alone exceeds a transaction's limits."""


def op_size(op: Op) -> int:
    """About the bytes ``op`` takes in a gateway request (its base64 fields and some JSON:
    more than over gRPC, so a transaction within the limit fits either transport)."""
    raw = len(op.key) + (len(op.value) if isinstance(op, Put) else 0)
    return OP_OVERHEAD + 4 * ((raw + 2) // 3)


@dataclass(slots=True)
class _Round:
    """What one round of the writer did: the batches to report, in order, and whether the
    writer stops after them (the stop came, or this candidate may not write any more)."""

    batches: list[list[Write]]
    halt: bool

    def report(self, on_done: Callable[[list[Write]], None]) -> None:
        for batch in self.batches:
            on_done(batch)


class _Ahead:
    """The writer's helper: one daemon thread running the next round while the writer's
    thread reports the last one."""

    def __init__(self, fn: Callable[[Write], _Round]) -> None:
        self._fn = fn
        self._jobs: queue.SimpleQueue[tuple[Write, Future[_Round]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="xce-etcd-commit", daemon=True)
        self._thread.start()

    def start(self, first: Write) -> Future[_Round]:
        """Run ``fn(first)`` on the helper thread."""
        fut: Future[_Round] = Future()
        self._jobs.put((first, fut))
        return fut

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            first, fut = job
            try:
                fut.set_result(self._fn(first))
            except BaseException as exc:  # raised on the writer's thread by result()
                fut.set_exception(exc)

    def close(self) -> None:
        """End the thread after its current round (nothing waits for it)."""
        self._jobs.put(None)


class EtcdStore:
    """The controller's ``Store`` on etcd (see the module docstring)."""

    lookup_by_time = True  # lookup() needs a key's second (the controller waits for a load's)

    def __init__(self, client: EtcdClient, settings: EtcdSettings, election: EtcdElection) -> None:
        self.client = client
        self.settings = settings
        self.election = election
        prefix = settings.prefix.encode()
        self.state_prefix = prefix + b"/s/"
        self.idem_prefix = prefix + b"/i/"
        self.id_key = prefix + b"/store_id"
        self.chain_key = prefix + CHAIN  # the last transaction's id: see _resolve
        self._chain_rev = 0  # its mod_revision as this primary last wrote or read it
        self._batches = 0
        self.resolved = 0  # unknown outcomes resolved without giving up (tests read it)
        self.path = f"etcd {','.join(settings.endpoints)} {settings.prefix}"
        self.store_id = ""
        self.revision = 0  # etcd's revision after the last commit (the store's rev)
        self.commits = 0
        self.epoch = 0
        self._groups = 0  # idempotency groups this store named (a group's id: token, count)
        self._looked: dict[int, tuple[float, dict[bytes, bytes]]] = {}  # second -> (read at, keys)
        self._lookup_lock = threading.Lock()  # one etcd read at a time for lookups
        self._head_rev = 0  # the rev head() read (a cold load's window floor)
        self.rev_key = self.key("meta", "rev")
        self._jobs_prefix = self.state_prefix + b"jobs/"
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cluster_prefix = prefix + b"/"  # what a standby watches
        self._watcher: Watcher | None = None
        self._follow_from = 0  # the etcd revision after a standby's snapshot
        self._snapshot_complained = 0.0
        election.watched = self._watch_live
        self._failed_epoch = -1  # the writer's: the epoch of its last failed commit
        self._fault: StorageFault | None = None  # and its fault

    # -- keys ------------------------------------------------------------------------------------

    def key(self, table: str, key: Any) -> bytes:
        """The etcd key of record ``key`` of ``table``."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        name: str = f"{int(key):0{JOB_DIGITS}d}" if table == "jobs" else str(key)
        out: bytes = self.state_prefix + table.encode() + b"/" + name.encode()
        return out

    def guard(self) -> list[Compare]:
        """The fencing compare every write carries."""
        return [mod_revision_is(self.election.leader_key, self.election.token)]

    def chained(self) -> list[Compare]:
        """The guard, and: no transaction committed since the last one this primary knows of."""
        return [*self.guard(), mod_revision_is(self.chain_key, self._chain_rev)]

    # -- open and load ---------------------------------------------------------------------------

    def _retried(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` (idempotent: a read, a create-if-absent), again on another endpoint while
        etcd does not answer, as long as this candidate's lease is provable."""
        while True:
            try:
                return fn()
            except (OutcomeUnknown, EtcdUnavailable):
                if self.election.still_primary() is not None:
                    raise
                time.sleep(0.02)

    def open(self) -> None:
        """Create the store id if this prefix has none (guarded, like every write)."""
        new = secrets.token_hex(8).encode()
        res = self._retried(lambda: self.client.txn([*self.guard(), absent(self.id_key)],
                                                    [put_op(self.id_key, new)]))
        got = self._retried(lambda: self.client.get(self.id_key))
        if got is None:
            raise RuntimeError(f"etcd: the store id {self.id_key.decode()} could not be created "
                               "(is this candidate still the leader?)")
        self.store_id = got.value.decode()
        if res.succeeded:
            logger.info("etcd store {}: created (store id {})", self.settings.prefix, self.store_id)
        chain = self._retried(lambda: self.client.get(self.chain_key))
        self._chain_rev = chain.mod_revision if chain is not None else 0

    def head(self) -> Head:
        """Meta, hosts and queues (no job), and the highest job id, at one etcd revision;
        after :meth:`open`, on a thread."""
        head, _ = self._retried(lambda: self._read_head(0))
        self._head_rev = head.rev
        return head

    def _read_head(self, revision: int) -> tuple[Head, int]:
        """:meth:`head` at ``revision`` (0: the current one), and the revision it read at."""
        loads = orjson.loads
        meta_kvs, revision = self.client.scan(self.state_prefix + b"meta/", revision=revision)
        tables: list[dict[str, dict[str, Any]]] = []
        for t in (b"hosts/", b"queues/", b"revocations/"):
            kvs, _ = self.client.scan(self.state_prefix + t, revision=revision)
            skip = len(self.state_prefix + t)
            tables.append({kv.key[skip:].decode(): loads(record_of(kv.value)) for kv in kvs})
        jobs = self.state_prefix + b"jobs/"
        last, _ = self.client.range(jobs, prefix_end(jobs), limit=1, revision=revision,
                                    last_first=True)
        skip = len(self.state_prefix + b"meta/")
        meta = {kv.key[skip:].decode(): loads(kv.value) for kv in meta_kvs}
        max_jobid = int(last[0].key[len(jobs):len(jobs) + JOB_DIGITS]) if last else 0
        rev = int(meta.get("rev", 0))
        return Head(store_id=self.store_id, rev=rev,
                    next_jobid=max(int(meta.get("next_jobid", 1)), max_jobid + 1),
                    max_jobid=max_jobid, hosts=tables[0], queues=tables[1], meta=meta,
                    floor=rev, revocations=tables[2]), revision

    def load_jobs(self, upto: int, clean_width: float) -> JobTable:
        """Every job with id <= ``upto``, indexed, read at one etcd revision (a thread), with
        the collector off and the result frozen, as for the file store (:meth:`JobTable.load`:
        otherwise the first young collection after the load walks every job holding the GIL,
        and with a 1 s lease a stalled loop can cost the primary its lease)."""
        return self._retried(lambda: self._read_jobs(upto, clean_width, 0))

    def _read_jobs(self, upto: int, clean_width: float, revision: int) -> JobTable:
        jobs = self.state_prefix + b"jobs/"
        kvs, _ = self.client.scan(jobs, end=self.key("jobs", upto + 1), revision=revision)
        return JobTable.load(self._jobs(kvs), clean_width)

    def _jobs(self, kvs: list[KV]) -> Iterator[Job]:
        """Jobs from a scan of their keys."""
        loads = orjson.loads
        for kv in kvs:
            _, data, spec = job_of(kv.value)
            job = Job(spec, *loads(data))
            normalise(job)
            yield job

    def load_window(self, capacity: int, floor: int) -> tuple[list[Change], int]:
        """No retention window (this store keeps no removal records yet): empty, with the
        floor at the rev :meth:`head` read, so a member's older ``since`` gets a snapshot."""
        return [], max(floor, self._head_rev)

    def load_idem(self, since: float, add: Callable[[str, float], None]) -> int:
        """Call ``add(rid, ts)`` for each idempotency key stored at or after ``since``; the
        older ones are deleted (guarded, in bounded transactions)."""
        idem, _ = self._retried(lambda: self.client.scan(self.idem_prefix))
        n = self._add_groups(idem, since, add)
        self._prune(since)
        return n

    def _add_groups(self, groups: list[KV], since: float, add: Callable[[str, float], None]) -> int:
        """``add(rid, second)`` for each key of ``groups`` whose second is not before
        ``since``'s; how many."""
        n = 0
        skip = len(self.idem_prefix)
        floor = int(since)
        for kv in groups:
            second = second_of(kv.key[skip:])
            if second is not None and second >= floor:
                for rid in group_rids(kv.value):
                    add(rid.decode(), float(second))
                    n += 1
        return n

    def load_events(self, limit: int) -> list[bytes]:
        """The newest ``limit`` cluster events (``P/s/events/<seq>``), oldest first: one
        range read, newest first, of at most ``limit`` keys."""
        start = self.state_prefix + b"events/"
        kvs, _ = self._retried(lambda: self.client.range(start, prefix_end(start), limit=limit,
                                                         last_first=True))
        return [record_of(kv.value) for kv in reversed(kvs)]

    def snapshot(self, ring_capacity: int, clean_width: float, idem_since: float,
                 add_idem: Callable[[str, float], None]) -> tuple[Head, JobTable] | None:
        """A standby's load: head, jobs and idempotency keys at one etcd revision (no
        retention window: its floor is the head's rev); the follow then watches from the
        revision after it (:mod:`xce_etcd.follow`). None while no primary created the store,
        or while etcd cannot be read (the follower asks again)."""
        self._stop_watch()
        try:
            got = self.client.get(self.id_key)
            if got is None:
                return None
            head, revision = self._read_head(0)
            head.store_id = got.value.decode()
            table = self._read_jobs(head.max_jobid, clean_width, revision)
            idem, _ = self.client.scan(self.idem_prefix, revision=revision)
        except (EtcdError, EtcdUnavailable, OutcomeUnknown) as exc:
            now = time.monotonic()
            if now - self._snapshot_complained > 5:
                self._snapshot_complained = now
                logger.warning("controller {}: standby: cannot read the state from etcd ({}); "
                               "trying again", self.election.advertise, exc)
            return None
        self._add_groups(idem, idem_since, add_idem)
        self._follow_from = revision + 1
        return head, table

    def _watcher_now(self) -> Watcher:
        if self._watcher is None:
            self._watcher = Watcher(self.client, self.cluster_prefix, self._follow_from,
                                    self.election.advertise, self.election.watch_events,
                                    idle=SILENT_TTLS * self.settings.lease_ttl)
        return self._watcher

    def _watch_live(self) -> bool:
        """Whether this standby's watch is open (it wakes the election's campaign)."""
        w = self._watcher
        return w is not None and w.live

    def _stop_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def wait_changed(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until the watch has events (or fell behind etcd's
        compaction); opens the watch at the first call after a :meth:`snapshot`."""
        return self._watcher_now().wait(timeout)

    def changes_since(self, rev: int) -> Delta | None:
        """What the watch saw after the last call (or the snapshot), as a Delta; None when
        it fell behind etcd's compaction (the follower loads again, logged). Once this
        candidate has won the election (its promotion's catch-up), the watch is stopped and
        the rest is read on a fresh watch up to the campaign's revision: every write the old
        primary committed is below it."""
        w = self._watcher_now()
        token = self.election.token if self.election.still_primary() is None else 0
        if token:
            w.stop()
            self._watcher = None
        events, start, compacted = w.take_all()
        if not compacted and token and start <= token:
            # a few request timeouts: the member this candidate last used may be the one that
            # went with the old primary's host (a connect timeout each, then the next endpoint);
            # giving up here means a cold load, far slower than waiting a little longer
            deadline = time.monotonic() + 5 * self.settings.request_timeout
            try:
                events += read_until(self.client, self.cluster_prefix, start, token, deadline)
            except Compacted as exc:
                compacted = exc.compact_revision
        if compacted:
            self._watcher = None
            logger.warning("controller {}: standby: its etcd watch fell behind compaction "
                           "(revision {} needed, compacted up to {}); loading the state again",
                           self.election.advertise, start, compacted)
            return None
        return delta_of(events, self.state_prefix, self.idem_prefix, rev)

    def _expiry(self, before: float) -> Delete:
        """The range delete of every idempotency group of the seconds before ``before``'s."""
        return Delete(self.idem_prefix, self.idem_prefix + second_bound(int(before)))

    def _prune(self, before: float) -> None:
        """Delete the groups :meth:`_expiry` names (guarded; a load's, outside the writer)."""
        try:
            self.client.txn(self.guard(), [self._expiry(before)])
        except (EtcdError, EtcdUnavailable, OutcomeUnknown) as exc:
            logger.warning("etcd store {}: cannot delete old idempotency keys ({}); the "
                           "housekeeping does it later", self.settings.prefix, exc)

    def committed(self, keys: Iterable[tuple[str, Any]]) -> Images:
        """The committed ``(data, spec)`` of each ``(table, key)`` (None: no such record;
        spec None but for jobs); any thread."""
        out: Images = {}
        for table, key in keys:
            k = self.key(table, key)
            one = self.client.get(k)
            if one is None:
                out[(table, key)] = None
            elif table == "jobs":
                _, data, spec = job_of(one.value)
                out[(table, key)] = (data, spec)
            else:
                out[(table, key)] = (one.value if table == "meta" else record_of(one.value), None)
        return out

    def lookup(self, rid: str, near: float | None = None) -> bytes | None:
        """The stored result of idempotency key ``rid``, or None: from the groups of
        ``near``'s second and the two around it (module docstring), every group when
        ``near`` is None; any thread."""
        key = rid.encode()
        if near is None:
            return self._search(key)
        seconds = range(int(near) - 1, int(near) + 2)
        asked = time.monotonic()
        with self._lookup_lock:
            found, complete = self._cached(key, seconds, asked)
            if found is not None or complete:
                return found
            start = self.idem_prefix + second_bound(seconds[0])
            kvs, _ = self.client.scan(start, end=self.idem_prefix + second_bound(seconds[-1] + 1))
            read: dict[int, dict[bytes, bytes]] = {s: {} for s in seconds}
            skip = len(self.idem_prefix)
            for kv in kvs:
                second = second_of(kv.key[skip:])
                if second in read:
                    read[second].update(group_results(kv.value))
            at = time.monotonic()
            for s, results in read.items():
                self._looked[s] = (at, results)
            while len(self._looked) > LOOKUP_CACHE:
                del self._looked[min(self._looked)]
            return read[int(near)].get(key) or read[seconds[0]].get(key) or read[seconds[-1]].get(key)

    def _cached(self, key: bytes, seconds: range, asked: float) -> tuple[bytes | None, bool]:
        """``key``'s result from the groups read before, and whether those reads cover every
        second of ``seconds`` and came after ``asked`` (then a miss is final)."""
        complete = True
        for s in seconds:
            got = self._looked.get(s)
            if got is None:
                complete = False
                continue
            at, results = got
            if (found := results.get(key)) is not None:
                return found, True
            complete = complete and at >= asked
        return None, complete

    def _search(self, key: bytes) -> bytes | None:
        """``key``'s result from every group (newest first), page by page."""
        end = prefix_end(self.idem_prefix)
        while True:
            kvs, _ = self.client.range(self.idem_prefix, end, limit=256, last_first=True)
            for kv in kvs:
                if second_of(kv.key[len(self.idem_prefix):]) is None:
                    continue
                found = group_results(kv.value).get(key)
                if found is not None:
                    return found
            if len(kvs) < 256:
                return None
            end = kvs[-1].key

    # -- writing ---------------------------------------------------------------------------------

    def ops_of(self, w: Write) -> dict[bytes, Op]:
        """The write's record operations by key (a key written twice: the last one), and
        housekeeping's expiry; not its idempotency key (its transaction's group has it)."""
        ops: dict[bytes, Op] = {}
        stamp = b"%d " % w.rev
        jobs = self._jobs_prefix
        for table, key, data, spec in w.rows:
            k = jobs + b"%0*d" % (JOB_DIGITS, key) if table == "jobs" else self.key(table, key)
            if table == "meta":
                ops[k] = Delete(k) if data is None else Put(k, data)
            elif data is None:
                ops[k] = Delete(k)
            elif table == "jobs":
                if spec is None:
                    raise ValueError(f"job {key}'s row has no submission")
                ops[k] = Put(k, job_value(stamp, data, spec))
            else:
                ops[k] = Put(k, stamp + data)
        if w.expire_before is not None:  # (below the group of this transaction's second)
            ops[self.idem_prefix] = self._expiry(w.expire_before)
        return ops

    def chunks(self, writes: list[Write], now: float) -> list[tuple[list[Write], list[Op]]]:
        """``writes`` split into transactions within the limits, each write whole in one;
        each transaction's idempotency keys in one group of ``now``'s second (the writes'
        ``committed_at``)."""
        limit_ops = self.settings.max_txn_ops - 3  # the chain key, meta/rev, the group
        limit_bytes = self.settings.max_request_bytes - 1024
        second = int(now)
        out: list[tuple[list[Write], list[Op]]] = []
        cur: list[Write] = []
        ops: dict[bytes, Op] = {}
        entries: list[tuple[bytes, bytes]] = []
        size = 0

        def close() -> None:
            if entries:
                self._groups += 1
                name = group_name(second, f"{self.election.token:x}.{self._groups}")
                ops[self.idem_prefix + name] = Put(self.idem_prefix + name, group_value(entries))
            out.append((cur, list(ops.values())))

        for w in writes:
            mine = self.ops_of(w)
            mine_size = sum(op_size(op) for op in mine.values())
            if w.rid is not None:
                mine_size += 4 * (len(w.rid) + len(w.result) + 4) // 3  # its group lines
            if len(mine) > limit_ops or mine_size > limit_bytes:
                raise TooLarge(f"one write has {len(mine)} operations, {mine_size} bytes; the "
                               f"limits are {limit_ops} and {limit_bytes} ([etcd] max_txn_ops, "
                               "max_request_bytes)")
            merged = len(ops) + sum(1 for k in mine if k not in ops)  # (not a set union: a
            # union per write would be quadratic in the writes of a transaction)
            if cur and (merged > limit_ops or size + mine_size > limit_bytes):
                close()
                cur, ops, entries, size = [], {}, [], 0
            cur.append(w)
            ops.update(mine)  # a key written again: one operation, the last write's
            if w.rid is not None:
                entries.append((w.rid.encode(), w.result))
                w.committed_at = float(second)
            size += mine_size
        if cur:
            close()
        return out

    def submit(self, write: Write) -> None:
        """Queue ``write`` (never blocks), stamped with the epoch."""
        write.epoch = self.epoch
        self._queue.put(write)

    def resume(self) -> None:
        """The caller rolled back after a failure: attempt writes again (a new epoch)."""
        self.epoch += 1

    def stop(self) -> None:
        """Make :meth:`run_writer` commit what is queued and return."""
        self._queue.put(_STOP)

    def fault(self, cause: str, code: str = "") -> StorageFault:
        """A STORAGE fault naming this store."""
        return StorageFault(cause, self.path, code)

    def run_writer(self, on_done: Callable[[list[Write]], None]) -> None:
        """Commit queued writes in guarded transactions until :meth:`stop` (module docstring).

        A round takes every write queued and commits it (:meth:`_round`). When nothing is
        queued behind a round, this thread commits the next one itself and reports it (a
        sequential submitter's path: no thread hand-off besides the loop's). When writes are
        queued behind a committed round, the next round goes to a helper thread *before* this
        one reports (``on_done`` waits for the controller's loop), so the next transaction is
        on its way while the loop takes the last one's batch. Reports stay in commit order."""
        ahead: _Ahead | None = None
        self._failed_epoch, self._fault = -1, None
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                done = self._round(first)  # on this thread
                while True:
                    if done.halt:
                        done.report(on_done)
                        return
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        done.report(on_done)
                        break
                    if nxt is _STOP:
                        done.report(on_done)
                        return
                    ahead = ahead or _Ahead(self._round)
                    pending = ahead.start(nxt)
                    done.report(on_done)
                    done = pending.result()
        finally:
            if ahead is not None:
                ahead.close()

    def _round(self, first: Write) -> _Round:
        """Take ``first`` and every write queued behind it, commit them; what to report."""
        batch, stopping = take_batch(self._queue, first, stop=_STOP)
        out = _Round([], stopping)
        live = fail_doomed(batch, self._failed_epoch, self._fault, out.batches.append)
        if live:
            got = self._commit_all(live, out.batches.append)
            if got is None:
                out.halt = True  # not primary any more, or an outcome unknown: stop there
            elif isinstance(got, StorageFault):
                self._fault, self._failed_epoch = got, max(w.epoch for w in live)
        return out

    def _commit_all(self, live: list[Write], on_done: Callable[[list[Write]], None]
                    ) -> StorageFault | bool | None:
        """Commit ``live`` chunk by chunk: False (all committed), a fault (the rest failed and
        was reported), or None (stop: leadership lost or an outcome unknown)."""
        now = time.time()
        try:
            parts = self.chunks(live, now)
        except TooLarge as exc:
            f = self.fault(f"a write exceeds etcd's transaction limits: {exc}", "E2BIG")
            return self._fail(live, f, on_done)
        except ValueError as exc:  # a row this store cannot keep (a bug upstream): say so
            return self._fail(live, self.fault(f"a write cannot be stored: {exc}", "EINVAL"), on_done)
        for i, (writes, ops) in enumerate(parts):
            try:
                top = max(w.rev for w in writes)
                res = self._commit_chunk(ops, top)
            except EtcdError as exc:  # refused before it was proposed: certainly not applied
                code = "NOSPACE" if "space exceeded" in exc.message else f"GRPC{exc.code}"
                cause = (f"etcd is full (its quota: {exc.message}; compact and defragment, or "
                         "raise --quota-backend-bytes)" if code == "NOSPACE"
                         else f"etcd refused the transaction: {exc.message}")
                rest = [w for ws, _ in parts[i:] for w in ws]
                return self._fail(rest, self.fault(cause, code), on_done)
            except (OutcomeUnknown, EtcdUnavailable) as exc:
                # Not resolved before this primary's lease deadline: it steps down.
                why = f"an etcd write's outcome is unknown ({exc})"
                logger.error("controller {}: {}; not acknowledging it nor anything after it, "
                             "giving up the primary role (the next primary loads what committed)",
                             self.election.advertise, why)
                self.election.lost(why)
                return None
            if not res.succeeded:
                why = (f"its etcd guard failed: the leader key {self.election.leader_key.decode()} "
                       f"is no longer the one it wrote at revision {self.election.token}")
                logger.error("controller {}: {}; another candidate leads: not acknowledging, "
                             "giving up the primary role", self.election.advertise, why)
                self.election.lost(why)
                return None
            self.revision = res.revision
            self.commits += 1
            self.election.committed_at = time.monotonic()  # (the standbys saw it: no beat)
            on_done(writes)
        return False

    def _commit_chunk(self, ops: list[Op], rev: int = 0) -> TxnResult:
        """Commit ``ops`` once, whatever happens to a request: resolve unknown outcomes.

        Every transaction also writes its own id to ``P/w`` and requires ``P/w`` unchanged
        since the last transaction this primary knows of. When one gets no answer (a member
        lost, a timeout), another endpoint is asked: ``P/w`` holding its id means it
        committed; unchanged means it has not *yet*, and a fence (a transaction that only
        rewrites ``P/w`` under the same compare) makes sure it never will, after which it is
        sent again. So a lost member costs a retry, not a failover. Raises OutcomeUnknown
        when this cannot be settled while the lease is still provable. ``rev``: the highest
        controller rev of the chunk (0: none), written to ``meta/rev`` and named in ``P/w``.
        """
        if rev:
            ops = [*ops, put_op(self.rev_key, str(rev).encode())]
        while True:
            self._batches += 1
            mine = f"{self.election.advertise} {self.election.token} {self._batches} rev {rev}".encode()
            try:
                res = self.client.txn(self.chained(), [*ops, put_op(self.chain_key, mine)],
                                      timeout=self.settings.request_timeout)
            except (OutcomeUnknown, EtcdUnavailable) as exc:
                got = self._resolve(mine, exc)
                if got is None:
                    continue  # fenced: certainly not applied; send it again
                res = got
            if res.succeeded:
                self._chain_rev = res.revision
            return res

    def _resolve(self, mine: bytes, first: Exception) -> TxnResult | None:
        """After transaction ``mine`` got no answer: its result if it committed, None once it
        is certain it never will (fenced); OutcomeUnknown if the lease runs out first."""
        last: Exception = first
        while self.election.still_primary() is None:
            try:
                got = self.client.get(self.chain_key)
                if got is not None and got.value == mine:
                    self.resolved += 1
                    return TxnResult(True, got.mod_revision, [])
                if got is not None and got.value == b"fence " + mine:  # our fence took after all
                    self._chain_rev = got.mod_revision
                    self.resolved += 1
                    return None
                if (got.mod_revision if got is not None else 0) != self._chain_rev:
                    return TxnResult(False, 0, [])  # someone else wrote: the guard would fail
                fence = self.client.txn(self.chained(), [put_op(self.chain_key, b"fence " + mine)],
                                        timeout=self.settings.request_timeout)
                if fence.succeeded:
                    self._chain_rev = fence.revision
                    self.resolved += 1
                    logger.warning("controller {}: an etcd transaction got no answer ({}); it was "
                                   "fenced off and is sent again", self.election.advertise, first)
                    return None
            except (OutcomeUnknown, EtcdUnavailable) as exc:
                last = exc
            time.sleep(0.01)
        raise OutcomeUnknown(f"{first}; not settled before the lease deadline ({last})")

    @staticmethod
    def _fail(writes: list[Write], fault: StorageFault,
              on_done: Callable[[list[Write]], None]) -> StorageFault:
        for w in writes:
            w.error = fault
        on_done(writes)
        return fault

    def close(self) -> None:
        """Stop a standby's watch (the client belongs to the plugin)."""
        self._stop_watch()

