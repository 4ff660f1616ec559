"""A small cluster CA and host certificates, for test clusters and small sites (``xce tls init``).

EC P-256 keys (a TLS 1.3 handshake with them costs a fraction of an RSA one), SHA-256
signatures. A host certificate names its host names and IP addresses as subject alternative
names (what a client checks against the candidate address it dialled) and serves both as a
server certificate (candidates, API servers) and as a client certificate (daemons). Private
keys are written mode 0600, never over an existing file.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


class CertError(ValueError):
    """A certificate cannot be made as asked (the message says why)."""


class HostFiles(NamedTuple):
    """The files of one host's certificate."""

    cert: Path
    key: Path


def _write(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise CertError(f"{path} already exists; not overwriting it") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def _window(days: float, not_before: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    return start, start + dt.timedelta(days=days)


def make_ca(directory: Path, *, name: str = "xce cluster CA", days: float = 3650) -> Path:
    """Write ``ca.pem`` and ``ca-key.pem`` (0600) in ``directory``; the certificate's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start, end = _window(days, None)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY, _pem_key(key), 0o600)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return directory / CA_CERT


def _san(names: Sequence[str]) -> list[Any]:
    from cryptography import x509

    out: list[Any] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name.strip("[]"))))
        except ValueError:
            if not name or any(c in name for c in " /:@"):
                raise CertError(f"{name!r} is neither a host name nor an IP address") from None
            out.append(x509.DNSName(name))
    return out


def make_host(directory: Path, name: str, hosts: Sequence[str], *, days: float = 825,
              not_before: dt.datetime | None = None) -> HostFiles:
    """A certificate for ``hosts`` (names and IP addresses) signed by the CA in ``directory``:
    ``NAME.pem`` and ``NAME-key.pem`` (0600). ``not_before``/``days`` set its validity (a
    test makes an expired one with a start in the past)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise CertError("a host certificate needs at least one host name or address")
    if not name or "/" in name or name.startswith("."):
        raise CertError(f"{name!r} cannot name a certificate file")
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    except FileNotFoundError as exc:
        raise CertError(f"no CA in {directory} ({exc.filename} is missing): "
                        "`xce tls init` makes one") from None
    key = _key()
    start, end = _window(days, not_before)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca.public_key()), critical=False)  # type: ignore[arg-type]
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    files = HostFiles(directory / f"{name}.pem", directory / f"{name}-key.pem")
    _write(files.key, _pem_key(key), 0o600)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return files


def default_hosts() -> list[str]:
    """This host's name, ``localhost`` and the loopback addresses."""
    import socket

    return list(dict.fromkeys([socket.gethostname(), "localhost", "127.0.0.1", "::1"]))


def not_after(path: Path) -> dt.datetime:
    """When the certificate in ``path`` expires."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc
