"""TLS on the wire: the ``[tls]`` keys, the contexts made from them, and the one handshake.

Every connection between a role (or a command) and a controller candidate becomes TLS in one
place: :func:`handshake` for anyio streams (the event-loop client and the candidate's
listener, ``server_side`` telling which) and :func:`wrap_socket` for the one-shot commands'
blocking socket. Both use a :class:`TLS` made once from ``[tls]`` by :func:`client_tls` or
:func:`server_tls`. ``[tls] ca`` set means TLS on; unset, the wire is plain TCP (the embedded
single-user cluster, on loopback).

A failed handshake is described by :func:`describe` in an operator's words, naming the peer
and the problem ("controller 10.0.0.1:7600's certificate has expired"), on both sides: the
side that refuses sends its TLS alert before closing (anyio's own wrapper drops it), so the
other side can say why too ("controller 10.0.0.1:7600 refused our certificate: it has
expired").

Cheap to import (the one-shot commands do): ``ssl`` and anyio are imported when used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    import socket
    import ssl
    from typing import Any

    from anyio.abc import ByteStream
    from anyio.streams.tls import TLSStream

KeySpec = tuple[tuple[type, ...], "Any", str]

TLS_KEYS: dict[str, KeySpec] = {
    "ca": ((str,), None, "PEM file of the cluster CA; set, every connection to a controller "
                         "candidate is TLS and the REST API is HTTPS (`xce tls init` makes one)"),
    "cert": ((str,), None, "this host's certificate (PEM, leaf first): a candidate's and the "
                           "API server's server certificate; a daemon's client certificate"),
    "key": ((str,), None, "the private key of `cert` (PEM; mode 0600)"),
    "require_client_cert": ((bool,), False, "candidates and the API server refuse a client "
                                            "without a certificate signed by `ca` (daemons and "
                                            "users then need `cert` and `key`); off, none is "
                                            "asked for"),
    "rest": ((bool,), True, "serve the REST API over HTTPS with `cert` and `key` when `ca` is "
                            "set (false: plain HTTP, e.g. behind a TLS-terminating proxy)"),
}
"""Every key of ``[tls]``."""


class TLSConfigError(ValueError):
    """``[tls]`` names a file that is missing or not what it should be (the message says)."""


class TLSFailed(Exception):
    """A TLS handshake failed for a reason worth telling (a certificate, not an outage)."""


def check_section(values: Mapping[str, Any]) -> None:
    """The ``[tls]`` section's own consistency (files are read when a context is made)."""
    if (values.get("cert") is None) != (values.get("key") is None):
        raise ValueError("cert and key go together: set both or neither")
    if values.get("cert") is not None and values.get("ca") is None:
        raise ValueError("cert is set but ca is not: TLS is on only with ca")


class TLS:
    """A ready ``ssl.SSLContext`` and where its files came from (for messages)."""

    __slots__ = ("ca", "cert", "context", "server_side")

    def __init__(self, context: ssl.SSLContext, *, ca: str, cert: str | None,
                 server_side: bool) -> None:
        self.context = context
        self.ca = ca
        self.cert = cert
        self.server_side = server_side

    def _key(self) -> tuple[Any, ...]:
        return (self.ca, self.cert, self.server_side, self.context.verify_mode)

    def __eq__(self, other: object) -> bool:
        """Made from the same files the same way (a configuration read again compares equal)."""
        return isinstance(other, TLS) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"TLS(ca={self.ca!r}, cert={self.cert!r}, server_side={self.server_side})"


def enabled(section: Mapping[str, Any] | None) -> bool:
    """Whether ``[tls]`` turns TLS on (``ca`` is set)."""
    return bool(section) and section.get("ca") is not None  # type: ignore[union-attr]


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    import ssl

    for what, path in (("tls.cert", cert), ("tls.key", key)):
        if not os.path.exists(path):
            raise TLSConfigError(f"{what} {path!r} does not exist")
    try:
        ctx.load_cert_chain(cert, key)
    except PermissionError:
        raise
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"tls.cert {cert!r} with tls.key {key!r} cannot be loaded "
                             f"(not PEM, or the key is not the certificate's): {exc}") from None


def _context(section: Mapping[str, Any], *, server_side: bool) -> ssl.SSLContext:
    import ssl

    ca = section["ca"]
    purpose = ssl.Purpose.CLIENT_AUTH if server_side else ssl.Purpose.SERVER_AUTH
    if not os.path.exists(ca):
        raise TLSConfigError(f"tls.ca {ca!r} does not exist")
    try:
        ctx = ssl.create_default_context(purpose, cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"tls.ca {ca!r} is not a PEM CA certificate: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def client_tls(section: Mapping[str, Any] | None) -> TLS | None:
    """The client side's TLS from ``[tls]`` (None: TLS is off).

    The client certificate is presented, when a candidate asks for one
    (``require_client_cert``), if ``cert`` and ``key`` are set and readable: a daemon's key is
    readable by its service user only, and a user's command that cannot read it connects
    without one (the candidate then says it wants one).
    Raises :class:`TLSConfigError` naming a missing or broken file.
    """
    if section is None or not enabled(section):
        return None
    ctx = _context(section, server_side=False)
    cert, key = section.get("cert"), section.get("key")
    used = None
    if cert is not None and key is not None:
        try:
            _load_chain(ctx, cert, key)
            used = cert
        except PermissionError:
            pass  # not this user's key: no client certificate (see the docstring)
    return TLS(ctx, ca=section["ca"], cert=used, server_side=False)


def server_tls(section: Mapping[str, Any] | None, *, what: str) -> TLS | None:
    """The server side's TLS from ``[tls]`` (None: off); ``what`` names the server in errors.

    Needs ``cert`` and ``key``; with ``require_client_cert`` a client must present a
    certificate signed by ``ca`` (otherwise none is asked for).
    """
    if section is None or not enabled(section):
        return None
    import ssl

    cert, key = section.get("cert"), section.get("key")
    if cert is None or key is None:
        raise TLSConfigError(f"{what} needs tls.cert and tls.key when tls.ca is set "
                             "(`xce tls init` makes them)")
    ctx = _context(section, server_side=True)
    try:
        _load_chain(ctx, cert, key)
    except PermissionError as exc:
        raise TLSConfigError(f"tls.key {key!r} cannot be read by this user: {exc}") from None
    # A client certificate is asked for only when it is required: nothing else uses it, and
    # sending and checking one costs a handshake ~40% more (a failover is many handshakes).
    ctx.verify_mode = ssl.CERT_REQUIRED if section.get("require_client_cert") else ssl.CERT_NONE
    # No TLS 1.3 session tickets: no client resumes (a failover reaches another candidate,
    # which could not read them), and making and sending two per handshake costs ~15%.
    ctx.num_tickets = 0
    return TLS(ctx, ca=section["ca"], cert=cert, server_side=True)


# ----------------------------------------------------------------------------- messages

_VERIFY = {
    9: "certificate is not valid yet (check the clocks)",
    10: "certificate has expired",
    18: "certificate is self-signed, not signed by the CA in tls.ca ({ca})",
    19: "certificate is not signed by the CA in tls.ca ({ca})",
    20: "certificate is not signed by the CA in tls.ca ({ca})",
    21: "certificate is not signed by the CA in tls.ca ({ca})",
    2: "certificate is not signed by the CA in tls.ca ({ca})",
}
"""OpenSSL verify codes (X509_V_ERR_*) -> what they mean here."""

_ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "refused our certificate: it is not signed by a CA it trusts "
                              "(its tls.ca is another CA's)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "refused our certificate: it has expired",
    "SSLV3_ALERT_BAD_CERTIFICATE": "refused our certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "refused our certificate",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "requires a client certificate (set tls.cert and "
                                         "tls.key to one signed by its CA)",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "refused the TLS handshake (no common protocol or cipher)",
    "WRONG_VERSION_NUMBER": "does not speak TLS (is [tls] set on both sides?)",
    "HTTP_REQUEST": "does not speak TLS (is [tls] set on both sides?)",
    "UNKNOWN_PROTOCOL": "does not speak TLS (is [tls] set on both sides?)",
    "RECORD_LAYER_FAILURE": "does not speak TLS (is [tls] set on both sides?)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "sent no client certificate (tls.require_client_cert "
                                         "is on)",
}
"""OpenSSL reasons of a failed handshake -> what they mean here."""


def describe(exc: BaseException, peer: str, tls: TLS) -> str:
    """What went wrong with the TLS handshake with ``peer`` ("controller h:7600", "client
    10.0.0.5:40312"), from the ``ssl`` error ``exc``, in an operator's words."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        whose = "'s client" if tls.server_side else "'s"
        if code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH / 64 IP mismatch
            return f"{peer}'s certificate is not for that address ({exc.verify_message})"
        if code == 64:
            return f"{peer}'s certificate is not for that address ({exc.verify_message})"
        text = _VERIFY.get(code)
        if text is not None:
            return f"{peer}{whose} {text.format(ca=tls.ca)}"
        return f"{peer}{whose} certificate was refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or ""
        text = _ALERTS.get(reason)
        if text is not None:
            return f"{peer} {text}"
        return f"TLS handshake with {peer} failed: {reason or exc}"
    return f"TLS handshake with {peer} failed: {exc}"


# ----------------------------------------------------------------------------- handshakes


async def handshake(stream: ByteStream, tls: TLS, *, peer: str,
                    hostname: str | None = None) -> TLSStream:
    """``stream`` made TLS: the handshake, as client (``hostname`` checked against the peer's
    certificate) or server (``tls.server_side``).

    Raises :class:`TLSFailed` (described) when a certificate or the protocol is refused,
    either way -- after sending the TLS alert that tells the peer why -- and anyio's
    ``EndOfStream`` / ``BrokenResourceError`` when the peer goes away meanwhile (an outage,
    not a refusal). The caller bounds the time.
    """
    import ssl

    import anyio
    from anyio.streams.tls import TLSStream

    bio_in, bio_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = tls.context.wrap_bio(bio_in, bio_out, server_side=tls.server_side,
                               server_hostname=None if tls.server_side else hostname)
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            if bio_out.pending:
                await stream.send(bio_out.read())
            try:
                data = await stream.receive()
            except anyio.EndOfStream:
                raise anyio.EndOfStream from None
            bio_in.write(data)
        except (ssl.SSLEOFError, ssl.SSLSyscallError):
            raise anyio.EndOfStream from None
        except ssl.SSLError as exc:
            if bio_out.pending:  # the alert: the peer learns why, not just that we closed
                try:
                    with anyio.move_on_after(1):
                        await stream.send(bio_out.read())
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
            raise TLSFailed(describe(exc, peer, tls)) from exc
    if bio_out.pending:
        await stream.send(bio_out.read())
    # The stream wrapper anyio's TLSStream.wrap would build around the same objects.
    return TLSStream(transport_stream=stream, standard_compatible=False, _ssl_object=obj,
                     _read_bio=bio_in, _write_bio=bio_out)


def wrap_socket(sock: socket.socket, tls: TLS, *, peer: str, hostname: str) -> ssl.SSLSocket:
    """The blocking client's ``sock`` made TLS (within the socket's timeout).

    Raises :class:`TLSFailed` (described) for a refused certificate or protocol,
    ``ConnectionError`` when the peer goes away, ``TimeoutError`` past the timeout.
    """
    import ssl

    try:
        return tls.context.wrap_socket(sock, server_hostname=hostname)
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        raise ConnectionError("closed by the controller during the TLS handshake") from None
    except ssl.SSLError as exc:
        raise TLSFailed(describe(exc, peer, tls)) from exc


def raw_socket(stream: Any) -> Any:
    """The socket under ``stream`` for :func:`xcecore.wire.write_now`, or None on a TLS stream
    (a frame written straight to its socket would bypass the encryption)."""
    from anyio.abc import SocketAttribute
    from anyio.streams.tls import TLSAttribute

    if stream.extra(TLSAttribute.ssl_object, None) is not None:
        return None
    return stream.extra(SocketAttribute.raw_socket, None)
