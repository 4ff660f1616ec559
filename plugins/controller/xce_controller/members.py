"""Members of a primary: the streamed sync a join starts, a sync again after a rollback, and
the ``status`` op's bounded view of them.

The sync runs as a task of the member's connection (:func:`xce_controller.sync.stream`), so it
ends with the connection; a new join on the same connection cancels the sync under way and
starts another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from xce_controller import queries, sync
from xce_controller.pushes import Subscriber

if TYPE_CHECKING:
    from xce_controller.ops import Caller

# The controller and its connections come in as ``Any``: naming ``xce_controller.server``'s
# classes here, even for type checking only, would make an import cycle with it.
Controller = Any
Connection = Any


def subscribe(ctl: Controller, caller: Caller) -> None:
    """Make ``caller`` a member that gets pushes: its streamed sync first (the plan its join
    made), then ordinary pushes as they happen."""
    conn = ctl.conns.get(caller.cid)
    if conn is None:
        return
    ctl.fanout.remove(conn.cid)
    _stop_sync(conn)
    sub = caller.sub
    member = Subscriber(caller.identity, conn.outbox, caller.worker_host, conn.abort, sub)
    ctl.fanout.add(conn.cid, member)  # from now on it gets every push it subscribed to
    if not sub.scopes:
        return  # it asked for nothing (it still gets ``shutdown``)
    p = caller.plan
    assert p is not None, "a join that subscribed to something has a sync plan"
    if ctl.fanout.send(conn.cid, member, "sync_begin", sync.begin(ctl, sub, p), ctl.open_gate()):
        _start_sync(ctl, conn, member, p)


def resync(ctl: Controller, caller: Caller) -> None:
    """A member whose pushes were withdrawn (a rollback) is synced again: a delta since the
    last commit if it had completed its sync and the window covers it, else a snapshot."""
    conn = ctl.conns.get(caller.cid)
    if conn is None or not caller.joined:
        return
    if caller.sub.scopes:
        since = None if conn.sync_scope is not None else {"store": ctl.store_id,
                                                          "rev": ctl.committed_rev}
        caller.plan = sync.plan(ctl, caller.sub, since, ctl.rev)
    subscribe(ctl, caller)


def _start_sync(ctl: Controller, conn: Connection, member: Subscriber, p: sync.Plan) -> None:
    tg = conn.tg
    if tg is None:
        return
    scope = anyio.CancelScope()
    conn.sync_scope = scope
    steps = sync.chunks(ctl, member.sub, p)
    cid = conn.cid

    def send(name: str, data: bytes, gate: Any) -> bool:
        return bool(ctl.fanout.send(cid, member, name, data, gate))

    async def run() -> None:
        with scope:
            await sync.stream(steps, conn.outbox, send, ctl.open_gate, conn.abort,
                              member.identity)
        if conn.sync_scope is scope:
            conn.sync_scope = None

    tg.start_soon(run)


def _stop_sync(conn: Connection) -> None:
    scope, conn.sync_scope = conn.sync_scope, None
    if scope is not None:
        scope.cancel()


def status(ctl: Controller, limit: int, after: str) -> dict[str, Any]:
    """The ``status`` op's result: counts, and a page of members."""
    st = ctl.state
    assert ctl.election is not None
    page, nxt = queries.members_page(st, limit, "n" + after if after else None)
    describe = getattr(ctl.election, "describe", None)  # a backend's own words (etcd: lease)
    return {
        "server": ctl.address, "state": ctl.role, "primary": ctl.address, "since": ctl.since,
        "candidates": ctl.election.candidates(), "jobs": len(st.jobs), "hosts": len(st.hosts),
        "members": len(st.members), "roles": dict(st.roles), "member_list": page,
        "next": nxt, "store": ctl.store_id, "rev": ctl.rev, "loading": ctl.loading is not None,
        "promotion": dict(ctl.promotion),
        "backend": describe() if callable(describe) else {"backend": ctl.settings.backend},
    }
