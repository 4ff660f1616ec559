"""The store's write transactions over gRPC (xce_etcd.grpcwire): the encoding, and a real etcd."""

from __future__ import annotations

import time

import pytest
from xce_etcd.client import (
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    OutcomeUnknown,
    absent,
    delete_op,
    gateway_compare,
    gateway_op,
    mod_revision_is,
    put_op,
    range_op,
)
from xce_etcd.grpcwire import decode_txn, encode_txn, field_bytes, field_int, fields, varint
from xce_etcd.testing import EtcdCluster

pytestmark = pytest.mark.timeout(60)


def test_the_wire_format_round_trips_and_refuses_what_it_cannot_encode() -> None:
    assert varint(1) == b"\x01" and varint(300) == b"\xac\x02" and len(varint(-1)) == 10
    msg = field_int(2, 1) + field_bytes(1, field_int(3, 77) + field_int(1, 5))
    assert fields(msg) == [(2, 1), (1, b"\x18\x4d\x08\x05")]
    assert decode_txn(msg) == (True, 77)
    assert decode_txn(b"") == (False, 0)  # proto3: false and 0 are absent
    with pytest.raises(ValueError, match="past the end"):
        fields(field_bytes(1, b"abc")[:-1])
    with pytest.raises(ValueError, match="puts and deletes only"):
        encode_txn([], [range_op(b"k")])
    assert varint(127) == b"\x7f" and varint(128) == b"\x80\x01"
    # compare key=b"k" MOD EQUAL 5; put b"x"=b"y" on lease 7; delete b"z"
    raw = encode_txn([mod_revision_is(b"k", 5)], [put_op(b"x", b"y", 7), delete_op(b"z")])
    (c, put, delete) = fields(raw)
    assert c == (1, b"\x08\x00\x10\x02\x1a\x01k\x30\x05")
    assert put == (2, field_bytes(2, b"\x0a\x01x\x12\x01y\x18\x07"))
    assert delete == (2, field_bytes(3, b"\x0a\x01z"))
    # a value compare, a range delete, and lengths past one varint byte
    big = b"v" * 300
    raw = encode_txn([Compare(b"k", "VALUE", b"abc", "NOT_EQUAL")],
                     [put_op(b"x", big), Delete(b"a", b"b")])
    (c, put, delete) = fields(raw)
    assert c == (1, b"\x08\x03\x10\x03\x1a\x01k\x3a\x03abc")
    assert put == (2, field_bytes(2, field_bytes(1, b"x") + field_bytes(2, big)))
    assert delete == (2, field_bytes(3, b"\x0a\x01a\x12\x01b"))


def test_the_gateway_form_of_operations_and_compares() -> None:
    assert gateway_op(put_op(b"k", b"v", 7)) == {"request_put": {"key": "aw==", "value": "dg==",
                                                                 "lease": "7"}}
    assert gateway_op(Delete(b"a", b"b")) == {"request_delete_range": {"key": "YQ==",
                                                                       "range_end": "Yg=="}}
    assert gateway_op(range_op(b"k")) == {"request_range": {"key": "aw=="}}
    assert gateway_compare(mod_revision_is(b"k", 5)) == {
        "key": "aw==", "target": "MOD", "result": "EQUAL", "mod_revision": "5"}
    assert gateway_compare(absent(b"k"))["create_revision"] == "0"
    assert gateway_compare(Compare(b"k", "VALUE", b"v"))["value"] == "dg=="


def test_a_guarded_transaction_over_grpc_on_a_real_etcd(etcd_one: EtcdCluster) -> None:
    gw = etcd_one.client()
    rpc = EtcdClient(etcd_one.endpoints, timeout=2, transport="grpc")
    try:
        assert rpc.grpc is not None
        lead = gw.put(b"/g/leader", b"me")
        res = rpc.txn([mod_revision_is(b"/g/leader", lead), absent(b"/g/new")],
                      [put_op(b"/g/new", b"v"), delete_op(b"/g/old")])
        assert res.succeeded and res.revision == lead + 1 and rpc.grpc.requests == 1
        got = gw.get(b"/g/new")
        assert got is not None and got.value == b"v" and got.mod_revision == res.revision
        # the guard fails: nothing applied, the revision is the store's
        res = rpc.txn([mod_revision_is(b"/g/leader", lead + 100)], [put_op(b"/g/no", b"v")])
        assert not res.succeeded and res.revision == lead + 1 and gw.get(b"/g/no") is None
        # refused before proposing: definite, named by etcd's message
        with pytest.raises(EtcdError, match="too many operations") as info:
            rpc.txn([], [put_op(b"/g/%d" % i, b"v") for i in range(20000)])
        assert info.value.definite
        # a transaction that reads goes through the gateway (its answer has the keys)
        res = rpc.txn([absent(b"/g/new")], [put_op(b"/g/new", b"w")], [range_op(b"/g/new")])
        assert not res.succeeded and [kv.value for kv in res.ranged(0)] == [b"v"]
        assert rpc.grpc.requests == 2
    finally:
        rpc.close()
        gw.close()


def test_a_member_gone_is_an_unknown_outcome_and_the_next_call_tries_the_next_one(
        etcd_factory) -> None:
    etcd = etcd_factory(["127.0.0.1"] * 3, client_port=24130, peer_port=24131)
    etcd.start()
    rpc = EtcdClient(etcd.endpoints, timeout=2, transport="grpc")
    try:
        assert rpc.txn([], [put_op(b"/g/a", b"1")]).succeeded
        etcd.kill(etcd.members[0])  # the endpoint the gRPC channel uses
        with pytest.raises(OutcomeUnknown, match="gRPC"):
            rpc.txn([], [put_op(b"/g/b", b"2")], timeout=1)
        # the next calls go to members 1, 2 (raft may be electing a leader meanwhile: a
        # proposal then gets no answer either, so each call is an unknown outcome until then)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert rpc.txn([], [put_op(b"/g/c", b"3")], timeout=2).succeeded
                break
            except OutcomeUnknown:
                assert time.monotonic() < deadline, "no member took a write in 30 s"
        assert rpc.grpc is not None and rpc.grpc.endpoints[rpc.grpc._index] != etcd.endpoints[0]
    finally:
        rpc.close()


def test_tls_with_a_client_certificate_on_both_transports(tmp_path, etcd_factory) -> None:
    from xcecore.tlscerts import make_ca, make_host

    ca = make_ca(tmp_path / "ca")
    server = make_host(tmp_path / "ca", "etcd", ["127.0.0.1", "localhost"])
    etcd = etcd_factory(["127.0.0.1"], client_port=24140, peer_port=24141)
    etcd.tls = (str(ca), str(server.cert), str(server.key))
    etcd.members[0].scheme = "https"
    etcd.start()
    assert etcd.endpoints[0].startswith("https://")
    rpc = etcd.client(timeout=5, transport="grpc")
    try:
        res = rpc.txn([absent(b"/tls/k")], [put_op(b"/tls/k", b"v")])  # over gRPC, TLS
        assert res.succeeded and rpc.grpc is not None and rpc.grpc.requests == 1
        got = rpc.get(b"/tls/k")  # through the gateway, TLS
        assert got is not None and got.value == b"v" and got.mod_revision == res.revision
    finally:
        rpc.close()
    # without the client certificate, etcd refuses the connection: no answer, not applied
    bare = EtcdClient(etcd.endpoints, timeout=2, ca_file=str(ca), transport="grpc")
    try:
        with pytest.raises(OutcomeUnknown):
            bare.txn([], [put_op(b"/tls/no", b"v")], timeout=2)
    finally:
        bare.close()
    check = etcd.client()
    try:
        assert check.get(b"/tls/no") is None
    finally:
        check.close()
