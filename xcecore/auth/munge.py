"""The ``munge`` method: a MUNGE credential, minted and decoded by the hosts' munged.

The client asks its host's ``munged`` (over a UNIX socket: munged learns the caller's uid and
gid from the kernel, so they cannot be claimed) for a credential whose payload is
``xce-auth 1\\n<challenge>\\n<role@host>``. The controller asks its own host's munged to
decode it: that proves the uid and gid (munged on every host shares one key, and nothing
else holds it), and munged refuses an expired, rewound or replayed credential or one made
under another key. The payload binds the server's challenge, so a credential is good for the
one connection it was made for, and the claimed ``role@host``, so it cannot be moved to
another claim. User names are the controller's lookup of the uid, never the client's word.

libmunge is called through a small ctypes binding (:class:`Libmunge`); ``benchmarks/
bench_auth.py`` measured it against the ``munge``/``unmunge`` programs (a fork and exec per
credential): a credential made and checked through the binding took 0.12-0.15 ms (p50) against
2-9 ms through the programs on the shared 2-core machine (benchmarks/RESULTS.md, section 12).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any, NamedTuple

from xcecore.auth import AuthError, AuthFailed, AuthMethod, AuthSettings, Verified

LIBRARY = "libmunge.so.2"
"""The shared library (Debian's ``libmunge2``)."""
PAYLOAD_TAG = "xce-auth 1"
CRED_MAX = 4096
"""Longest credential a handshake answer may carry (MUNGE's are ~200 characters here)."""

# munge.h
OPT_TTL = 4
OPT_SOCKET = 8
OPT_UID_RESTRICTION = 9
SUCCESS = 0
EMUNGE_SOCKET = 6
ERRORS: dict[int, tuple[str, str]] = {
    1: ("no_daemon", "munged failed internally"),
    2: ("malformed", "the credential is not a MUNGE credential"),
    3: ("malformed", "the credential is too long"),
    6: ("no_daemon", "munged cannot be reached"),
    7: ("no_daemon", "munged timed out"),
    8: ("malformed", "the credential is malformed (forged or damaged)"),
    9: ("malformed", "the credential has a bad version (forged or damaged)"),
    10: ("malformed", "the credential has a bad cipher (forged or damaged)"),
    11: ("malformed", "the credential has a bad MAC type (forged or damaged)"),
    12: ("malformed", "the credential has a bad compression type (forged or damaged)"),
    13: ("invalid", "the credential is from another security realm"),
    14: ("invalid", "the credential is invalid: not made by a munged with this cluster's key "
                    "(forged, or another munge key)"),
    15: ("expired", "credential expired"),
    16: ("rewound", "credential rewound: made in the future (are the hosts' clocks in sync?)"),
    17: ("replayed", "credential replayed: it was already used"),
    18: ("unauthorized", "credential unauthorized: it is restricted to another uid or gid"),
}
"""munge_err_t -> (reason, what it means)."""


class Decoded(NamedTuple):
    """What ``munge_decode`` said: its error number (0: success), payload, uid and gid."""

    error: int
    payload: bytes
    uid: int
    gid: int
    detail: str


class Libmunge:
    """The ctypes binding: encode and decode through munged at ``socket`` (None: default).

    The library is loaded on first use; each call makes and destroys its own context, so
    calls from several threads never share one.
    """

    _lib: Any = None
    _free: Any = None

    def __init__(self, socket: str | None = None) -> None:
        self.socket = socket

    @classmethod
    def _load(cls) -> Any:
        if cls._lib is None:
            try:
                lib = ctypes.CDLL(LIBRARY)
            except OSError as exc:
                raise AuthError(f"cluster.auth = 'munge' needs {LIBRARY} (Debian: apt-get "
                                f"install libmunge2 munge): {exc}") from None
            vp, cp = ctypes.c_void_p, ctypes.c_char_p
            lib.munge_ctx_create.restype = vp
            lib.munge_ctx_create.argtypes = []
            lib.munge_ctx_destroy.restype = None
            lib.munge_ctx_destroy.argtypes = [vp]
            lib.munge_ctx_strerror.restype = cp
            lib.munge_ctx_strerror.argtypes = [vp]
            lib.munge_ctx_set.restype = ctypes.c_int  # variadic: (ctx, opt, value)
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_encode.argtypes = [ctypes.POINTER(cp), vp, cp, ctypes.c_int]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [cp, vp, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_int),
                                         ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)]
            libc = ctypes.CDLL(None)
            libc.free.argtypes = [vp]
            libc.free.restype = None
            cls._free = libc.free
            cls._lib = lib
        return cls._lib

    def _context(self, lib: Any, *, ttl: int | None = None,
                 uid_restriction: int | None = None) -> Any:
        ctx = lib.munge_ctx_create()
        if not ctx:
            raise MemoryError("munge_ctx_create failed")
        try:
            if self.socket is not None:
                self._set(lib, ctx, OPT_SOCKET, ctypes.c_char_p(self.socket.encode()))
            if ttl is not None:
                self._set(lib, ctx, OPT_TTL, ctypes.c_int(ttl))
            if uid_restriction is not None:
                self._set(lib, ctx, OPT_UID_RESTRICTION, ctypes.c_uint(uid_restriction))
        except BaseException:
            lib.munge_ctx_destroy(ctx)
            raise
        return ctx

    @staticmethod
    def _set(lib: Any, ctx: Any, opt: int, value: Any) -> None:
        err = lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(opt), value)
        if err != SUCCESS:
            raise AuthError(f"munge_ctx_set({opt}) failed: error {err}")

    @staticmethod
    def _detail(lib: Any, ctx: Any, err: int) -> str:
        text = lib.munge_ctx_strerror(ctx)
        return text.decode(errors="replace") if text else f"munge error {err}"

    def encode(self, payload: bytes, *, ttl: int | None = None,
               uid_restriction: int | None = None) -> tuple[int, str]:
        """A credential for ``payload`` from the calling process: ``(error, credential or
        munged's message)``. ``ttl`` seconds (None: munged's default); ``uid_restriction``:
        only that uid may decode it."""
        lib = self._load()
        ctx = self._context(lib, ttl=ttl, uid_restriction=uid_restriction)
        try:
            out = ctypes.c_char_p()
            err = lib.munge_encode(ctypes.byref(out), ctx, payload, len(payload))
            if err != SUCCESS:
                return err, self._detail(lib, ctx, err)
            try:
                return SUCCESS, (out.value or b"").decode("ascii")
            finally:
                self._free(ctypes.cast(out, ctypes.c_void_p))
        finally:
            lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Decoded:
        """Decode ``credential`` through munged (the payload is kept even when it is expired,
        rewound or replayed, as libmunge returns it)."""
        lib = self._load()
        ctx = self._context(lib)
        try:
            buf, size = ctypes.c_void_p(), ctypes.c_int(0)
            uid, gid = ctypes.c_uint(0), ctypes.c_uint(0)
            err = lib.munge_decode(credential.encode("ascii", "replace"), ctx, ctypes.byref(buf),
                                   ctypes.byref(size), ctypes.byref(uid), ctypes.byref(gid))
            payload = b""
            if buf.value:
                try:
                    payload = ctypes.string_at(buf.value, size.value)
                finally:
                    self._free(buf)
            detail = self._detail(lib, ctx, err) if err != SUCCESS else ""
            return Decoded(err, payload, uid.value, gid.value, detail)
        finally:
            lib.munge_ctx_destroy(ctx)


def payload_for(challenge: str, sender: str) -> bytes:
    """The payload a credential carries: the challenge and the claimed ``role@host``."""
    return f"{PAYLOAD_TAG}\n{challenge}\n{sender}".encode()


class MungeAuth(AuthMethod):
    """The ``munge`` method through munged at ``socket`` (None: libmunge's default)."""

    name = "munge"
    blocking = True  # a round trip to munged over its socket

    def __init__(self, socket: str | None = None) -> None:
        self.socket = socket
        self.lib = Libmunge(socket)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MungeAuth) and other.socket == self.socket

    def __hash__(self) -> int:
        return hash(("munge", self.socket))

    def __repr__(self) -> str:
        return f"MungeAuth({self.socket!r})"

    def _where(self) -> str:
        return f"munged at {self.socket or 'its default socket'}"

    def answer(self, challenge: str, sender: str) -> dict[str, Any]:
        """``{"cred": "MUNGE:..."}`` binding ``challenge`` and ``sender``."""
        err, text = self.lib.encode(payload_for(challenge, sender))
        if err != SUCCESS:
            raise AuthFailed("no_daemon", f"cannot get a MUNGE credential from {self._where()}: "
                                          f"{text} (is munged running on this host?)")
        return {"cred": text}

    def verify(self, challenge: str, sender: str, answer: Mapping[str, Any]) -> Verified:
        """Decode the credential; its uid and gid once the payload matches this connection."""
        cred = answer.get("cred")
        if not isinstance(cred, str) or not cred or len(cred) > CRED_MAX:
            raise AuthFailed("malformed", f"{sender} sent no MUNGE credential ('cred')")
        got = self.lib.decode(cred)
        if got.error != SUCCESS:
            reason, meaning = ERRORS.get(got.error, ("invalid", f"munge error {got.error}"))
            if reason == "no_daemon":
                meaning = f"the controller cannot reach its {self._where()} ({got.detail})"
            raise AuthFailed(reason, meaning)
        return self.check_payload(got, challenge, sender)

    @staticmethod
    def check_payload(got: Decoded, challenge: str, sender: str) -> Verified:
        """The uid and gid of a decoded credential made for this ``challenge`` and ``sender``."""
        tag, _, rest = got.payload.decode(errors="replace").partition("\n")
        theirs, _, claimed = rest.partition("\n")
        if tag != PAYLOAD_TAG:
            raise AuthFailed("malformed", "the MUNGE credential's payload is not an xce handshake's")
        if theirs != challenge:
            raise AuthFailed("replayed", "credential replayed: it was made for another "
                                         "connection's challenge")
        if claimed != sender:
            raise AuthFailed("malformed", f"the MUNGE credential was made for {claimed[:80]!r}, "
                                          f"not for {sender!r}")
        return Verified(got.uid, got.gid)


def make(settings: AuthSettings) -> MungeAuth:
    """The method of ``settings`` (``[cluster] auth = "munge"``)."""
    return MungeAuth(settings.munge_socket)
