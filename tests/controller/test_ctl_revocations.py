"""Token revocations in the controller: the pure list (bounds, expiry order), and the ops
against an in-process primary with a real SQLite store -- durable, replicated to members
through the sync (snapshot and delta) and pushes, dropped when their tokens expire."""

from __future__ import annotations

import time

import pytest
from ctl_testlib import RawClient, follow, join_synced, reload, running
from xce_controller.revocations import MAX_LIFETIME, MAX_PER_USER, Revocations

pytestmark = pytest.mark.anyio

API = {"role": "apiserver", "attrs": {}, "subscribe": {"revocations": "all"}}


def err(msg):
    assert not msg["ok"], msg
    return msg["error"]


def test_the_list_is_bounded_per_user_and_expires_in_order() -> None:
    rv = Revocations()
    now = 1000.0
    for i in range(MAX_PER_USER):
        rv.revoke_token(f"jti-{i:06d}", "alice", now + 10 + i % 7, "owner alice", now)
    assert rv.per_user["alice"] == MAX_PER_USER
    from xcecore.wire import RemoteError

    with pytest.raises(RemoteError, match="has 1000 revoked tokens .* revoke-tokens alice"):
        rv.revoke_token("one-more-token", "alice", now + 10, "owner alice", now)
    again = rv.revoke_token("jti-000000", "alice", now + 20, "owner alice", now)  # no new entry
    assert rv.per_user["alice"] == MAX_PER_USER and again is not None and again["expires"] == now + 20
    rv.revoke_token("bobs-token-1", "bob", now + 5, "owner bob", now)  # others unaffected
    with pytest.raises(RemoteError, match="more than 30 days ahead"):
        rv.revoke_token("far-future-1", "bob", now + MAX_LIFETIME + 1, "owner bob", now)
    assert rv.revoke_token("expired-tok", "bob", now - 1, "owner bob", now) is None
    # Expiry: only what is due, in order, and at most a batch at a time.
    assert rv.expire(now + 5) == ["t:bobs-token-1"] and "bob" not in rv.per_user
    gone = rv.expire(now + 13, limit=50)
    assert len(gone) == 50 and all(k not in rv.records for k in gone)
    assert "t:jti-000000" not in gone  # its record was replaced by a later expiry
    gone += rv.expire(now + 16)
    assert all(k not in rv.records for k in gone) and "t:jti-000000" in rv.records
    rv.expire(now + 20)
    assert not rv.records and not rv.per_user
    # A user-wide revocation: one record per user, its cut-off only moves forward.
    rv.revoke_user("alice", now + 100, "administrator root", now)
    rv.revoke_user("alice", now + 50, "administrator root", now + 1)
    rec = rv.records["u:alice"]
    assert len(rv) == 1 and rec["before"] == now + 1 and rec["expires"] == now + 100


async def test_revocations_are_durable_replicated_and_expire(tmp_path):
    async with running(tmp_path) as ctl:
        api = await RawClient.connect(ctl.address, "apiserver@web1")
        _, rep = await join_synced(api, API)
        cli = await RawClient.connect(ctl.address, "apiserver@web2")
        expires = time.time() + 3600
        got = await cli.ok("revoke_token", {"jti": "alice-token-1", "expires": expires, "user": "alice"})
        assert got["revoked"] and got["record"]["user"] == "alice" and got["record"]["rev"] > 0
        assert got["record"]["by"].startswith("owner alice") or "alice" in got["record"]["by"]
        push = await api.push("revocation")
        assert rep.apply(push["push"], push["data"])
        assert rep.get("revocations", "t:alice-token-1")["jti"] == "alice-token-1"
        # Whom it acts for is the record's user: a user may revoke only their own tokens.
        e = err(await cli.call("revoke_tokens", {"target": "alice", "user": "bob"}))
        assert e["code"] == "DENIED" and "only their own tokens, not alice's" in e["message"]
        own = await cli.ok("revoke_tokens", {"target": "bob", "user": "bob"})
        assert own["record"]["key"] == "u:bob"
        every = await cli.ok("revoke_tokens", {"target": "alice", "user": "root"})
        assert every["record"]["by"].startswith("administrator root") or "root" in every["record"]["by"]
        e = err(await cli.call("revoke_token", {"jti": "bad token!", "expires": expires, "user": "a"}))
        assert e["code"] == "INVALID" and "jti" in e["message"]
        # A member re-joining with its position gets a delta with what changed meanwhile.
        since = {"store": ctl.store_id, "rev": push["data"]["rev"]}
        await cli.ok("revoke_token", {"jti": "alice-token-2", "expires": time.time() + 1.0,
                                      "user": "alice"})
        late = await RawClient.connect(ctl.address, "apiserver@web3")
        late.pushes.clear()
        joined = await late.ok("join", {**API, "since": since})
        assert joined["sync"]["mode"] == "delta"
        rep3 = _replica_with(rep)
        await follow(late, rep3)
        assert {"u:alice", "u:bob", "t:alice-token-2", "t:alice-token-1"} <= set(rep3.records("revocations"))
        # A fresh member's snapshot holds them all.
        fresh = await RawClient.connect(ctl.address, "apiserver@web4")
        _, rep4 = await join_synced(fresh, API)
        assert set(rep4.records("revocations")) == {"t:alice-token-1", "t:alice-token-2", "u:alice", "u:bob"}
        # The token of alice-token-2 expires within a second: its record leaves the list,
        # and the members are told.
        gone = await api.push("revocations_removed", timeout=10)
        assert gone["data"]["keys"] == ["t:alice-token-2"] and isinstance(gone["data"]["rev"], int)
        assert "t:alice-token-2" not in ctl.state.revocations.records
        for c in (api, cli, late, fresh):
            await c.aclose()
    # Durable: what a new primary loads.
    st = reload(tmp_path)
    assert set(st.revocations.records) == {"t:alice-token-1", "u:alice", "u:bob"}
    assert st.revocations.per_user == {"alice": 1}


def _replica_with(rep):
    """A new replica holding what ``rep`` holds (the member's copy before it re-joins)."""
    from xcecore.replica import Replica

    out = Replica(rep.subscription, manage_gc=False, name="test copy")
    out.apply("sync_begin", {"mode": "snapshot", "store": rep.store})
    for rec in rep.records("revocations").values():
        out.put("revocations", dict(rec))
    out.apply("sync_end", {"rev": rep.rev})
    return out


def test_a_rollback_and_a_standby_follow_keep_the_counts_right() -> None:
    from xce_controller.settings import ClusterConf
    from xce_controller.state import ClusterState

    st = ClusterState(ClusterConf(queues=({"name": "normal", "priority": 30},)))
    ch = st.revoked(st.revocations.revoke_token("tok-aaaa1", "alice", 4600.0, "owner alice", 1000.0))
    assert ch.rows[0][:2] == ("revocations", "t:tok-aaaa1") and ch.events[0].name == "revocation"
    committed = dict(ch.rows[0][2])
    nothing = st.revoked(st.revocations.revoke_token("tok-old01", "alice", 999.0, "owner alice", 1000.0))
    assert not nothing.rows and nothing.result["revoked"] is False
    st.revocations.revoke_token("tok-aaaa2", "alice", 4600.0, "owner alice", 1000.0)
    assert st.revocations.per_user == {"alice": 2}
    # The second write failed to commit: roll back to the store's images.
    st.restore({("revocations", "t:tok-aaaa2"): None, ("revocations", "t:tok-aaaa1"): committed})
    assert set(st.revocations.records) == {"t:tok-aaaa1"} and st.revocations.per_user == {"alice": 1}
    # A standby applies a delta: one new record, one removal.
    bob = {"key": "t:tok-bbbb1", "user": "bob", "jti": "tok-bbbb1", "expires": 4600.0, "rev": 9}
    st.follow([], {}, {}, [("revocations", "t:tok-aaaa1", 9)], 1, 1000.0, {"t:tok-bbbb1": bob})
    assert set(st.revocations.records) == {"t:tok-bbbb1"} and st.revocations.per_user == {"bob": 1}
    # Its expiry heap still drops it when due.
    gone = st.expire_revocations(4600.0)
    assert gone.result == ["t:tok-bbbb1"] and not st.revocations.per_user
    assert gone.rows == [("revocations", "t:tok-bbbb1", None)]
    assert gone.events[0].name == "revocations_removed" and gone.events[0].data == {"keys": ["t:tok-bbbb1"]}


def test_the_expiry_heap_stays_proportional_to_what_is_held() -> None:
    rv = Revocations()
    rec = {"key": "u:alice", "user": "alice", "before": 1.0, "expires": 5000.0, "rev": 1}
    for i in range(10_000):  # a standby following one record replaced again and again
        rv.restore("u:alice", {**rec, "expires": 5000.0 + i, "rev": i})
    assert len(rv) == 1 and len(rv._heap) <= 2 + 1024 + 1
    assert rv.expire(5000.0 + 9998) == [] and rv.expire(5000.0 + 9999) == ["u:alice"]
