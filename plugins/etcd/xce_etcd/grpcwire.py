"""etcd's ``KV/Txn`` over gRPC (``grpcio``), for the store's write transactions.

Why: through the JSON gateway every request is parsed from JSON by etcd, sent again over a
second, internal gRPC connection, and its answer turned back into JSON (bytes fields in
base64 both ways); measured on the test machine (``benchmarks/bench_etcd.py``), etcd alone
answers about 1.6x the sequential puts and 1.3-2x the puts in 64-put transactions through
gRPC. The store's transactions are its hot path; everything else (ranges, leases, watches,
status) stays on the gateway client, which the tests and the operator's ``curl`` share.

Only what a write transaction needs is encoded, by hand (protobuf's wire format: the field
numbers are etcd's ``rpc.proto``), so nothing is generated: the request straight from the
raw operations the gateway client also takes (:mod:`xce_etcd.client`'s ``Put``, ``Delete``,
``Compare``: no base64 on this path), the answer's header revision and ``succeeded``. A
transaction with a read is not sent here (its answer is not decoded).

Outcomes as the gateway client gives them: an error etcd answers before proposing
(:data:`~xce_etcd.client.DEFINITE`) is :class:`~xce_etcd.client.EtcdError`; anything else
(a deadline, a broken or refused connection, a raft-level error) is
:class:`~xce_etcd.client.OutcomeUnknown` -- gRPC cannot tell "never sent" from "sent, no
answer", so neither is retried here -- and the next call goes to the next endpoint.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from xce_etcd.client import Compare, Delete, EtcdError, Op, OutcomeUnknown, Put

_MAX_MESSAGE = 64 * 1024 * 1024
_RESULT = {"EQUAL": 0, "GREATER": 1, "LESS": 2, "NOT_EQUAL": 3}
_TARGET = {"VERSION": 0, "CREATE": 1, "MOD": 2, "VALUE": 3, "LEASE": 4}
_TARGET_FIELD = {"VERSION": 4, "CREATE": 5, "MOD": 6, "VALUE": 7, "LEASE": 8}
_SMALL = [bytes([i]) for i in range(0x80)]  # one-byte varints, the commonest by far


# -- protobuf wire format (pure) ------------------------------------------------------------------

def varint(n: int) -> bytes:
    """``n`` as a protobuf varint (negative int64: two's complement, ten bytes)."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_bytes(number: int, data: bytes) -> bytes:
    """A length-delimited field (bytes, string, message)."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_int(number: int, value: int) -> bytes:
    """A varint field (int64, enum, bool)."""
    return varint(number << 3) + varint(value)


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The top-level fields of a message: (number, int for varints, bytes for the rest)."""
    out: list[tuple[int, int | bytes]] = []
    i, n = 0, len(data)
    while i < n:
        key, i = _read_varint(data, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, i = _read_varint(data, i)
            out.append((number, value))
        elif kind == 2:
            size, i = _read_varint(data, i)
            out.append((number, data[i:i + size]))
            i += size
        elif kind == 1:
            out.append((number, data[i:i + 8]))
            i += 8
        elif kind == 5:
            out.append((number, data[i:i + 4]))
            i += 4
        else:
            raise ValueError(f"protobuf: wire type {kind} of field {number} is not supported")
    if i != n:
        raise ValueError("protobuf: a field runs past the end of the message")
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data):
            raise ValueError("protobuf: a varint runs past the end of the message")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def encode_op(op: Op) -> bytes:
    """A ``RequestOp`` (put: field 2, delete_range: field 3)."""
    if isinstance(op, Put):
        key, value = op.key, op.value
        body = b"\x0a" + varint(len(key)) + key + b"\x12" + varint(len(value)) + value
        if op.lease:
            body += b"\x18" + varint(op.lease)
        return b"\x12" + varint(len(body)) + body
    if isinstance(op, Delete):
        body = b"\x0a" + varint(len(op.key)) + op.key
        if op.range_end:
            body += field_bytes(2, op.range_end)
        return b"\x1a" + varint(len(body)) + body
    raise ValueError(f"the gRPC transaction takes puts and deletes only, not {type(op).__name__}")


def encode_compare(c: Compare) -> bytes:
    """A ``Compare``."""
    number = _TARGET_FIELD[c.target]
    body = field_int(1, _RESULT[c.result]) + field_int(2, _TARGET[c.target]) + field_bytes(3, c.key)
    if isinstance(c.value, bytes):
        body += field_bytes(number, c.value)
    else:
        body += field_int(number, c.value)
    return body


def encode_txn(compare: list[Compare], success: list[Op], failure: list[Op] | None = None) -> bytes:
    """A ``TxnRequest``."""
    parts = [field_bytes(1, encode_compare(c)) for c in compare]
    for op in success:
        one = encode_op(op)
        parts.append(b"\x12" + varint(len(one)) + one)
    parts += [field_bytes(3, encode_op(op)) for op in failure or ()]
    return b"".join(parts)


def decode_txn(data: bytes) -> tuple[bool, int]:
    """``succeeded`` and the header's revision of a ``TxnResponse``."""
    succeeded, revision = False, 0
    for number, value in fields(data):
        if number == 1 and isinstance(value, bytes):
            for n, v in fields(value):
                if n == 3 and isinstance(v, int):
                    revision = v
        elif number == 2 and isinstance(value, int):
            succeeded = bool(value)
    return succeeded, revision


# -- the transport --------------------------------------------------------------------------------

class GrpcTxn:
    """``KV/Txn`` calls over one gRPC channel at a time, on several endpoints; thread-safe."""

    def __init__(self, endpoints: list[str], *, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None) -> None:
        try:
            import grpc
        except ImportError:  # a dependency of xce-etcd: a broken install
            raise RuntimeError("the etcd backend's gRPC transport needs the grpcio package "
                               "(a dependency of xce-etcd: reinstall it), or set [etcd] "
                               "transport = \"gateway\"") from None
        self._grpc = grpc
        self.endpoints = endpoints
        self._tls = [urlsplit(e).scheme == "https" for e in endpoints]
        self._creds = None
        if any(self._tls):
            def read(path: str | None) -> bytes | None:
                if not path:
                    return None
                with open(path, "rb") as fh:
                    return fh.read()

            self._creds = grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))
        self._lock = threading.Lock()
        self._index = 0  # the endpoint of the channel
        self._want = 0  # the endpoint of the next call (prefer)
        self._channel: Any = None
        self._call: Any = None
        self.requests = 0  # for tests and benchmarks

    def _stub(self) -> tuple[Any, int]:
        with self._lock:
            if self._want != self._index:  # switched here, between two calls: never under one
                if self._channel is not None:
                    self._channel.close()
                self._channel = self._call = None
                self._index = self._want
            if self._call is None:
                target = urlsplit(self.endpoints[self._index]).netloc
                options = [("grpc.max_send_message_length", _MAX_MESSAGE),
                           ("grpc.max_receive_message_length", _MAX_MESSAGE)]
                self._channel = (self._grpc.secure_channel(target, self._creds, options)
                                 if self._tls[self._index] and self._creds is not None
                                 else self._grpc.insecure_channel(target, options))
                self._call = self._channel.unary_unary("/etcdserverpb.KV/Txn")
            return self._call, self._index

    def prefer(self, index: int) -> None:
        """The next call goes to endpoint ``index`` (a new channel if it is another; a call
        in flight finishes on its own channel)."""
        with self._lock:
            self._want = index

    @property
    def endpoint(self) -> str:
        """The endpoint the next call goes to."""
        return self.endpoints[self._want]

    def _next(self, index: int) -> None:
        """After a failure on endpoint ``index``: the next call goes to the next endpoint."""
        with self._lock:
            if self._index == index:
                if self._channel is not None:
                    self._channel.close()
                self._channel = self._call = None
                self._index = self._want = (index + 1) % len(self.endpoints)

    def txn(self, compare: list[Compare], success: list[Op], failure: list[Op] | None,
            timeout: float) -> tuple[bool, int]:
        """One write transaction: (succeeded, the revision after it)."""
        request = encode_txn(compare, success, failure)
        call, index = self._stub()
        try:
            answer = call(request, timeout=timeout)
        except ValueError as exc:  # the channel was closed by another thread's _next
            self._next(index)
            raise OutcomeUnknown(f"{self.endpoints[index]} (gRPC): {exc}") from None
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
            err = EtcdError(code.value[0] if code is not None else 0, details)
            if err.definite:
                raise err from None
            self._next(index)
            name = code.name if code is not None else "?"
            raise OutcomeUnknown(f"{self.endpoints[index]} (gRPC): {name}: {details}") from None
        self.requests += 1
        try:
            return decode_txn(answer)
        except ValueError as exc:
            raise OutcomeUnknown(f"{self.endpoints[index]} (gRPC): an answer that is not a "
                                 f"TxnResponse ({exc})") from None

    def close(self) -> None:
        """Close the channel."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._call = None
