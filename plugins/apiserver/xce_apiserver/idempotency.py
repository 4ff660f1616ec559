"""REST idempotency: the ``Idempotency-Key`` header, with the IETF httpapi draft's semantics.

Every POST takes the header. The same key with the same request (method, path and body)
gets the same response; the same key with a different request is a 422 naming the header.
Keys belong to the user who sent them (one user's key never answers another's request).

Each controller write a request makes is sent with a ``rid`` derived from the key (see
:func:`rid_for`), so the controller's idempotency table, which is durable and survives a
failover, applies it at most once: a retry after a 504 (outcome unknown) is safe even when
this process has restarted. Without a header, the API server makes a key for the request and
returns it in the ``Idempotency-Key`` response header (a 504 names it too), so the client can
still retry safely.

This process also remembers recent requests by key (bounded: entries, bytes, age): their
fingerprint, to answer a reused key with a different request with 422, and their final
response (anything but 5xx) to replay it without a controller round trip. That memory is
per process; the controller's table is what makes retries safe.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi.responses import Response

from xce_apiserver.envelope import ApiError, from_api_error

HEADER = "Idempotency-Key"
KEY_MAX = 64
MAX_ENTRIES = 10_000
MAX_BYTES = 16 * 1024 * 1024
TTL = 3600.0
"""Seconds a remembered request is kept (the controller keeps its keys ``idem_ttl``, 1 day)."""


def parse_key(raw: str) -> str:
    """The key of a header value (visible ASCII already checked by the route's header type):
    a structured-field string loses its quotes; 1 to :data:`KEY_MAX` characters."""
    key = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    problem = ("has unbalanced quotes" if '"' in key else
               f"must have 1 to {KEY_MAX} characters" if not 0 < len(key) <= KEY_MAX else "")
    if problem:
        raise ApiError(422, f"invalid request: header.{HEADER}: {problem}",
                       [{"field": f"header.{HEADER}", "message": problem}])
    return key


_PREFIX = secrets.token_urlsafe(12)  # this process's: made keys never meet another's
_made = itertools.count(1)


def made_key() -> str:
    """A key for a request that came without one: unique across processes and restarts (a
    random prefix of this process, then a counter) and cheaper than random bytes per request.
    It need not be secret: a key only ever answers its own user's requests (:func:`rid_for`)."""
    return f"{_PREFIX}.{next(_made):x}"


def rid_for(user: str, op: str, key: str, part: int | None = None) -> str:
    """The controller ``rid`` of ``user``'s request with ``key``: ``rest:<user tag>:<op>:<key>``.

    The user tag is a hash of the user name (fixed length, so no user name or key can make
    two requests collide); ``part`` numbers the calls of one request (job control of several
    jobs: one per job id).
    """
    tag = hashlib.blake2b(user.encode(), digest_size=8).hexdigest()
    what = op if part is None else f"{op}.{part}"
    return f"rest:{tag}:{what}:{key}"


def fingerprint(method: str, path: str, body: bytes) -> bytes:
    """What identifies a request for the draft's "same request" test."""
    h = hashlib.blake2b(digest_size=16)
    for part in (method.encode(), path.encode(), body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


@dataclass(slots=True)
class _Entry:
    fingerprint: bytes
    expires: float
    status: int = 0
    body: bytes = b""
    media_type: str = "application/json"

    @property
    def size(self) -> int:
        return len(self.body) + 128


class Memory:
    """Recent requests by (user, key), bounded; thread-safe."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES,
                 ttl: float = TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self.max_bytes, self.ttl = max_entries, max_bytes, ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0

    def begin(self, user: str, key: str, fp: bytes) -> _Entry | None:
        """The remembered entry of (user, key) with this fingerprint (None: first use, now
        remembered); a different fingerprint is a 422."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get((user, key))
            if entry is not None and entry.expires <= now:
                self._drop((user, key))
                entry = None
            if entry is None:
                self._put((user, key), _Entry(fp, now + self.ttl))
                return None
            if entry.fingerprint != fp:
                raise ApiError(
                    422, f"invalid request: header.{HEADER}: key {key!r} was used for a different "
                         "request (method, path or body); use a new key for a new request",
                    [{"field": f"header.{HEADER}", "message": "reused for a different request"}])
            self._entries.move_to_end((user, key))
            return entry

    def finish(self, user: str, key: str, response: Response) -> None:
        """Remember ``response`` as the answer to (user, key) if it is final (not 5xx)."""
        if response.status_code >= 500:
            return
        with self._lock:
            entry = self._entries.get((user, key))
            if entry is None or entry.status:
                return
            self._bytes -= entry.size
            entry.status, entry.body = response.status_code, bytes(response.body)
            entry.media_type = response.media_type or "application/json"
            self._bytes += entry.size
            self._trim()

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, k: tuple[str, str], entry: _Entry) -> None:
        self._entries[k] = entry
        self._bytes += entry.size
        self._trim()

    def _drop(self, k: tuple[str, str]) -> None:
        entry = self._entries.pop(k)
        self._bytes -= entry.size

    def _trim(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))


class Idempotent:
    """One POST's idempotency: its key (given or made), and the replay/remember steps."""

    def __init__(self, memory: Memory, key: str | None, method: str, path: str, body: bytes) -> None:
        self.memory = memory
        self.supplied = key is not None
        self.key = key if key is not None else made_key()
        self.fp = fingerprint(method, path, body) if self.supplied else b""

    def rid(self, user: str, op: str, part: int | None = None) -> str:
        """The controller ``rid`` for one of this request's writes."""
        return rid_for(user, op, self.key, part)

    async def run(self, user: str, handle: Callable[[], Awaitable[Response]]) -> Response:
        """Answer the request: replay a remembered response, or ``handle`` it and remember it.

        An :class:`ApiError` from ``handle`` becomes its response here, so errors are
        remembered (and replayed) like successes; 5xx answers are not remembered.
        """
        if self.supplied:
            entry = self.memory.begin(user, self.key, self.fp)
            if entry is not None and entry.status:
                return self._stamp(Response(entry.body, entry.status, media_type=entry.media_type))
        try:
            response = await handle()
        except ApiError as exc:
            response = from_api_error(exc)
        if self.supplied:
            self.memory.finish(user, self.key, response)
        return self._stamp(response)

    def _stamp(self, response: Response) -> Response:
        response.headers[HEADER] = f'"{self.key}"'
        return response
