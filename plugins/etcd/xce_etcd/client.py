"""A thin blocking client of etcd v3's JSON gateway (``/v3/...`` over HTTP/1.1, httpx).

Only what the backend needs: ranges (paged), transactions, leases (grant, one keep-alive,
revoke) and the member status. Keys and values are bytes on this side and base64 on the
wire; int64 fields come back as strings and are converted here.

Several endpoints: a request goes to the endpoint that last answered; when it cannot even
connect (``httpx.ConnectError``: nothing was sent) it tries the next ones, once each. A
request that was sent and got no answer (a timeout, a broken connection) is *not* retried
elsewhere: a write's outcome is then unknown (:class:`OutcomeUnknown`), and only the caller
knows whether repeating it is safe.

Errors etcd answers are :class:`EtcdError` with gRPC's code and etcd's message; those that
etcd rejects before proposing to raft (:data:`DEFINITE`) are certain not to have been applied.
"""

from __future__ import annotations

import base64
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

if TYPE_CHECKING:
    from xce_etcd.grpcwire import GrpcTxn

DEFINITE = (
    "mvcc: database space exceeded",
    "too many operations in txn request",
    "request is too large",
    "duplicate key given in txn request",
    "requested lease not found",
)
"""etcd errors raised before a request is proposed: the request was certainly not applied."""


JSON = {"content-type": "application/json"}
TRANSPORTS = ("grpc", "gateway")
"""How write transactions go: gRPC (:mod:`xce_etcd.grpcwire`), or the JSON gateway like the rest."""


class EtcdUnavailable(Exception):
    """No endpoint could be reached (nothing was sent to any of them)."""


class OutcomeUnknown(Exception):
    """A request was sent and no answer came (timeout, connection lost, a raft-level error)."""


class EtcdError(Exception):
    """etcd answered with an error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def definite(self) -> bool:
        """True when etcd rejected the request before proposing it (certainly not applied)."""
        return any(text in self.message for text in DEFINITE)


@dataclass(frozen=True, slots=True)
class KV:
    """One key as a range returns it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def b64(data: bytes) -> str:
    """Base64 text of ``data`` (the gateway's encoding of bytes fields)."""
    return base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes:
    """Bytes of the gateway's base64 text (absent: empty)."""
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


def _kv(raw: dict[str, Any]) -> KV:
    return KV(unb64(raw.get("key")), unb64(raw.get("value")), int(raw.get("create_revision", 0)),
              int(raw.get("mod_revision", 0)), int(raw.get("lease", 0)))


# -- operations and compares (pure) --------------------------------------------------------------
# One form, raw bytes, for both transports: the gateway turns them into its JSON (base64) at
# send time (:func:`gateway_op`, :func:`gateway_compare`), gRPC straight into protobuf
# (:mod:`xce_etcd.grpcwire`), so a write's bytes are never base64-encoded only to be decoded.

@dataclass(frozen=True, slots=True)
class Put:
    """A transaction's put."""

    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """A transaction's delete of one key (or of ``[key, range_end)``)."""

    key: bytes
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class Read:
    """A transaction's read of one key (gateway only: gRPC answers are not decoded)."""

    key: bytes


Op = Put | Delete | Read


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction's compare: ``target`` (VERSION, CREATE, MOD, VALUE, LEASE) of ``key``
    ``result`` (EQUAL, GREATER, LESS, NOT_EQUAL) ``value`` (bytes for VALUE, else an int)."""

    key: bytes
    target: str
    value: int | bytes
    result: str = "EQUAL"


def put_op(key: bytes, value: bytes, lease: int = 0) -> Put:
    """A transaction's put."""
    return Put(key, value, lease)


def delete_op(key: bytes) -> Delete:
    """A transaction's delete of one key."""
    return Delete(key)


def range_op(key: bytes) -> Read:
    """A transaction's read of one key."""
    return Read(key)


def mod_revision_is(key: bytes, revision: int) -> Compare:
    """Compare: ``key``'s mod_revision equals ``revision`` (the fencing token)."""
    return Compare(key, "MOD", revision)


def absent(key: bytes) -> Compare:
    """Compare: ``key`` does not exist (its create_revision is 0)."""
    return Compare(key, "CREATE", 0)


_COMPARE_FIELD = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision",
                  "VALUE": "value", "LEASE": "lease"}


def gateway_op(op: Op) -> dict[str, Any]:
    """``op`` as the JSON gateway takes it."""
    if isinstance(op, Put):
        body: dict[str, Any] = {"key": b64(op.key), "value": b64(op.value)}
        if op.lease:
            body["lease"] = str(op.lease)
        return {"request_put": body}
    if isinstance(op, Delete):
        body = {"key": b64(op.key)}
        if op.range_end:
            body["range_end"] = b64(op.range_end)
        return {"request_delete_range": body}
    return {"request_range": {"key": b64(op.key)}}


def gateway_compare(c: Compare) -> dict[str, Any]:
    """``c`` as the JSON gateway takes it."""
    value = b64(c.value) if isinstance(c.value, bytes) else str(c.value)
    return {"key": b64(c.key), "target": c.target, "result": c.result,
            _COMPARE_FIELD[c.target]: value}


@dataclass(frozen=True, slots=True)
class Event:
    """One change a watch reports: a put (``value``) or a delete (``deleted``), at the
    revision of the transaction that made it."""

    key: bytes
    value: bytes
    revision: int
    deleted: bool


class Compacted(Exception):
    """A watch asked for revisions etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd compacted its history up to revision {compact_revision}")
        self.compact_revision = compact_revision


def events_of(result: dict[str, Any]) -> list[Event]:
    """The events of one watch response (raises :class:`Compacted` for a compaction's
    cancellation, :class:`OutcomeUnknown` for any other)."""
    if result.get("canceled"):
        compact = int(result.get("compact_revision", 0) or 0)
        if compact:
            raise Compacted(compact)
        raise OutcomeUnknown(f"etcd cancelled the watch: {result.get('cancel_reason', '?')}")
    out = []
    for ev in result.get("events", ()):
        kv = ev.get("kv", {})
        out.append(Event(unb64(kv.get("key")), unb64(kv.get("value")),
                         int(kv.get("mod_revision", 0)), ev.get("type") == "DELETE"))
    return out


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did: which branch, the revision after it, the branch's answers."""

    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]

    def ranged(self, index: int) -> list[KV]:
        """The keys the ``index``-th response (a range) returned."""
        rng = self.responses[index].get("response_range", {})
        return [_kv(k) for k in rng.get("kvs", [])]


class EtcdClient:
    """Blocking JSON-gateway client over several endpoints; thread-safe."""

    def __init__(self, endpoints: list[str], *, timeout: float = 1.0, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 transport: str = "gateway") -> None:
        if not endpoints:
            raise ValueError("etcd: at least one endpoint is needed")
        if transport not in TRANSPORTS:
            raise ValueError(f"etcd: transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        verify: Any = True
        if ca_file or cert_file:  # one context: httpx 0.28 ignores cert= beside verify=<path>
            verify = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
            if cert_file:
                verify.load_cert_chain(cert_file, key_file)
        # One connection per thread at a time; keep-alive reuses them.
        self._http = httpx.Client(timeout=timeout, verify=verify,
                                  limits=httpx.Limits(max_connections=16, max_keepalive_connections=8))
        self._current = 0
        self._lock = threading.Lock()
        self.requests = 0  # for tests and benchmarks
        self.grpc: GrpcTxn | None = None  # write transactions over gRPC (xce_etcd.grpcwire)
        if transport == "grpc":
            from xce_etcd.grpcwire import GrpcTxn

            self.grpc = GrpcTxn(self.endpoints, ca_file=ca_file, cert_file=cert_file,
                                key_file=key_file)

    def prefer(self, endpoint: str) -> None:
        """Send to ``endpoint`` first (until it fails): a candidate's own host's member, so
        that losing another host never costs its requests a timeout first."""
        index = [e.rstrip("/") for e in self.endpoints].index(endpoint.rstrip("/"))
        with self._lock:
            self._current = index
        if self.grpc is not None:
            self.grpc.prefer(index)

    def write_to(self, endpoint: str) -> bool:
        """Send the write transactions (the gRPC transport's) to ``endpoint`` from the next
        one on (the raft leader's member: :mod:`xce_etcd.placement`); the gateway's requests
        keep their order. False when there is no gRPC transport or it goes there already."""
        if self.grpc is None:
            return False
        index = [e.rstrip("/") for e in self.endpoints].index(endpoint.rstrip("/"))
        if self.grpc.endpoint == self.endpoints[index]:
            return False
        self.grpc.prefer(index)
        return True

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._http.is_closed

    def close(self) -> None:
        """Close every connection."""
        self._http.close()
        if self.grpc is not None:
            self.grpc.close()

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that takes the connection."""
        with self._lock:
            start = self._current
        n = len(self.endpoints)
        failures = []
        for i in range(n):
            index = (start + i) % n
            url = self.endpoints[index] + path
            try:
                resp = self._http.post(url, content=orjson.dumps(body), headers=JSON,
                                       timeout=timeout or self.timeout)
            except httpx.ConnectError as exc:  # nothing was sent: another endpoint may answer
                failures.append(f"{self.endpoints[index]}: {exc}")
                continue
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                with self._lock:  # next time, start with another endpoint
                    self._current = (index + 1) % n
                raise OutcomeUnknown(f"{url}: no answer ({type(exc).__name__}: {exc})") from None
            with self._lock:
                self._current = index
            self.requests += 1
            try:
                data = orjson.loads(resp.content)  # (a big transaction's answer: orjson's
            except ValueError:  # parse takes a tenth of the standard library's)
                raise OutcomeUnknown(f"{url}: HTTP {resp.status_code}, not JSON: {resp.text[:200]!r}") from None
            if not isinstance(data, dict):
                raise OutcomeUnknown(f"{url}: unexpected answer {data!r:.200}")
            if resp.status_code != 200 or "error" in data:
                message = str(data.get("message") or data.get("error") or resp.text[:200])
                err = EtcdError(int(data.get("code", 0) or 0), message)
                if err.definite:
                    raise err
                raise OutcomeUnknown(f"{url}: {message}")
            return data
        raise EtcdUnavailable("no etcd endpoint reachable: " + "; ".join(failures))

    # -- KV --------------------------------------------------------------------------------------

    def get(self, key: bytes, timeout: float | None = None) -> KV | None:
        """One key, or None."""
        kvs, _ = self.range(key, timeout=timeout)
        return kvs[0] if kvs else None

    def range(self, key: bytes, range_end: bytes | None = None, *, limit: int = 0,
              revision: int = 0, last_first: bool = False, timeout: float | None = None
              ) -> tuple[list[KV], int]:
        """Keys in ``[key, range_end)`` (just ``key`` without an end) and the store revision
        (``last_first``: in descending key order)."""
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if limit:
            body["limit"] = str(limit)
        if revision:
            body["revision"] = str(revision)
        if last_first:
            body["sort_order"] = "DESCEND"
            body["sort_target"] = "KEY"
        data = self.post("/v3/kv/range", body, timeout)
        kvs = [_kv(k) for k in data.get("kvs", [])]
        return kvs, int(data.get("header", {}).get("revision", 0))

    def scan(self, prefix: bytes, page: int = 2000, *, end: bytes | None = None,
             revision: int = 0) -> tuple[list[KV], int]:
        """Every key under ``prefix`` (below ``end`` if given), in pages, all read at one
        revision (``revision``, or the current one)."""
        end = prefix_end(prefix) if end is None else end
        out: list[KV] = []
        start = prefix
        while True:
            kvs, rev = self.range(start, end, limit=page, revision=revision)
            revision = revision or rev
            out.extend(kvs)
            if len(kvs) < page:
                return out, revision
            start = kvs[-1].key + b"\0"

    def put(self, key: bytes, value: bytes, lease: int = 0, timeout: float | None = None) -> int:
        """Put one key; the revision it got."""
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        data = self.post("/v3/kv/put", body, timeout)
        return int(data.get("header", {}).get("revision", 0))

    def txn(self, compare: list[Compare], success: list[Op], failure: list[Op] | None = None,
            timeout: float | None = None) -> TxnResult:
        """One transaction (a write-only one over gRPC when the client has that transport:
        its result then has no responses)."""
        if self.grpc is not None and not any(isinstance(op, Read) for op in (*success, *(failure or ()))):
            ok, revision = self.grpc.txn(compare, success, failure, timeout or self.timeout)
            return TxnResult(ok, revision, [])
        body: dict[str, Any] = {"compare": [gateway_compare(c) for c in compare],
                                "success": [gateway_op(op) for op in success]}
        if failure:
            body["failure"] = [gateway_op(op) for op in failure]
        data = self.post("/v3/kv/txn", body, timeout)
        return TxnResult(bool(data.get("succeeded", False)),
                         int(data.get("header", {}).get("revision", 0)),
                         list(data.get("responses", [])))

    def watch(self, key: bytes, range_end: bytes, start: int, idle: float) -> Iterator[list[Event]]:
        """Watch ``[key, range_end)`` from revision ``start``: yields each response's events
        (an empty list for the creation), in revision order, until the stream breaks or is
        silent for ``idle`` s (OutcomeUnknown), or etcd compacted ``start`` away
        (:class:`Compacted`). On the endpoint that last answered, or the next ones that take
        the connection; the caller re-watches from the revision after the last event."""
        body = {"create_request": {"key": b64(key), "range_end": b64(range_end),
                                   "start_revision": str(start)}}
        timeout = httpx.Timeout(self.timeout, read=idle)
        with self._lock:
            start_at = self._current
        n = len(self.endpoints)
        failures = []
        for i in range(n):
            url = self.endpoints[(start_at + i) % n] + "/v3/watch"
            try:
                with self._http.stream("POST", url, content=orjson.dumps(body), headers=JSON,
                                       timeout=timeout) as resp:
                    if resp.status_code != 200:
                        raise OutcomeUnknown(f"{url}: HTTP {resp.status_code}")
                    for line in resp.iter_lines():
                        if not line.strip():
                            continue
                        try:
                            msg = orjson.loads(line)
                        except orjson.JSONDecodeError:
                            raise OutcomeUnknown(f"{url}: not JSON: {line[:200]!r}") from None
                        if "error" in msg:
                            raise OutcomeUnknown(f"{url}: {msg['error']}")
                        yield events_of(msg.get("result", {}))
                raise OutcomeUnknown(f"{url}: the watch stream ended")
            except httpx.ConnectError as exc:
                failures.append(f"{url}: {exc}")
                continue
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                with self._lock:
                    self._current = (start_at + i + 1) % n
                raise OutcomeUnknown(f"{url}: watch: {type(exc).__name__}: {exc}") from None
        raise EtcdUnavailable("no etcd endpoint reachable: " + "; ".join(failures))

    # -- leases ------------------------------------------------------------------------------------

    def lease_grant(self, ttl: int, timeout: float | None = None) -> tuple[int, int]:
        """A new lease: (id, the TTL etcd granted, which may be longer than asked)."""
        data = self.post("/v3/lease/grant", {"TTL": str(ttl)}, timeout)
        return int(data["ID"]), int(data.get("TTL", ttl))

    def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew ``lease`` once; the TTL it has again (0: the lease is gone)."""
        data = self.post("/v3/lease/keepalive", {"ID": str(lease)}, timeout)
        return int(data.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease: int, timeout: float | None = None) -> None:
        """Revoke ``lease`` (its keys are deleted); a lease already gone is fine."""
        try:
            self.post("/v3/lease/revoke", {"ID": str(lease)}, timeout)
        except EtcdError as exc:
            if "lease not found" not in exc.message:
                raise

    def status(self, timeout: float | None = None) -> dict[str, Any]:
        """The answering member's status (version, db size, leader, ...)."""
        return self.post("/v3/maintenance/status", {}, timeout)
