"""Helpers for the controller tests: a tiny raw client (xcecore.wire + xcecore.auth only),
an in-process controller, and controller subprocesses that are always killed by pid."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from xce_controller import sync
from xce_controller.changes import ChangeRing, VolatileLog
from xce_controller.server import Controller, serve
from xce_controller.settings import ClusterConf, ControllerSettings, config_of, settings_from_config
from xce_controller.state import ClusterState
from xce_controller.store import SQLiteStore
from xce_controller.subscribe import Subscription
from xce_controller.subscribe import parse as parse_subscription

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth
from xcecore.replica import Replica
from xcecore.testing import Proc as HarnessProc
from xcecore.testing import free_port

KEY = b"test-cluster-key"
REPO = Path(__file__).resolve().parents[2]


class RawClient:
    """One connection: handshake, requests by id, pushes collected in order."""

    def __init__(self, stream: SocketStream, hello: dict[str, Any]) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)
        self.hello = hello
        self.ids = itertools.count(1)
        self.replies: dict[int, dict[str, Any]] = {}
        self.pushes: list[dict[str, Any]] = []

    @classmethod
    async def connect(
        cls, address: str, identity: str = "apiserver@test", key: bytes | None = KEY
    ) -> RawClient:
        host, _, port = address.rpartition(":")
        stream = await anyio.connect_tcp(host.strip("[]"), int(port))
        reader = BufferedByteReceiveStream(stream)
        hello = await wire.read_message(reader)
        await wire.write_message(stream, auth.client_answer(KeyAuth(key), identity, hello))
        status = await wire.read_message(reader)
        client = cls(stream, status)
        client.reader = reader
        return client

    async def send(self, op: str, args: dict[str, Any] | None = None, rid: str | None = None) -> int:
        n = next(self.ids)
        await wire.write_message(self.stream, wire.request(n, op, args, rid))
        return n

    async def _read_one(self) -> None:
        msg = await wire.read_message(self.reader)
        if "push" in msg:
            self.pushes.append(msg)
        else:
            self.replies[msg["id"]] = msg

    async def reply(self, n: int, timeout: float = 10) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while n not in self.replies:
                await self._read_one()
        return self.replies.pop(n)

    async def call(self, op: str, args: dict[str, Any] | None = None, rid: str | None = None) -> dict[str, Any]:
        """Send and wait for the reply (the whole reply message)."""
        return await self.reply(await self.send(op, args, rid))

    async def ok(self, op: str, args: dict[str, Any] | None = None, rid: str | None = None) -> Any:
        """Call and return the result, failing the test on an error reply."""
        msg = await self.call(op, args, rid)
        assert msg["ok"], msg
        return msg["result"]

    async def jobs(self, args: dict[str, Any] | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Every job ``jobinfo`` with ``args`` lists, following its pages."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = await self.ok("jobinfo", {**(args or {}), "limit": limit,
                                             **({"cursor": cursor} if cursor else {})})
            out += page["jobs"]
            cursor = page["next"]
            if cursor is None:
                return out

    async def push(self, event: str | None = None, timeout: float = 5) -> dict[str, Any]:
        """The next push (of ``event`` if given), skipping others."""
        with anyio.fail_after(timeout):
            while True:
                while self.pushes:
                    p = self.pushes.pop(0)
                    if event is None or p["push"] == event:
                        return p
                await self._read_one()

    async def aclose(self) -> None:
        await self.stream.aclose()


def replica_for(args: dict[str, Any]) -> Replica:
    """An empty replica of what a join with ``args`` subscribes to (the roles' own class)."""
    role = args["role"]
    host = (args.get("attrs") or {}).get("hname") if role == "worker" else None
    sub = parse_subscription(args.get("subscribe"), role, host)
    return Replica(sub.wanted(), host=host, manage_gc=False, name=f"test {role}")


async def follow(member: RawClient, rep: Replica, syncs: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    """Feed ``member``'s pushes to ``rep`` until ``syncs`` more syncs ended; the pushes fed."""
    fed: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        while syncs:
            p = await member.push(timeout=timeout)
            fed.append(p)
            assert rep.apply(p["push"], p["data"]) or p["push"] in ("signal", "shutdown"), p
            if p["push"] == "sync_end":
                syncs -= 1
    return fed


async def join_synced(member: RawClient, args: dict[str, Any], timeout: float = 30) -> tuple[dict[str, Any], Replica]:
    """Join with ``args`` and follow the sync it starts, as a role does: (the join's result,
    the member's replica once ``sync_end`` arrived)."""
    member.pushes.clear()
    result = await member.ok("join", args)
    rep = replica_for(args)
    await follow(member, rep, 1, timeout)
    return result, rep


@dataclass
class _Source:
    state: ClusterState
    ring: ChangeRing
    volatile: VolatileLog
    store_id: str = "test-store"
    rev: int = 0


def synced_view(st: ClusterState, sub: Subscription) -> Replica:
    """In process: a member's replica after the snapshot sync of ``sub`` from ``st`` (the
    frames the controller streams, applied as a role applies them)."""
    src = _Source(st, ChangeRing(16), VolatileLog(16))
    plan = sync.plan(src, sub, None, src.rev)
    rep = Replica(sub.wanted(), host=sub.host, manage_gc=False, name="test member")
    rep.apply("sync_begin", orjson.loads(sync.begin(src, sub, plan)))
    for frames in sync.chunks(src, sub, plan):
        for name, data in frames:
            assert rep.apply(name, orjson.loads(data)), name
    assert rep.complete
    return rep


def reload(state_dir: Path, conf: ClusterConf | None = None) -> ClusterState:
    """What a newly promoted primary would hold once it has loaded ``state_dir``'s store."""
    store = SQLiteStore(str(state_dir))
    store.open()
    try:
        head = store.head()
        table = store.load_jobs(head.max_jobid, 60.0)
    finally:
        store.close()
    st = ClusterState(conf or ClusterConf(queues=({"name": "normal", "priority": 30},)))
    st.take_head(head.hosts, head.queues, head.next_jobid, time.time(), head.revocations)
    st.take_jobs(table)
    return st


def settings(state_dir: Path, **controller: Any) -> ControllerSettings:
    section: dict[str, Any] = {"listen": "127.0.0.1:0", "admins": ["root"],
                               "state_dir": str(state_dir), **controller}
    return settings_from_config(config_of(controller=section), KeyAuth(KEY))


@asynccontextmanager
async def running(state_dir: Path, *, wait_primary: bool = True, **controller: Any) -> AsyncIterator[Controller]:
    """An in-process controller candidate on ``state_dir``, cancelled on exit."""
    async with anyio.create_task_group() as tg:
        ctl: Controller = await tg.start(serve, settings(state_dir, **controller))
        if wait_primary:
            with anyio.fail_after(10):
                await ctl.promoted.wait()
        try:
            yield ctl
        finally:
            tg.cancel_scope.cancel()


@dataclass
class Proc(HarnessProc):
    """A controller subprocess (the shared harness's process) and the address it serves."""

    address: str = ""


def start_controller(state_dir: Path, log_dir: Path, port: int | None = None, *extra: str,
                     env: dict[str, str] | None = None) -> Proc:
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    log = log_dir / f"ctl-{port}.log"
    keyfile = log_dir / "key"
    keyfile.write_bytes(KEY)
    cmd = [sys.executable, "-m", "xce_controller", "--listen", address, "--state-dir", str(state_dir),
           "--key-file", str(keyfile), "--admins", "root", *extra]
    with open(log, "wb") as fh:
        popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                 env=None if env is None else {**os.environ, **env})
    return Proc(f"ctl-{port}", popen, log, address)


@contextmanager
def controllers(state_dir: Path, log_dir: Path, n: int, expect: str = "primary") -> Iterator[list[Proc]]:
    """Start ``n`` candidates, the first one first (waiting until it is ``expect``, normally
    the primary); kill all on exit."""
    procs: list[Proc] = []
    try:
        for _ in range(n):
            procs.append(start_controller(state_dir, log_dir))
            if len(procs) == 1:
                wait_listening(procs[0].address, state=expect)
        yield procs
    finally:
        for p in procs:
            p.kill()


def wait_listening(address: str, timeout: float = 15, state: str | None = None) -> None:
    """Wait until the candidate at ``address`` completes a handshake (as ``state``, if given).

    A port that accepts is not enough: a candidate listens before it has taken the lock.
    """
    from xcecore.testing.cluster import probe

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = probe(host, int(port), KeyAuth(KEY), timeout=0.5)
        if answer and answer.get("ok") and (state is None or answer.get("state") == state):
            return
        time.sleep(0.02)
    raise TimeoutError(f"controller at {address} is not {state or 'answering'} after {timeout} s")


async def handshake_state(address: str) -> dict[str, Any]:
    """The handshake status of the candidate at ``address``."""
    c = await RawClient.connect(address)
    await c.aclose()
    return c.hello


async def find_primary(addresses: list[str], timeout: float = 10) -> str:
    """Poll until one candidate answers the handshake as primary."""
    with anyio.fail_after(timeout):
        while True:
            for a in addresses:
                try:
                    if (await handshake_state(a)).get("state") == "primary":
                        return a
                except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    pass
            await anyio.sleep(0.01)
