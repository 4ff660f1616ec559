"""The election and the store on a real one-member etcd (loopback): fencing, deadlines, limits."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
from xce_controller.jobs import Job
from xce_controller.store import Write
from xce_etcd.client import EtcdClient, delete_op
from xce_etcd.election import EtcdElection
from xce_etcd.settings import EtcdSettings
from xce_etcd.store import EtcdStore
from xce_etcd.testing import EtcdCluster

from xcecore.testing.cluster import wait_for

pytestmark = pytest.mark.timeout(60)


@contextmanager
def candidate(etcd: EtcdCluster, name: str, first: int = 0, **kw: object) -> Iterator[EtcdElection]:
    """A candidate whose client uses member ``first`` first (then the others in order)."""
    urls = etcd.endpoints[first:] + etcd.endpoints[:first]
    settings = EtcdSettings(tuple(urls), prefix="/t", **kw)  # type: ignore[arg-type]
    client = EtcdClient(list(settings.endpoints), timeout=settings.request_timeout,
                        transport=settings.transport)
    e = EtcdElection(client, settings, name)
    try:
        yield e
    finally:
        e.release()
        client.close()


@contextmanager
def beating(e: EtcdElection) -> Iterator[None]:
    """The controller's event loop, as far as the keeper sees it: heartbeats every 50 ms."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            e.heartbeat()
            stop.wait(0.05)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def win(e: EtcdElection) -> None:
    wait_for(e.try_acquire, 10, what=f"{e.advertise} to win")


def commit(store: EtcdStore, writes: list[Write]) -> list[list[Write]]:
    """Run the writer over ``writes`` until it reports them all (or returns); the batches."""
    done: list[list[Write]] = []
    for w in writes:
        store.submit(w)
    store.stop()
    t = threading.Thread(target=store.run_writer, args=(done.append,))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return done


def row(i: int, size: int = 10) -> tuple[str, int, bytes, bytes]:
    """A job's row as the controller writes it: its mutable fields and its submission."""
    j = Job(orjson.dumps({"command": "true", "pad": "x" * size}), i, "u", "normal", "", 1,
            "PEND", 1.0)
    return ("jobs", i, j.row(), j._spec)


def job(i: int, size: int = 10) -> Write:
    return Write([row(i, size)], rid=f"r{i}", result=orjson.dumps({"jobid": i}), rev=i)


def load(store: EtcdStore) -> tuple[list[int], set[str]]:
    """What a new primary loads: the job ids (through head and load_jobs) and the keys."""
    head = store.head()
    jobs = sorted(store.load_jobs(head.max_jobid, 60.0).jobs)
    keys: set[str] = set()
    store.load_idem(time.time() - 3600, lambda rid, ts: keys.add(rid))
    return jobs, keys


def test_a_deposed_primary_cannot_commit_and_stops_acknowledging(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        wait_for(lambda: b.live(), 10, what="b's lease")
        assert not b.try_acquire() and b.current_primary() == "a"
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        assert [len(x) for x in commit(store, [job(1), job(2)])] == [2]
        # a pauses (its keeper no longer runs): its lease is revoked from outside, as expiry would
        a._stop.set()
        a.client.lease_revoke(a.lease)
        win(b)
        zombie = EtcdStore(a.client, a.settings, a)
        assert commit(zombie, [job(3)]) == []  # not reported: never acknowledged
        # its guard failed (or its keeper saw the lease gone first): it may not acknowledge
        assert a.still_primary() is not None
        fresh = EtcdStore(b.client, b.settings, b)
        fresh.open()
        assert load(fresh) == ([1, 2], {"r1", "r2"})
        assert fresh.head().rev == 2  # the highest committed rev (job 3's never committed)


def test_the_deadline_passes_when_etcd_stops_answering(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a:
        win(a)
        assert a.still_primary() is None
        member = etcd_one.members[0]
        stopped = time.monotonic()
        os.kill(member.pid, signal.SIGSTOP)
        try:
            # heartbeats keep coming (the loop runs); only the keep-alives fail
            def refused() -> str | None:
                a.heartbeat()
                return a.still_primary()

            why = wait_for(refused, 10, interval=0.01, what="the deadline")
            assert time.monotonic() - stopped <= a.granted_ttl  # within the TTL
            assert "cannot prove its etcd lease live" in why
        finally:
            os.kill(member.pid, signal.SIGCONT)


def test_a_stuck_event_loop_lets_the_lease_expire(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        # no a.heartbeat(): as if its event loop were stuck; b takes over after the TTL
        win(b)
        assert a.still_primary() is not None


@pytest.mark.parametrize("transport", ["grpc", "gateway"])
def test_batches_split_within_the_txn_limits_and_a_too_large_write_is_refused(
        etcd_one: EtcdCluster, transport: str) -> None:
    with candidate(etcd_one, "a", max_txn_ops=16, transport=transport) as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        assert (a.client.grpc is not None) == (transport == "grpc")
        writes = [Write([row(100 * i + k) for k in range(4)], rid=f"w{i}", rev=i + 1)
                  for i in range(10)]
        batches = commit(store, writes)
        assert [w for b in batches for w in b] == writes and len(batches) >= 4
        for b in batches:  # each transaction: whole writes within the limit (a job is one
            # key; the group of idempotency keys, the chain key and meta/rev are three more)
            assert sum(len(w.rows) for w in b) <= 13 and len(b) <= 3
        big = Write([row(5000 + k) for k in range(20)], rid="big", rev=11)
        after = Write([row(9999)], rid="after", rev=12)
        (failed,) = commit(store, [big, after])
        assert failed == [big, after] and big.error is not None and "transaction limits" in big.error.cause
        jobs, keys = load(store)
        assert len(jobs) == 40 and 5000 not in jobs and 9999 not in jobs and "big" not in keys
        assert store.head().rev == 10
        if a.client.grpc is not None:  # the commits went over gRPC
            assert a.client.grpc.requests >= len(batches) + 1


def test_the_next_round_commits_while_the_last_one_is_reported(etcd_one: EtcdCluster) -> None:
    """Nothing queued behind a round: the writer's own thread commits it (no hand-off).
    Writes queued behind a committed round: a helper commits them while the writer's thread
    is still reporting the last round (on_done waits for the controller's loop)."""
    with candidate(etcd_one, "a") as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        committed_on: list[str] = []
        plain = store._commit_chunk

        def chunk(ops: list, rev: int = 0):  # type: ignore[no-untyped-def]
            if rev == 1:  # queued while round 1 is in flight
                store.submit(job(2))
                store.submit(job(3))
            committed_on.append(threading.current_thread().name)
            return plain(ops, rev)

        store._commit_chunk = chunk  # type: ignore[method-assign]
        reported: list[list[Write]] = []

        def on_done(batch: list[Write]) -> None:
            if not reported:  # round 2 commits while this report is pending
                wait_for(lambda: store.commits >= 2, 10, what="the next round's commit")
            reported.append(batch)
            if len(reported) == 2:
                store.stop()

        store.submit(job(1))
        t = threading.Thread(target=store.run_writer, args=(on_done,), name="writer")
        t.start()
        t.join(30)
        assert not t.is_alive()
        assert [[w.rid for w in b] for b in reported] == [["r1"], ["r2", "r3"]]
        assert committed_on == ["writer", "xce-etcd-commit"]
        assert all(w.error is None for b in reported for w in b)
        assert load(store) == ([1, 2, 3], {"r1", "r2", "r3"})


def test_a_full_etcd_gives_a_storage_fault(etcd_factory) -> None:
    etcd = etcd_factory(["127.0.0.1"], extra=("--quota-backend-bytes=4194304",), client_port=23990,
                        peer_port=23991)
    etcd.start()
    # a 2 s lease: big writes on a loaded 2-core machine can hold a 1 s one's keep-alives back
    with candidate(etcd, "a", lease_ttl=2.0, request_timeout=2.0) as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        faults = []
        for i in range(40):  # 40 x 512 KiB > the 4 MiB quota
            (done,) = commit(store, [job(i, 512 * 1024)])
            store.resume()
            if done[0].error is not None:
                faults.append(done[0].error)
                break
        assert faults and faults[0].code == "NOSPACE" and "etcd is full" in faults[0].cause

        def primary() -> bool:  # full is not deposed: its keep-alives go on (reads are served)
            a.heartbeat()
            return a.still_primary() is None

        wait_for(primary, 10, what="the lease renewed on a full etcd")
        assert a._lost is None


def test_an_idle_primary_whose_leader_key_is_deleted_stops(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a:
        win(a)
        a.client.txn([], [delete_op(b"/t/leader")])

        def stopped() -> str | None:
            a.heartbeat()
            return a.still_primary()

        assert "no longer the one it wrote" in wait_for(stopped, 10, what="the primary to notice")


def three_members(etcd_factory, port: int) -> tuple[EtcdCluster, int, int]:
    """A started three-member etcd on loopback, its raft leader's index and a follower's."""
    etcd = etcd_factory(["127.0.0.1"] * 3, client_port=port, peer_port=port + 1)
    etcd.start()
    found = wait_for(lambda: [i for i in [etcd.leader()] if i is not None], 30,
                     what="an etcd leader")  # (a list: member 0 leading is falsy as an int)
    return etcd, found[0], (found[0] + 1) % 3


def test_a_follower_member_that_stops_answering_costs_a_retry_not_the_role(etcd_factory) -> None:
    etcd, _leader, follower = three_members(etcd_factory, 24100)
    with candidate(etcd, "a", first=follower, request_timeout=0.3) as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        assert [len(b) for b in commit(store, [job(1)])] == [1]
        stopped = etcd.members[follower]  # the endpoint the client uses, not raft's leader
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            with beating(a):
                done = commit(store, [job(2), job(3)])
                assert [w.rev for b in done for w in b] == [2, 3]
                assert all(w.error is None for b in done for w in b)
                assert a.still_primary() is None and store.resolved >= 1
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        assert load(store)[0] == [1, 2, 3]


def test_the_raft_leader_stopping_never_acknowledges_an_uncommitted_write(etcd_factory) -> None:
    """Losing raft's leader stalls every write for an etcd election (0.6-1.2 s here, the
    order of the 1 s lease): the primary either keeps its role (its writes settled through
    another member) or gives it up at its deadline, never acknowledging what did not commit;
    a candidate on the two members left then wins and loads every acknowledged write."""
    etcd, leader, follower = three_members(etcd_factory, 24110)
    with candidate(etcd, "a", first=leader, request_timeout=0.3) as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        commit(store, [job(1)])
        os.kill(etcd.members[leader].pid, signal.SIGSTOP)
        try:
            with beating(a):
                done = [w for b in commit(store, [job(2), job(3)]) for w in b]
            assert all(w.error is None for w in done)  # what is reported committed
            assert [w.rev for w in done] in ([], [2, 3])
            if not done:  # nothing reported: it gave the role up (its writes' outcome unknown)
                assert a.still_primary() is not None
            with candidate(etcd, "b", first=follower) as b:
                if a.still_primary() is not None:
                    win(b)  # once a's lease expires at etcd
                jobs = load(EtcdStore(b.client, b.settings, b))[0]
        finally:
            os.kill(etcd.members[leader].pid, signal.SIGCONT)
        assert {1} | {w.rev for w in done} <= set(jobs)


def test_the_store_protocol_on_etcd_head_jobs_images_and_expiry(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        host = orjson.dumps({"name": "h1", "ncpus": 4})
        writes = [job(7), job(12), Write([("hosts", "h1", host, None)], rev=13),
                  Write([("meta", "next_jobid", b"20", None)], rev=14)]
        commit(store, writes)
        head = store.head()
        assert (head.rev, head.max_jobid, head.next_jobid) == (14, 12, 20)
        assert head.hosts == {"h1": {"name": "h1", "ncpus": 4}} and head.store_id == store.store_id
        assert store.load_window(100, head.floor) == ([], 14)  # no window: members get snapshots
        spec7 = row(7)[3]
        images = store.committed([("jobs", 7), ("jobs", 99), ("hosts", "h1")])
        assert images == {("jobs", 7): (row(7)[2], spec7), ("jobs", 99): None,
                          ("hosts", "h1"): (host, None)}
        table = store.load_jobs(head.max_jobid, 60.0)
        assert sorted(table.jobs) == [7, 12] and table.jobs[7].spec() == orjson.loads(spec7)
        assert sorted(store.load_jobs(7, 60.0).jobs) == [7]  # only ids <= upto
        # a removal deletes the job's key (its record and its submission)
        commit(store, [Write([("jobs", 7, None, None)], rid="rm7", rev=15)])
        assert a.client.range(store.key("jobs", 7), store.key("jobs", 8))[0] == []
        assert sorted(store.load_jobs(store.head().max_jobid, 60.0).jobs) == [12]
        # the keyed writes' results, by the second each write was filed under, and without
        at = writes[0].committed_at
        assert at == int(at) and abs(at - time.time()) < 30
        result7 = orjson.dumps({"jobid": 7})
        assert store.lookup("r7", at) == result7 and store.lookup("r7") == result7
        assert store.lookup("never", at) is None and store.lookup("never") is None
        # housekeeping drops the groups of the seconds before its time, and only those
        commit(store, [Write([], expire_before=at)])  # (their second is not before it)
        fresh = EtcdStore(a.client, a.settings, a)  # (no lookup cache)
        assert fresh.lookup("r7", at) == result7 and fresh.lookup("r12", at) is not None
        commit(store, [Write([], expire_before=time.time() + 1)])
        fresh = EtcdStore(a.client, a.settings, a)
        assert fresh.lookup("r7", at) is None and fresh.lookup("r7") is None
        assert a.client.range(store.idem_prefix, store.idem_prefix + b"\xff")[0] == []
        assert load(store) == ([12], set())


def test_a_transactions_idempotency_keys_are_one_etcd_key(etcd_one: EtcdCluster) -> None:
    """One put per transaction for all its keys (not one per key), each key found by the
    second the store filed it under; what a cold load and a standby's snapshot read back."""
    with candidate(etcd_one, "a") as a:
        win(a)
        store = EtcdStore(a.client, a.settings, a)
        store.open()
        writes = [job(i) for i in range(1, 41)]
        done = commit(store, writes)
        assert sum(len(b) for b in done) == 40
        groups, _ = a.client.range(store.idem_prefix, store.idem_prefix + b"\xff")
        assert len(groups) == store.commits  # one group per transaction
        for w in writes:
            assert store.lookup(w.rid or "", w.committed_at) == w.result
        # a lookup for a second that holds no group (or a key in none) finds nothing
        assert store.lookup("r1", writes[0].committed_at + 10) is None
        assert store.lookup("r41", writes[0].committed_at) is None
        assert load(store)[1] == {f"r{i}" for i in range(1, 41)}
        # housekeeping in the same transaction as keyed writes: its range delete ends below
        # their group (etcd refuses a put inside a delete range of the same transaction)
        more = [job(50), Write([], expire_before=time.time() - 5), job(51)]
        (batch,) = commit(store, more)
        assert all(w.error is None for w in batch) and store.lookup("r51", more[2].committed_at)
        keys: list[tuple[str, float]] = []
        got = EtcdStore(a.client, a.settings, a).snapshot(100, 60.0, time.time() - 60,
                                                         lambda rid, ts: keys.append((rid, ts)))
        assert got is not None and sorted(keys) == sorted(
            (w.rid, w.committed_at) for w in [*writes, more[0], more[2]])


def update(i: int, state: str, rev: int) -> Write:
    """Job ``i``'s record changed (its state), as a later write stores it."""
    j = Job(orjson.dumps({"command": "true", "pad": "x" * 10}), i, "u", "normal", "", 1, state, 1.0)
    return Write([("jobs", i, j.row(), j._spec)], rev=rev)


def test_a_standby_follows_with_a_watch_and_catches_up_to_its_campaign(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        primary = EtcdStore(a.client, a.settings, a)
        primary.open()
        commit(primary, [job(1), job(2), job(3)])
        standby = EtcdStore(b.client, b.settings, b)
        keys: set[str] = set()
        got = standby.snapshot(100, 60.0, time.time() - 3600, lambda rid, ts: keys.add(rid))
        assert got is not None
        head, table = got
        assert (head.rev, sorted(table.jobs), keys) == (3, [1, 2, 3], {"r1", "r2", "r3"})
        assert head.store_id == primary.store_id and head.floor == 3
        host = orjson.dumps({"name": "h1", "ncpus": 4})
        commit(primary, [job(4), update(2, "RUN", 5), Write([("jobs", 1, None, None)], rev=6),
                         Write([("hosts", "h1", host, None)], rid="hx", rev=7)])
        wait_for(lambda: standby.wait_changed(0.5), 10, what="the watch's events")
        delta = standby.changes_since(3)
        # (the watch may have delivered only part so far: take the rest too)
        parts = [delta]
        while parts[-1] is not None and parts[-1].rev < 7:
            assert standby.wait_changed(10)
            parts.append(standby.changes_since(parts[-1].rev))
        assert all(p is not None for p in parts)
        jobs = {j.jobid: j.state for p in parts if p is not None for j in p.jobs}
        assert jobs == {4: "PEND", 2: "RUN"}
        removed = [r for p in parts if p is not None for r in p.removed]
        assert removed == [("jobs", 1, 7)]  # a removal's rev: its transaction's highest
        assert {h for p in parts if p is not None for h in p.hosts} == {"h1"}
        assert {k for p in parts if p is not None for k, _ in p.idem} == {"r4", "hx"}
        assert parts[-1] is not None and parts[-1].rev == 7
        # a commits job 5 and goes (revoked, as a graceful stop does); b wins and catches up
        # to its own campaign's revision: job 5 is in, whatever the watch had delivered
        commit(primary, [Write([row(5)], rid="r5", result=b"{}", rev=8)])
        a.release()
        win(b)
        last = standby.changes_since(7)
        assert last is not None and [j.jobid for j in last.jobs] == [5] and last.rev == 8
        standby.close()


def test_a_standby_with_a_live_watch_campaigns_when_the_leader_key_goes(
        etcd_one: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its watch open, a waiting standby polls rarely; the leader key's deletion, seen
    by the watch, makes it campaign at once (here the poll is 60 s: only the watch can)."""
    import xce_etcd.election as election

    monkeypatch.setattr(election, "POLL_WATCHED", 60.0)
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        primary = EtcdStore(a.client, a.settings, a)
        primary.open()
        commit(primary, [job(1)])
        standby = EtcdStore(b.client, b.settings, b)
        assert standby.snapshot(100, 60.0, 0.0, lambda rid, ts: None) is not None
        assert not b.watched()  # no watch yet: the short poll
        commit(primary, [job(2)])
        wait_for(lambda: standby.wait_changed(0.5), 10, what="the watch's events")
        assert b.watched()
        lost: list[bool] = []
        plain = b._campaign

        def campaign() -> bool:
            got = plain()
            lost.append(not got)
            return got

        b._campaign = campaign  # type: ignore[method-assign]
        won: list[bool] = []
        t = threading.Thread(target=lambda: won.append(b.wait()), daemon=True)
        t.start()
        wait_for(lambda: lost == [True], 10, what="b's first campaign, lost")  # now it sleeps
        a.release()  # the lease revoked: etcd deletes the leader key, the watch sees it
        t.join(20)
        assert won == [True] and lost == [True, False] and b.still_primary() is None
        standby.close()
        assert not b.watched()


def test_a_standby_tells_clients_it_takes_over_from_a_silent_primary(etcd_one: EtcdCluster) -> None:
    """An idle primary beats (the beat key) while its loop runs; a standby whose watch sees
    neither a commit nor a beat for a while says when it expects to take over (what a
    client then waits for instead of dialing the silent primary), 0 once the leader key
    is gone, and a fresh sign of life makes it name the primary again."""
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        primary = EtcdStore(a.client, a.settings, a)
        primary.open()
        standby = EtcdStore(b.client, b.settings, b)
        with beating(a):
            commit(primary, [job(1)])
            assert standby.snapshot(100, 60.0, 0.0, lambda rid, ts: None) is not None
            commit(primary, [job(2)])
            wait_for(lambda: standby.wait_changed(0.5), 10, what="the watch's events")
            assert b.watched() and b.current_primary() == "a"
            assert b.takeover_in("a") is None  # it just saw a commit
            assert b.takeover_in("somebody-else") is None
            # idle: no commit, but the beats show the standby that a still renews
            idle_from = time.monotonic()
            wait_for(lambda: b._activity > idle_from + 0.3, 10, what="a beat while idle")
        # a's loop stops (as if stopped or frozen): no beat, no renewal; b says so
        eta = wait_for(lambda: b.takeover_in("a"), 10, interval=0.01, what="b's takeover estimate")
        assert 0.05 <= eta <= 2.0
        # etcd expires a's lease: the leader key goes, the watch sees it: under way (0)
        wait_for(lambda: b.takeover_in(b.current_primary()) == 0.0 and b.current_primary() is None,
                 10, interval=0.01, what="the leader key's deletion, seen by b's watch")
        win(b)
        assert b.takeover_in(None) == 0.0  # promoting (the controller asks standbys only)
        standby.close()


def test_a_standby_behind_the_compaction_reloads(etcd_one: EtcdCluster) -> None:
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        primary = EtcdStore(a.client, a.settings, a)
        primary.open()
        commit(primary, [job(1)])
        standby = EtcdStore(b.client, b.settings, b)
        assert standby.snapshot(100, 60.0, 0.0, lambda rid, ts: None) is not None
        commit(primary, [job(2)])
        commit(primary, [job(3)])
        _, now = a.client.range(b"/t/")
        a.client.post("/v3/kv/compaction", {"revision": str(now)})  # as etcd's auto-compaction
        assert standby.wait_changed(10)  # the watch opens behind the compaction: it says so
        assert standby.changes_since(1) is None  # the follower loads a snapshot again
        again = standby.snapshot(100, 60.0, 0.0, lambda rid, ts: None)
        assert again is not None and sorted(again[1].jobs) == [1, 2, 3]
        standby.close()


def test_a_primary_giving_up_during_an_etcd_election_revokes_its_lease_after_it(etcd_factory) -> None:
    """A primary that gives the role up while etcd elects a leader (its raft leader stopped:
    no answer for 0.6 s or more; it may have lost its deadline, or be stopping): once a new
    etcd leader is elected, etcd renews every lease by a TTL and more, so its release keeps
    revoking until etcd answers: the leader key is gone when release returns, and a standby
    can win at once instead of a TTL and an election timeout later."""
    etcd, leader, follower = three_members(etcd_factory, 24120)
    with candidate(etcd, "a", first=leader, request_timeout=0.3) as a:
        win(a)
        lease = a.lease
        os.kill(etcd.members[leader].pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            a.release()  # at once: etcd has no leader for an election timeout at least
            took = time.monotonic() - t0
            watcher = EtcdClient([etcd.endpoints[follower]], timeout=2)
            try:
                assert watcher.get(b"/t/leader") is None, "the leader key outlived the release"
                assert watcher.lease_keepalive(lease) == 0  # the lease is gone, not expiring
            finally:
                watcher.close()
            assert took < 3 * a.settings.grant_ttl + 1
        finally:
            os.kill(etcd.members[leader].pid, signal.SIGCONT)


def test_revocations_are_a_table_of_the_etcd_store_too(etcd_one: EtcdCluster) -> None:
    """The token revocations (xce_controller.revocations) load with the head and follow."""
    with candidate(etcd_one, "a") as a, candidate(etcd_one, "b") as b:
        win(a)
        primary = EtcdStore(a.client, a.settings, a)
        primary.open()
        rec = {"key": "t:tok-1", "user": "alice", "jti": "tok-1", "expires": 2e9, "rev": 1}
        commit(primary, [Write([("revocations", "t:tok-1", orjson.dumps(rec), None)], rev=1)])
        assert primary.head().revocations == {"t:tok-1": rec}
        standby = EtcdStore(b.client, b.settings, b)
        got = standby.snapshot(100, 60.0, time.time() - 3600, lambda rid, ts: None)
        assert got is not None and got[0].revocations == {"t:tok-1": rec}
        other = {**rec, "key": "u:bob", "user": "bob", "before": 1.0, "rev": 2}
        commit(primary, [Write([("revocations", "u:bob", orjson.dumps(other), None),
                                ("revocations", "t:tok-1", None, None)], rev=2)])
        wait_for(lambda: standby.wait_changed(0.5), 10, what="the watch's events")
        delta = standby.changes_since(1)
        while delta is not None and delta.rev < 2:
            assert standby.wait_changed(10)
            delta = standby.changes_since(1)
        assert delta is not None and delta.revocations == {"u:bob": other}
        assert delta.removed == [("revocations", "t:tok-1", 2)]
        standby.close()


class StallingProxy:
    """A TCP forwarder on loopback to one etcd member: :meth:`stall` makes the connections
    open now stop forwarding what the member sends (they stay open, silent, as a stream
    that stopped delivering); connections made after it forward as usual."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self._stalled: list[threading.Event] = []
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(self.target)
            stalled = threading.Event()
            self._stalled.append(stalled)
            self._socks += [down, up]
            threading.Thread(target=self._pipe, args=(down, up, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down, stalled), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, stalled: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                while stalled is not None and stalled.is_set():
                    time.sleep(0.01)  # holds what it read: the client sees nothing more
                dst.sendall(data)
        except OSError:
            pass

    def stall(self) -> None:
        for e in self._stalled:
            e.set()

    def close(self) -> None:
        self.server.close()
        for s in self._socks:
            s.close()


def test_a_watch_that_stops_delivering_is_opened_again_from_its_last_revision(
        etcd_one: EtcdCluster) -> None:
    """A standby's watch whose stream goes silent (here: a real TCP connection that stops
    forwarding the member's bytes) is opened again, from the revision after its last event,
    once it has been silent for its idle time: every event arrives, once, in order."""
    from xce_etcd.follow import Watcher

    proxy = StallingProxy(int(etcd_one.endpoints[0].rsplit(":", 1)[1]))
    watching = EtcdClient([proxy.url], transport="gateway")
    writer = EtcdClient(etcd_one.endpoints, transport="gateway")
    w: Watcher | None = None
    try:
        start = writer.put(b"/st/first", b"0")
        w = Watcher(watching, b"/st/", start + 1, "t", idle=1.0)
        revs = [writer.put(b"/st/k%d" % i, b"v") for i in range(5)]
        wait_for(lambda: w is not None and w.next > revs[-1], 30, what="the first events")
        assert w.opened == 1
        proxy.stall()
        revs += [writer.put(b"/st/k%d" % i, b"v") for i in range(5, 10)]
        wait_for(lambda: w is not None and w.next > revs[-1], 30,
                 what="the events after the stream stopped")
        events, _, compacted = w.take_all()
        assert [e.key for e in events] == [b"/st/k%d" % i for i in range(10)] and not compacted
        assert [e.revision for e in events] == revs and w.opened == 2
    finally:
        if w is not None:
            w.stop()
        proxy.close()
        watching.close()
        writer.close()
