"""Keeping etcd's raft leader off the primary's host (xce_etcd.placement): the pure choices,
and one check against a real three-member etcd on loopback (real MoveLeader)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from xce_etcd.client import EtcdClient, put_op
from xce_etcd.placement import AUTO, NONE, LeaderPlacement, MemberStatus, local_endpoint, move_target
from xce_etcd.settings import EtcdSettings, check_etcd_section, settings_from
from xce_etcd.testing import EtcdCluster

from xcecore.testing.cluster import wait_for

pytestmark = pytest.mark.timeout(120)

EPS = ("http://10.0.0.1:2379", "http://10.0.0.2:2379/", "http://10.0.0.3:2379")


def test_the_local_member_is_derived_from_the_advertised_host() -> None:
    assert local_endpoint(AUTO, EPS, "10.0.0.2:7600") == "http://10.0.0.2:2379"
    assert local_endpoint(AUTO, ("https://Ctl1.example.org:2379",), "ctl1.EXAMPLE.org:7600") == \
        "https://Ctl1.example.org:2379"
    assert local_endpoint(AUTO, EPS, "10.0.0.9:7600") is None  # etcd elsewhere
    assert local_endpoint(AUTO, EPS, "not an address") is None
    one_host = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert local_endpoint(AUTO, one_host, "127.0.0.1:7600") is None  # all on one host: no gain
    assert local_endpoint(NONE, EPS, "10.0.0.2:7600") is None
    assert local_endpoint("http://10.0.0.3:2379/", EPS, "10.0.0.2:7600") == "http://10.0.0.3:2379"
    with pytest.raises(ValueError, match="not one of etcd.endpoints"):
        local_endpoint("http://10.0.0.7:2379", EPS, "10.0.0.2:7600")


def test_local_member_is_validated_with_the_section() -> None:
    base = {"endpoints": list(EPS), "prefix": "/xce", "lease_ttl": 1, "request_timeout": 1.0,
            "safety_margin": 0.1, "max_txn_ops": 128, "max_request_bytes": 1 << 20}
    for ok in ("auto", "none", "http://10.0.0.1:2379"):
        check_etcd_section({**base, "local_member": ok})
    with pytest.raises(ValueError, match="local_member"):
        check_etcd_section({**base, "local_member": "m1"})
    assert settings_from({**base, "transport": "grpc", "local_member": "none"}).local_member == "none"


def test_leadership_goes_to_the_most_caught_up_other_member() -> None:
    lead = MemberStatus("a", 1, 1, 100)
    behind, ahead = MemberStatus("b", 2, 1, 90), MemberStatus("c", 3, 1, 99)
    assert move_target(lead, [behind, ahead]) == ahead
    assert move_target(MemberStatus("a", 1, 2, 100), [behind, ahead]) is None  # not the leader
    assert move_target(lead, []) is None  # no other member answers: keep a leader
    assert move_target(MemberStatus("a", 1, 0, 100), [behind]) is None  # no leader known


def test_a_check_moves_leadership_off_the_local_member(
        etcd_factory: Callable[..., EtcdCluster]) -> None:
    etcd = etcd_factory(["127.0.0.1"] * 3, client_port=24790, peer_port=24791)
    etcd.start()
    wait_for(lambda: etcd.leader() is not None, 30, what="an etcd leader")
    lead = etcd.leader()
    assert lead is not None
    settings = EtcdSettings(endpoints=tuple(etcd.endpoints), local_member=etcd.members[lead].url)
    placement = LeaderPlacement(settings, "127.0.0.1:7600", lambda: True)
    try:
        assert placement.check()
        wait_for(lambda: etcd.leader() not in (None, lead), 10, what="the leader to move")
        assert not placement.check()  # not the leader any more: nothing to do
        assert placement.moves == 1
    finally:
        placement.stop()


def test_a_client_asks_its_preferred_member_first(etcd_factory: Callable[..., EtcdCluster]) -> None:
    etcd = etcd_factory(["127.0.0.1"] * 3, client_port=24800, peer_port=24801)
    etcd.start()
    ids = []
    for m in etcd.members:
        one = EtcdClient([m.url])
        try:
            ids.append(one.status()["header"]["member_id"])
        finally:
            one.close()
    c = etcd.client(transport="grpc")
    try:
        for i in (2, 1):
            c.prefer(etcd.members[i].url + "/")
            assert c.status()["header"]["member_id"] == ids[i]
            assert c.grpc is not None and c.grpc.endpoints[c.grpc._stub()[1]] == etcd.members[i].url
        etcd.kill(etcd.members[1])  # gone: the next endpoint answers
        assert c.status()["header"]["member_id"] == ids[2]
    finally:
        c.close()


def test_a_check_points_the_writes_at_the_raft_leader(etcd_factory: Callable[..., EtcdCluster]) -> None:
    """Whether or not a local member is known: the gRPC writes follow the raft leader, and
    follow it again when leadership moves."""
    etcd = etcd_factory(["127.0.0.1"] * 3, client_port=24810, peer_port=24811)
    etcd.start()
    wait_for(lambda: etcd.leader() is not None, 30, what="an etcd leader")
    lead = etcd.leader()
    assert lead is not None
    client = etcd.client(transport="grpc")
    client.prefer(etcd.members[(lead + 1) % 3].url)  # the writes start at a follower
    settings = EtcdSettings(endpoints=tuple(etcd.endpoints), local_member="none")
    route = LeaderPlacement(settings, "127.0.0.1:7600", lambda: True, on_leader=client.write_to)
    mover = LeaderPlacement(EtcdSettings(endpoints=tuple(etcd.endpoints),
                                         local_member=etcd.members[lead].url), "127.0.0.1:7600",
                            lambda: True)
    try:
        assert client.grpc is not None
        assert not route.check() and route.routes == 1
        assert client.grpc.endpoint == etcd.members[lead].url
        assert not route.check() and route.routes == 1  # already there: no new route
        assert client.txn([], [put_op(b"/r/a", b"1")]).succeeded
        assert client.grpc.endpoints[client.grpc._stub()[1]] == etcd.members[lead].url
        assert mover.check()  # leadership moves off member ``lead``
        wait_for(lambda: etcd.leader() not in (None, lead), 10, what="the leader to move")
        new = etcd.leader()
        assert new is not None
        wait_for(lambda: (route.check(), client.grpc.endpoint)[1] == etcd.members[new].url, 10,
                 what="the writes to follow the new leader")
        assert route.routes == 2
        assert client.txn([], [put_op(b"/r/b", b"2")]).succeeded
    finally:
        route.stop()
        mover.stop()
        client.close()
