"""What etcd alone does, for ``bench_etcd.py``: its JSON gateway against its gRPC API.

Three shapes, each through both APIs, from one process on the same machine:

- ``sequential``: one client, one put at a time (the ceiling of a sequential submitter: one
  raft round, with each member's fsync, per put);
- ``concurrent``: 8 client threads, one put at a time each (etcd batches concurrent
  proposals into one raft round);
- ``batched``: one client, sequential transactions of 64 puts each (what a group commit
  gets per transaction), counted in puts.

gRPC here is ``grpcio`` with the two messages hand-encoded (protobuf's wire format: a
``PutRequest`` is field 1 the key and field 2 the value; a ``TxnRequest``'s field 2 repeats
a ``RequestOp`` whose field 2 is a ``PutRequest``): the benchmark needs nothing generated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from benchkit import log, stats

PART = "etcd"
BATCH = 64
CLIENTS = 8


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def put_request(key: bytes, value: bytes) -> bytes:
    """etcdserverpb.PutRequest{key, value}, encoded."""
    return _field(1, key) + _field(2, value)


def txn_of_puts(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """etcdserverpb.TxnRequest{success: [RequestOp{request_put}...]}, encoded."""
    return b"".join(_field(2, _field(2, put_request(k, v))) for k, v in pairs)


class Grpc:
    """Raw-bytes gRPC calls of etcd's KV service on one endpoint."""

    def __init__(self, endpoint: str) -> None:
        try:
            import grpc
        except ImportError:
            raise RuntimeError("the gRPC figures need the grpcio package "
                               "(pip install -r requirements-dev.txt)") from None
        self.channel = grpc.insecure_channel(urlsplit(endpoint).netloc)
        self.put = self.channel.unary_unary("/etcdserverpb.KV/Put")
        self.txn = self.channel.unary_unary("/etcdserverpb.KV/Txn")

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def _rate(reps: int, n: int, clients: int, make: Callable[[], Any],
          one: Callable[[Any, int, int, int], int], close: Callable[[Any], None]) -> list[float]:
    """Puts per second of ``reps`` runs of ``n`` puts by ``clients`` threads; ``one(c, r,
    thread, i)`` does step ``i`` and says how many puts it made."""
    rates = []
    for r in range(reps):
        cs = [make() for _ in range(clients)]
        done = [0] * clients

        def run(k: int, r: int = r, cs: list[Any] = cs, done: list[int] = done) -> None:
            i = 0
            while done[k] < n // clients:
                done[k] += one(cs[k], r, k, i)
                i += 1

        threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rates.append(sum(done) / (time.perf_counter() - t0))
        for c in cs:
            close(c)
    return rates


def ceiling(endpoints: list[str], quick: bool) -> dict[str, Any]:
    """Every shape through both APIs: ``{shape_api: {"puts_per_s": stats, ...}}``."""
    from xce_etcd.client import EtcdClient, put_op

    reps, n = (3, 300) if quick else (5, 1500)
    value = b"x" * 200

    def key(api: str, r: int, k: int, i: int, j: int = 0) -> bytes:
        return f"/bench-alone/{api}/{r}/{k}/{i}/{j}".encode()

    def gw_put(c: EtcdClient, r: int, k: int, i: int) -> int:
        c.put(key("gw", r, k, i), value)
        return 1

    def gw_txn(c: EtcdClient, r: int, k: int, i: int) -> int:
        c.txn([], [put_op(key("gwt", r, k, i, j), value) for j in range(BATCH)], timeout=10)
        return BATCH

    def rpc_put(c: Grpc, r: int, k: int, i: int) -> int:
        c.put(put_request(key("rpc", r, k, i), value), timeout=10)
        return 1

    def rpc_txn(c: Grpc, r: int, k: int, i: int) -> int:
        c.txn(txn_of_puts([(key("rpct", r, k, i, j), value) for j in range(BATCH)]), timeout=10)
        return BATCH

    def gateway() -> EtcdClient:
        return EtcdClient(endpoints, timeout=10)

    def grpc_client() -> Grpc:
        return Grpc(endpoints[0])

    out: dict[str, Any] = {}
    shapes: list[tuple[str, int, Callable[[], Any], Callable[[Any, int, int, int], int],
                       Callable[[Any], None]]] = [
        ("sequential_gateway", 1, gateway, gw_put, EtcdClient.close),
        ("sequential_grpc", 1, grpc_client, rpc_put, Grpc.close),
        ("concurrent_gateway", CLIENTS, gateway, gw_put, EtcdClient.close),
        ("concurrent_grpc", CLIENTS, grpc_client, rpc_put, Grpc.close),
        ("batched_gateway", 1, gateway, gw_txn, EtcdClient.close),
        ("batched_grpc", 1, grpc_client, rpc_txn, Grpc.close),
    ]
    for name, clients, make, one, close in shapes:
        count = n * (BATCH // 4) if name.startswith("batched") else n
        rates = _rate(reps, count, clients, make, one, close)
        out[name] = {"puts_per_s": stats(rates, 0), "puts_per_run": count, "runs": reps,
                     "clients": clients, "puts_per_request": BATCH if name.startswith("batched") else 1}
        log(PART, f"etcd alone, {name}: median {stats(rates, 0)['p50']:.0f} puts/s")
    return out
