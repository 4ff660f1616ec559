"""The sync's resume token: what the client remembers of each sync, and the ``since`` it sends.

Pure tests of :class:`xcecore.client.sync.SyncToken`, then the client against the in-memory
fake controller: a re-join within the retention window is sent only the deltas, one outside
it (or to another store) a snapshot, and a replica fed by the pushes ends equal to the store.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from clientkit import SpyHooks, make_config, mem_client
from fakectl import FakeController, SharedStore

from xcecore.client.sync import SyncToken
from xcecore.replica import Replica
from xcecore.role import ALL_PUSHES, Subscription

pytestmark = [pytest.mark.timeout(30)]


def _snapshot(tok: SyncToken, store: str, rev: int, *, end: bool = True) -> None:
    tok.observe("sync_begin", {"mode": "snapshot", "store": store, "rev": rev, "since": None})
    tok.observe("sync_records", {"kind": "jobs", "items": [{"jobid": 1, "rev": rev + 5}]})
    if end:
        tok.observe("sync_end", {"rev": rev})


def test_token_is_empty_until_a_sync_completes() -> None:
    tok = SyncToken()
    assert tok.since() is None
    tok.observe("job", {"jobid": 1, "rev": 9})  # no sync yet: nothing to resume from
    assert tok.since() is None
    _snapshot(tok, "s1", 10, end=False)
    assert tok.since() is None  # the snapshot has not ended
    tok.observe("sync_end", {"rev": 10})
    assert tok.since() == {"store": "s1", "rev": 10} and tok.syncs == 1


def test_pushes_after_the_sync_raise_the_token_and_those_during_it_do_not() -> None:
    tok = SyncToken()
    tok.observe("sync_begin", {"mode": "snapshot", "store": "s1", "rev": 10})
    tok.observe("job", {"jobid": 1, "rev": 12})  # interleaved with the sync: not counted
    tok.observe("sync_end", {"rev": 10})
    assert tok.since() == {"store": "s1", "rev": 10}
    for event, data in [("job", {"rev": 11}), ("host", {"rev": 13}), ("queue", {"rev": 12}),
                        ("cluster", {"rev": 14}), ("job_removed", {"jobids": [1], "rev": 15})]:
        tok.observe(event, data)
    assert tok.since() == {"store": "s1", "rev": 15}
    # Volatile and event-only pushes carry no revision; malformed revisions are ignored.
    for event, data in [("resvals", {"host": "h", "rev": 99}), ("signal", {"rev": 98}),
                        ("job", {"rev": "20"}), ("job", {"rev": True}), ("job", {"rev": -1}),
                        ("job", [1, 2]), ("job", None)]:
        tok.observe(event, data)
    assert tok.since() == {"store": "s1", "rev": 15}


def test_an_interrupted_snapshot_voids_the_token_and_an_interrupted_delta_keeps_it() -> None:
    tok = SyncToken()
    _snapshot(tok, "s1", 10)
    tok.observe("job", {"rev": 11})
    # A delta that is cut short: what was held is still there, the old token still holds.
    tok.observe("sync_begin", {"mode": "delta", "store": "s1", "rev": 20, "since": 11})
    assert tok.since() == {"store": "s1", "rev": 11}
    tok.observe("sync_end", {"rev": 20})
    assert tok.since() == {"store": "s1", "rev": 20}
    # A snapshot forgets the view: until it ends, a re-join must ask for a snapshot again.
    tok.observe("sync_begin", {"mode": "snapshot", "store": "s1", "rev": 30})
    assert tok.since() is None
    tok.observe("job", {"rev": 31})
    assert tok.since() is None


def test_another_store_or_a_forgotten_token_asks_for_a_snapshot() -> None:
    tok = SyncToken()
    _snapshot(tok, "s1", 10)
    tok.observe("sync_begin", {"mode": "delta", "store": "s2", "rev": 3})  # not resumable
    assert tok.since() is None
    tok.observe("sync_end", {"rev": 3})
    assert tok.since() == {"store": "s2", "rev": 3}
    tok.forget()
    assert tok.since() is None
    tok.observe("sync_end", {"rev": 4})  # no sync in progress: ignored
    assert tok.since() is None
    tok.observe("sync_begin", "nope")  # malformed frames change nothing
    tok.observe("sync_begin", {"mode": "snapshot", "store": 5, "rev": 1})
    tok.observe("sync_end", {"rev": 1})
    assert tok.since() is None  # a store id that is not a string is not resumable


# ---------------------------------------------------------------------------------- with a fake


def _jobs(n: int, start: int = 1, state: str = "PEND") -> list[dict[str, Any]]:
    return [{"jobid": i, "state": state, "queue": "normal", "user": "u"}
            for i in range(start, start + n)]


async def _fill(ctl: FakeController, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        await ctl.change("jobs", job)


class _ReplicaHooks(SpyHooks):
    def __init__(self, sub: Subscription = ALL_PUSHES, host: str | None = None) -> None:
        super().__init__()
        self.replica = Replica(sub, host=host, name="test")

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> None:
        super().push(client, role, event, seq, data)
        self.replica.apply(event, data)


async def _wait(pred: Any, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not pred():
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_rejoin_within_the_window_gets_only_deltas_and_outside_it_a_snapshot(net) -> None:
    store = SharedStore()
    store.sync.chunk, store.sync.log = 100, type(store.sync.log)(maxlen=500)
    async with FakeController("a", net=net, store=store) as a:
        await _fill(a, _jobs(250))
        hooks = _ReplicaHooks()
        async with mem_client(net, make_config(a.address), role="scheduler", hooks=hooks,
                              subscribe=ALL_PUSHES.to_wire(), rejoin_points=["hello"]) as c:
            await c.connect()
            reply = await c.join()
            assert reply["sync"] == {"mode": "snapshot", "store": store.sync.store, "rev": 250}
            await _wait(lambda: hooks.replica.complete)
            assert hooks.replica.count("jobs") == 250
            frames = [p[1] for p in hooks.pushes]
            assert frames == ["sync_begin", *["sync_records"] * 3, "sync_end"]
            await a.change("jobs", {"jobid": 7, "state": "RUN", "queue": "normal", "user": "u"})
            await _wait(lambda: c.sync.since() == {"store": store.sync.store, "rev": 251})
            await a.kill()
            # Meanwhile: two jobs changed, one removed, one added.
            a.sync.put("jobs", {"jobid": 8, "state": "RUN", "queue": "normal", "user": "u"})
            a.sync.put("jobs", {"jobid": 9, "state": "DONE", "queue": "normal", "user": "u"})
            a.sync.remove("jobs", [10])
            a.sync.put("jobs", {"jobid": 251, "state": "PEND", "queue": "normal", "user": "u"})
            await a.start()
            before = len(hooks.pushes)
            await c.call("hello")  # reconnects; the rejoin point re-joins
            await _wait(lambda: hooks.replica.syncs == 2)
            join = a.joins[-1].args
            assert join["since"] == {"store": store.sync.store, "rev": 251}
            sync = [p for p in hooks.pushes[before:]]
            assert [p[1] for p in sync] == ["sync_begin", "sync_records", "sync_removed", "sync_end"]
            assert sync[0][3]["mode"] == "delta" and sync[0][3]["since"] == 251
            assert sorted(j["jobid"] for j in sync[1][3]["items"]) == [8, 9, 251]
            assert sync[2][3] == {"kind": "jobs", "keys": [10]}
            held = hooks.replica.records("jobs")
            assert held == store.sync.records["jobs"] and len(held) == 250
            # Out of the window (the log kept 500 changes): a snapshot again.
            await a.kill()
            for job in _jobs(600, start=1000):
                a.sync.put("jobs", job)
            await a.start()
            await c.call("hello")
            await _wait(lambda: hooks.replica.syncs == 3)
            assert hooks.replica.mode == "snapshot" and a.sync.joins[-1]["mode"] == "snapshot"
            assert hooks.replica.records("jobs") == store.sync.records["jobs"]


@pytest.mark.anyio
async def test_changes_interleaved_with_a_snapshot_end_in_the_newest_records(net) -> None:
    store = SharedStore()
    store.sync.chunk = 10
    async with FakeController("a", net=net, store=store) as a:
        await _fill(a, _jobs(50))

        async def meanwhile(index: int) -> None:
            if index == 0:  # after the first frame: change jobs not yet sent, and one sent
                await a.change("jobs", {"jobid": 45, "state": "RUN", "queue": "q2", "user": "u"})
                await a.change("jobs", {"jobid": 3, "state": "RUN", "queue": "q3", "user": "u"})
                await a.remove("jobs", [40])
            if index == 2:
                await a.change("jobs", {"jobid": 51, "state": "PEND", "queue": "normal", "user": "u"})

        a.between_frames = meanwhile
        hooks = _ReplicaHooks(Subscription.of(jobs="unfinished"))
        async with mem_client(net, make_config(a.address), role="scheduler", hooks=hooks,
                              subscribe={"jobs": "unfinished"}) as c:
            await c.join()
            await _wait(lambda: hooks.replica.complete)
            held = hooks.replica.records("jobs")
            assert held == store.sync.records["jobs"]
            assert held[45]["queue"] == "q2" and 40 not in held and 51 in held
            # The snapshot's frames were built before the changes: their older copies of 40
            # and 45 lost to the newer pushes (newest revision wins; a removal is kept).
            assert c.sync.since() == {"store": store.sync.store, "rev": 50}
