"""A scripted fake xce controller, for client tests: in memory, or on real loopback sockets.

It speaks docs/protocol.md (handshake, requests, replies, pushes) and can be told to behave
as a primary, a standby redirecting to another candidate or knowing no primary, a black hole
(``hang``), or to misbehave on the Nth request (drop the connection, send garbage, hold the
reply forever). It records every request, answers ``join`` with the state sync of
docs/protocol.md (``sync_begin``, records, ``sync_end``: a :class:`syncsource.SyncSource`
keeps the records, their revisions and the retention window), pushes changes to the members
whose subscription wants them (:meth:`FakeController.change`), and can be killed (listener
and every connection closed) and restarted on the same address.

Given a :class:`~xcecore.client.backend.MemoryNetwork` (``net=``) it listens there -- the
client under test then uses that network as its backend and no socket is involved; without
one it listens on a real TCP port (the tests that are about sockets).

Candidates of one fake cluster share a :class:`SharedStore` -- the "state directory" -- so a
write retried on a new primary under the same rid is applied exactly once, and its records
and revisions (the store's ``sync``) survive a failover.

Run it standalone (for benchmarks): ``python fakectl.py --modes standby,primary`` prints one
``host:port`` per line, the standbys redirecting to the first primary, and serves until killed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from anyio.abc import ByteStream, SocketAttribute, TaskGroup
from anyio.streams.buffered import BufferedByteStream
from syncsource import SyncSource

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth
from xcecore.candidates import Candidate
from xcecore.client.backend import MemoryNetwork
from xcecore.testing import free_port as free_port  # the shared kit's, re-exported for these tests

Mode = Literal["primary", "standby", "hang"]


_MEMORY_PORTS = itertools.count(20000)
_USERS = auth.Users()  # the fake names callers as a controller does: by its own uid


def nowhere(net: MemoryNetwork | None = None) -> str:
    """An address nothing listens on (a "refused" candidate), in memory or on loopback."""
    if net is not None:
        return f"nowhere.test:{next(_MEMORY_PORTS)}"
    return f"127.0.0.1:{free_port()}"


@dataclass
class Recorded:
    """One request as the fake received it."""

    server: str
    conn: int
    op: str
    args: dict[str, Any]
    rid: str | None
    sender: str


@dataclass
class SharedStore:
    """The candidates' shared durable state: ``rid -> result`` and every applied write."""

    results: dict[str, Any] = field(default_factory=dict)
    applied: list[Recorded] = field(default_factory=list)
    sync: SyncSource = field(default_factory=SyncSource)

    def apply(self, rec: Recorded) -> Any:
        """Apply ``rec`` once per rid; a repeated rid returns the stored result."""
        if rec.rid is not None and rec.rid in self.results:
            return self.results[rec.rid]
        self.applied.append(rec)
        result = {"op": rec.op, "applied_by": rec.server, "n": len(self.applied)}
        if rec.rid is not None:
            self.results[rec.rid] = result
        return result


class _Session:
    def __init__(self, number: int, sender: str, stream: BufferedByteStream) -> None:
        self.number = number
        self.sender = sender
        self.stream = stream
        self.joined = False
        self.role = ""
        self.subscribe: dict[str, str] | None = None
        self.host: str | None = None
        self.seq = 0
        self.send_lock = anyio.Lock()

    async def send(self, msg: dict[str, Any] | bytes) -> None:
        data = msg if isinstance(msg, bytes) else wire.encode(msg)
        async with self.send_lock:
            await self.stream.send(data)

    async def push(self, event: str, data: Any, *, skip: int = 0,
                   before: dict[str, Any] | None = None) -> None:
        """Send a push (after ``before``, atomically): seq is taken in send order."""
        async with self.send_lock:
            if before is not None:
                await self.stream.send(wire.encode(before))
            self.seq += 1 + skip
            await self.stream.send(wire.encode(wire.push(event, self.seq, data)))


STATELESS_OPS = frozenset({"join", "heartbeat", "hello"})


class FakeController:
    """One fake controller candidate; use ``async with FakeController(...) as ctl``.

    Scripting knobs (plain attributes, change them at any time):

    - ``mode``: ``primary``, ``standby`` (redirect to ``primary`` or, if None, NO_PRIMARY),
      ``hang`` (accept, then never answer: a black hole; live sessions go silent too)
    - ``drop_on_op``: on the Nth request since start (1-based), close the connection without
      replying; with ``apply_before_drop`` a write is applied first (the reply is "lost"),
      with ``kill_on_drop`` the whole controller dies there
    - ``garbage_on_op``: on the Nth request, answer with a frame that is not JSON
    - ``hold_ops``: requests of these ops are recorded and never answered
    - ``require_join``: ops that answer NOT_JOINED on a connection that has not joined
    - ``handlers``: op -> function(args) returning the result (or raising RemoteError)
    - ``between_frames``: an async function(index) awaited after the index-th frame of a sync
      (tests interleave ordinary changes with the records there)
    - ``takeover_ms``: a standby's promise to take over from a hung primary (its verdict then
      names no primary); ``promote_at``: the connection number (1-based) from which a
      standby answers as primary, as one that promoted
    """

    def __init__(
        self,
        name: str = "ctl",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: Mode = "primary",
        primary: str | None = None,
        store: SharedStore | None = None,
        key: bytes | None = None,
        net: MemoryNetwork | None = None,
    ) -> None:
        self.name = name
        self.net = net
        self.host = f"{name}.test" if net is not None and host == "127.0.0.1" else host
        self.port = port or (next(_MEMORY_PORTS) if net is not None else 0)
        self.mode: Mode = mode
        self.primary = primary
        self.store = store if store is not None else SharedStore()
        self.key = key
        self.drop_on_op: int | None = None
        self.apply_before_drop = False
        self.kill_on_drop = False
        self.garbage_on_op: int | None = None
        self.hold_ops: set[str] = set()
        self.require_join: set[str] = set()
        self.handlers: dict[str, Callable[[dict[str, Any]], Any]] = {}
        self.between_frames: Callable[[int], Any] | None = None
        self.takeover_ms: int | None = None
        self.promote_at: int | None = None
        self.requests: list[Recorded] = []
        self.joins: list[Recorded] = []
        self.op_count = 0
        self.connections = 0
        self.running = False
        self._sessions: dict[int, _Session] = {}
        self._streams: set[ByteStream] = set()
        self._tg: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self.changed = anyio.Event()  # set (and replaced) on every request: tests wait on it

    # ------------------------------------------------------------------ life cycle
    @property
    def address(self) -> str:
        """The advertised ``host:port``."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def __aenter__(self) -> FakeController:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        await self.kill()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc)

    @property
    def candidate(self) -> Candidate:
        """The candidate a client lists for this fake."""
        return Candidate(self.host, self.port)

    async def start(self) -> None:
        """Listen (again) on ``port`` (a fresh one the first time if 0)."""
        assert self._tg is not None and not self.running
        if self.net is not None:
            self.net.listen(self.candidate, self._handle, self._tg)
            self.running = True
            return
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        self.port = listener.extra(SocketAttribute.local_port)
        self._scope = anyio.CancelScope()
        self._stopped = anyio.Event()
        self.running = True
        self._tg.start_soon(self._serve, listener, self._scope, self._stopped)

    async def kill(self) -> None:
        """Die like a crashed process: close the listener and every connection at once."""
        if not self.running:
            return
        self.running = False
        if self.net is not None:
            self.net.unlisten(self.candidate)
        for stream in list(self._streams):
            await anyio.aclose_forcefully(stream)
        if self.net is not None:
            return
        assert self._scope is not None
        self._scope.cancel()
        await self._stopped.wait()

    async def _die(self) -> None:
        self.running = True
        await self.kill()

    async def restart(self) -> None:
        """Kill (if running) and start again on the same port."""
        await self.kill()
        await self.start()

    # ------------------------------------------------------------------ pushes
    async def push(self, event: str, data: Any = None, *, skip: int = 0) -> int:
        """Push ``event`` to every joined session; ``skip`` leaves a seq gap. Returns count."""
        sent = 0
        for sess in list(self._sessions.values()):
            if not sess.joined:
                continue
            try:
                await sess.push(event, data, skip=skip)
                sent += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
        return sent

    @property
    def sync(self) -> SyncSource:
        """The records, revisions and retention window (shared by the fake cluster)."""
        return self.store.sync

    async def change(self, kind: str, record: dict[str, Any]) -> int:
        """Put ``record`` in the store and push it to the members that want it; how many."""
        before = self.sync.records.get(kind, {}).get(_key(kind, record))
        event, data = self.sync.put(kind, record)
        return await self._fan_out(event, data, before)

    async def remove(self, kind: str, keys: list[Any]) -> int:
        """Remove records (one revision) and push the removal; how many members got it."""
        event, data = self.sync.remove(kind, keys)
        return await self._fan_out(event, data, None)

    async def _fan_out(self, event: str, data: Any, before: dict[str, Any] | None) -> int:
        sent = 0
        for sess in list(self._sessions.values()):
            if not sess.joined or not self.sync.wants(sess.subscribe, sess.role, sess.host,
                                                      event, data, before):
                continue
            try:
                await sess.push(event, data)
                sent += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
        return sent

    def ops(self, op: str) -> list[Recorded]:
        """Recorded requests of ``op``."""
        return [r for r in self.requests if r.op == op]

    async def wait_for(self, pred: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``pred()`` holds (checked after every request, and every 10 ms)."""
        with anyio.fail_after(timeout):
            while not pred():
                with anyio.move_on_after(0.01):
                    await self.changed.wait()

    # ------------------------------------------------------------------ serving
    async def _serve(self, listener: Any, scope: anyio.CancelScope, stopped: anyio.Event) -> None:
        try:
            with scope:
                async with listener:
                    await listener.serve(self._handle)
        finally:
            stopped.set()

    async def _handle(self, raw: ByteStream) -> None:
        self.connections += 1
        number = self.connections
        if self.mode == "standby" and self.promote_at is not None and number >= self.promote_at:
            self.mode = "primary"
        stream = BufferedByteStream(raw)
        self._streams.add(raw)
        try:
            if self.mode == "hang":
                await anyio.sleep_forever()
            method = KeyAuth(self.key)
            challenge, hello = auth.server_hello(method)
            await wire.write_message(stream, hello)
            answer = await wire.read_message(stream)
            try:
                who = auth.authenticate(method, challenge, answer, _USERS)
                sender = who.sender
            except auth.AuthFailed as exc:
                await wire.write_message(stream, {"ok": False, "error": exc.to_error()})
                return
            except auth.AuthError as exc:
                await wire.write_message(stream, {"ok": False, "error": {
                    "code": "DENIED", "message": str(exc)}})
                return
            status: dict[str, Any] = {"ok": True, "server": self.address, "state": self.mode,
                                      "identity": who.to_wire()}
            if self.mode == "standby":
                status["primary"] = self.primary
                if self.takeover_ms is not None:
                    status.update(primary=None, takeover_ms=self.takeover_ms)
            await wire.write_message(stream, status)
            sess = _Session(number, sender, stream)
            self._sessions[number] = sess
            while True:
                msg = await wire.read_message(stream)
                await self._dispatch(sess, msg)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.ClosedResourceError, wire.WireError, OSError):
            pass
        finally:
            self._sessions.pop(number, None)
            self._streams.discard(raw)
            await anyio.aclose_forcefully(stream)

    async def _join(self, sess: _Session, req: wire.Request, rec: Recorded) -> None:
        args = req.args
        sess.joined, sess.role = True, str(args.get("role"))
        sess.subscribe = args.get("subscribe")
        attrs = args.get("attrs") or {}
        sess.host = attrs.get("hname") if isinstance(attrs, dict) else None
        self.joins.append(rec)
        sync, frames = self.sync.join(sess.subscribe, args.get("since"), sess.role, sess.host)
        result = {"member": sess.sender, "server": self.address, "role": sess.role, "sync": sync}
        first, *rest = frames
        await sess.push(first[0], first[1], before=wire.reply_ok(req.id, result))
        for i, (event, data) in enumerate(rest):
            await sess.push(event, data)
            if self.between_frames is not None and event == "sync_records":
                await self.between_frames(i)

    def _record(self, sess: _Session, req: wire.Request) -> Recorded:
        rec = Recorded(self.name, sess.number, req.op, req.args, req.rid, sess.sender)
        self.requests.append(rec)
        self.changed.set()
        self.changed = anyio.Event()
        return rec

    async def _dispatch(self, sess: _Session, msg: dict[str, Any]) -> None:
        try:
            req = wire.parse_request(msg)
        except wire.RemoteError as exc:
            await sess.send(wire.reply_error(msg.get("id"), exc.code, exc.message))
            return
        self.op_count += 1
        n = self.op_count
        rec = self._record(sess, req)
        if self.mode == "hang":  # recorded, then silence: a black hole
            await anyio.sleep_forever()
        if self.mode == "standby":
            if self.primary:
                await sess.send(wire.reply_error(req.id, "REDIRECT", "I am a standby",
                                                 primary=self.primary))
            else:
                await sess.send(wire.reply_error(req.id, "NO_PRIMARY", "no primary"))
            return
        if n == self.drop_on_op:
            if self.apply_before_drop:
                self.store.apply(rec)
            if self.kill_on_drop:
                assert self._tg is not None
                self.running = False  # refuse at once, like a dead process
                self._tg.start_soon(self._die)
            await anyio.aclose_forcefully(sess.stream)
            return
        if n == self.garbage_on_op:
            await sess.send(b"\x00\x00\x00\x05{nope")
            return
        if req.op in self.hold_ops:
            return
        if req.op == "join":
            await self._join(sess, req, rec)
            return
        if req.op in self.require_join and not sess.joined:
            await sess.send(wire.reply_error(req.id, "NOT_JOINED", f"join before {req.op}"))
            return
        try:
            if req.op in self.handlers:
                result = self.handlers[req.op](req.args)
            elif req.op in STATELESS_OPS:
                result = {"server": self.name}
            else:
                result = self.store.apply(rec)
        except wire.RemoteError as exc:
            await sess.send(wire.reply_error(req.id, exc.code, exc.message))
            return
        await sess.send(wire.reply_ok(req.id, result))


async def _main(modes: list[str]) -> None:
    store = SharedStore()
    async with anyio.create_task_group() as tg:
        ctls = [FakeController(f"c{i}", store=store, mode="primary" if m == "primary" else
                               "standby") for i, m in enumerate(modes)]
        for ctl in ctls:
            ctl._tg = tg
            await ctl.start()
        primary = next((c.address for c in ctls if c.mode == "primary"), None)
        for ctl in ctls:
            ctl.primary = primary
            # Benchmarks hammer one op: do not keep every request.
            ctl.requests = _Discard()
            print(ctl.address, flush=True)
        await anyio.sleep_forever()


def _key(kind: str, record: dict[str, Any]) -> Any:
    from xcecore.replica import record_key

    return record_key(kind, record)


class _Discard(list[Recorded]):
    def append(self, item: Recorded) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="primary", help="e.g. standby,primary")
    ns = parser.parse_args()
    try:
        anyio.run(_main, ns.modes.split(","))
    except KeyboardInterrupt:
        sys.exit(0)
