"""Delegated ops: calls the controller forwards to a member that serves them, and relays back.

Clients (the CLI, the API server) talk only to the controller: authenticated, highly
available, one address list. Some ops are answered by a member instead (the accounting role
answers ``history.*`` from its own database). Such a member declares them when it joins
(``attrs["serves"]``: names from :data:`xcecore.schema.delegated.DELEGATED_ARGS`, so no member
can claim a controller op); a call to one of them, from any client, is validated against its
schema, pushed (``delegate``) to one connected member serving it with the **caller's
identity** attached by the controller (``{"user", "admin", "role", "identity"}``: the member
authorizes from that, never from the arguments), and the member's ``delegate_reply`` is
relayed to the caller as the call's reply.

Bounds: at most :data:`MAX_INFLIGHT` calls waiting on one member (more: UNAVAILABLE), a reply
no larger than the caller's frame limit, and a timeout (``[controller] delegate_timeout``,
default 10 s) after which the
caller gets UNAVAILABLE and a late answer is dropped. A member that disconnects fails its
waiting calls at once. Nothing here is durable: after a failover members re-join and declare
again, and a call in flight is retried by the client like any read.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import orjson
from loguru import logger

from xce_controller.authz import FRONT_ENDS, Policy
from xce_controller.ops import WORKER, Caller
from xce_controller.settings import DELEGATE_TIMEOUT
from xcecore import wire
from xcecore.schema.delegated import DELEGATE_REPLY, compile_delegated
from xcecore.wire import ErrorCode, RemoteError

MAX_INFLIGHT = 256
"""Calls waiting on one serving member at once."""
SCHEMAS = compile_delegated()


class Conn(Protocol):
    """What this module needs of a server connection."""

    cid: int
    caller: Caller
    outbox: Any


@dataclass(slots=True)
class _Call:
    id: int
    op: str
    caller_cid: int
    request_id: int
    member_cid: int
    deadline: float


class Delegates:
    """The controller's table of served ops and calls in flight (on the event loop only)."""

    def __init__(self, conns: dict[int, Any], policy: Callable[[], Policy],
                 max_frame: Callable[[], int], spawn: Callable[[Callable[[], Any]], None],
                 address: Callable[[], str], timeout: float = DELEGATE_TIMEOUT) -> None:
        self._conns = conns
        self.timeout = timeout  # seconds a call waits for its member's answer
        self._policy = policy
        self._max_frame = max_frame
        self._spawn = spawn
        self._address = address
        self.served: dict[str, list[int]] = {}  # op -> member connection ids, join order
        self._by_member: dict[int, tuple[str, ...]] = {}
        self._calls: dict[int, _Call] = {}
        self._waiting: dict[int, int] = {}  # member cid -> calls in flight
        self._deadlines: deque[tuple[float, int]] = deque()
        self._ids = itertools.count(1)
        self._sweeping = False
        self._turn = itertools.count()

    # -- the server's hooks ---------------------------------------------------------------

    def handles(self, op: str) -> bool:
        """Whether ``op`` is a delegated op or ``delegate_reply``."""
        return op in SCHEMAS

    def joined(self, conn: Conn, attrs: Any) -> None:
        """After a successful join: record the ops the member declared (replacing earlier ones)."""
        self.left(conn.cid, quiet=True)
        serves = attrs.get("serves") if isinstance(attrs, dict) else None
        if not serves or not isinstance(serves, list):
            return
        role = conn.caller.role
        if role in FRONT_ENDS or role == WORKER:
            logger.warning("controller {}: {} (role {}) declared ops it serves; front ends and "
                           "workers serve none, ignored", self._address(), conn.caller.identity, role)
            return
        ops = tuple(sorted({op for op in serves if isinstance(op, str) and op in SCHEMAS
                            and op != DELEGATE_REPLY}))
        unknown = sorted({str(op)[:64] for op in serves} - set(ops))
        if unknown:
            logger.warning("controller {}: {} declared unknown delegated ops {}; ignored",
                           self._address(), conn.caller.identity, ", ".join(unknown))
        for op in ops:
            self.served.setdefault(op, []).append(conn.cid)
        if ops:
            self._by_member[conn.cid] = ops
            logger.info("controller {}: {} serves {}", self._address(), conn.caller.identity,
                        ", ".join(ops))

    def left(self, cid: int, *, quiet: bool = False) -> None:
        """A connection closed (or re-joined): forget what it served, fail its waiting calls,
        drop the calls it made."""
        ops = self._by_member.pop(cid, ())
        for op in ops:
            members = self.served.get(op, [])
            if cid in members:
                members.remove(cid)
            if not members:
                self.served.pop(op, None)
        if ops and not quiet:
            logger.info("controller {}: the member serving {} left", self._address(), ", ".join(ops))
        if not self._calls:  # the usual case: a disconnect costs nothing here
            return
        for call in [c for c in self._calls.values() if c.member_cid == cid or c.caller_cid == cid]:
            self._calls.pop(call.id, None)
            self._forget(call)
            if call.member_cid == cid and call.caller_cid != cid:
                self._fail(call, f"{call.op}: the member serving it disconnected before it "
                                 "answered; try again")

    def call(self, conn: Conn, req: wire.Request) -> None:
        """Answer ``req`` (a delegated op or ``delegate_reply``); never raises."""
        try:
            if req.op == DELEGATE_REPLY:
                self._reply(conn, req)
            else:
                self._forward(conn, req)
        except RemoteError as exc:
            conn.outbox.reply(wire.encode(wire.reply_error(req.id, exc.code, exc.message, **exc.data)), None)

    # -- forwarding -------------------------------------------------------------------------

    def _forward(self, conn: Conn, req: wire.Request) -> None:
        caller = conn.caller
        args = SCHEMAS[req.op].check(req.args)
        policy = self._policy()
        # The authenticated user, or the one a front end acts for (nobody else may name one).
        user = policy.acting_for(req.op, caller.who, args.get("user"), must_name=True)
        members = self.served.get(req.op)
        if not members:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"no member serves {req.op} (is the role that "
                                                     "answers it running and joined?)")
        # Round robin over the members serving it, skipping those at their bound.
        order = next(self._turn)
        member = None
        for i in range(len(members)):
            cid = members[(order + i) % len(members)]
            if self._waiting.get(cid, 0) < MAX_INFLIGHT and cid in self._conns:
                member = self._conns[cid]
                break
        if member is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{req.op}: every member serving it has "
                                                     f"{MAX_INFLIGHT} calls waiting; try again")
        identity = {"user": user, "admin": policy.is_admin(user), "role": caller.role,
                    "identity": caller.identity}
        call = _Call(next(self._ids), req.op, conn.cid, req.id, member.cid, time.monotonic() + self.timeout)
        data = orjson.dumps({"call": call.id, "op": req.op, "args": args, "caller": identity})
        if not member.outbox.push("delegate", data, None):
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{req.op}: the member serving it is not "
                                                     "reading; try again")
        self._calls[call.id] = call
        self._waiting[member.cid] = self._waiting.get(member.cid, 0) + 1
        self._deadlines.append((call.deadline, call.id))
        if not self._sweeping:
            self._sweeping = True
            self._spawn(self._sweep)

    def _reply(self, conn: Conn, req: wire.Request) -> None:
        args = SCHEMAS[DELEGATE_REPLY].check(req.args)
        call = self._calls.get(args["call"])
        relayed = False
        if call is not None:
            if call.member_cid != conn.cid:
                raise RemoteError(ErrorCode.DENIED, f"{DELEGATE_REPLY}: call {call.id} was not sent "
                                                    "to this connection")
            self._calls.pop(call.id)
            self._forget(call)
            relayed = self._relay(call, args)
        conn.outbox.reply(wire.encode(wire.reply_ok(req.id, {"relayed": relayed})), None)

    def _relay(self, call: _Call, args: dict[str, Any]) -> bool:
        target = self._conns.get(call.caller_cid)
        if target is None:
            return False
        if ("result" in args) == ("error" in args):
            self._fail(call, f"{call.op}: the member serving it answered without exactly one of "
                             "result and error", ErrorCode.INTERNAL)
            return True
        if "error" in args:
            err = args["error"]
            code = err.get("code") if isinstance(err.get("code"), str) else ErrorCode.INTERNAL
            if code not in ErrorCode.__members__:
                code = ErrorCode.INTERNAL
            message = str(err.get("message", ""))[:2000]
            data = wire.encode(wire.reply_error(call.request_id, code, message))
        else:
            data = wire.encode(wire.reply_ok(call.request_id, args["result"]))
            if len(data) - 4 > self._max_frame():
                data = wire.encode(wire.reply_error(
                    call.request_id, ErrorCode.INVALID,
                    f"{call.op}: the answer exceeds the maximum frame; narrow the query (limit)"))
        target.outbox.reply(data, None)
        return True

    def _fail(self, call: _Call, message: str, code: str = ErrorCode.UNAVAILABLE) -> None:
        target = self._conns.get(call.caller_cid)
        if target is not None:
            target.outbox.reply(wire.encode(wire.reply_error(call.request_id, code, message)), None)

    def _forget(self, call: _Call) -> None:
        left = self._waiting.get(call.member_cid, 1) - 1
        if left > 0:
            self._waiting[call.member_cid] = left
        else:
            self._waiting.pop(call.member_cid, None)

    async def _sweep(self) -> None:
        """Time calls out, oldest first, while any waits (one task, O(expired) per pass)."""
        try:
            while self._deadlines:
                deadline, cid = self._deadlines[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    await anyio.sleep(min(delay, 0.5))
                    continue
                self._deadlines.popleft()
                call = self._calls.pop(cid, None)
                if call is not None:
                    self._forget(call)
                    logger.warning("controller {}: {} not answered within {:g} s by its member; "
                                   "the caller gets UNAVAILABLE", self._address(), call.op, self.timeout)
                    self._fail(call, f"{call.op}: the member serving it did not answer within "
                                     f"{self.timeout:g} s; try again")
        finally:
            self._sweeping = False
