"""The ``[etcd]`` config section and the settings built from it (every default written once, here)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from xcecore.records import ConfigSection, Field

DEFAULT_LEASE_TTL = 1.0
DEFAULT_MAX_TXN_OPS = 16384
"""Operations per transaction; etcd must run with ``--max-txn-ops`` at least this."""
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Bytes per transaction; etcd must run with ``--max-request-bytes`` at least this."""


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """What the election and the store need from ``[etcd]``."""

    endpoints: tuple[str, ...]
    prefix: str = "/xce"
    lease_ttl: float = DEFAULT_LEASE_TTL
    safety_margin: float = 0.1
    drift: float = 0.01
    request_timeout: float = 1.0
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    transport: str = "grpc"
    local_member: str = "auto"

    @property
    def grant_ttl(self) -> int:
        """The TTL asked of etcd: whole seconds (etcd's unit), at least 1."""
        return max(1, math.ceil(self.lease_ttl))


def check_etcd_section(section: dict[str, Any]) -> None:
    """The ``check`` of ``[etcd]``: URLs, positive numbers, a margin shorter than the TTL."""
    endpoints = section.get("endpoints")
    if endpoints is not None:
        if not isinstance(endpoints, list) or not endpoints:
            raise ValueError("etcd.endpoints must be a non-empty list of URLs")
        for e in endpoints:
            parts = urlsplit(e) if isinstance(e, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"etcd.endpoints: {e!r} is not an http:// or https:// URL")
    prefix = section["prefix"]
    if not prefix.startswith("/") or prefix.endswith("/") or len(prefix) < 2:
        raise ValueError(f"etcd.prefix must start with / and not end with one, got {prefix!r}")
    for key in ("lease_ttl", "request_timeout"):
        if not section[key] > 0:
            raise ValueError(f"etcd.{key} must be > 0, got {section[key]!r}")
    if not 0 <= section["safety_margin"] < section["lease_ttl"] / 2:
        raise ValueError(f"etcd.safety_margin must be >= 0 and below half of lease_ttl, got "
                         f"{section['safety_margin']!r}")
    if section["lease_ttl"] != math.ceil(section["lease_ttl"]):
        raise ValueError(f"etcd.lease_ttl is in whole seconds (etcd's unit), got {section['lease_ttl']!r}")
    for key in ("max_txn_ops", "max_request_bytes"):
        if section[key] < 16:
            raise ValueError(f"etcd.{key} must be >= 16, got {section[key]!r}")
    if section.get("transport", "grpc") not in ("grpc", "gateway"):
        raise ValueError(f"etcd.transport must be \"grpc\" or \"gateway\", got {section['transport']!r}")
    local = section.get("local_member", "auto")
    if local not in ("auto", "none") and (not isinstance(endpoints, list) or local.rstrip("/") not in
                                          (e.rstrip("/") for e in endpoints)):
        raise ValueError(f"etcd.local_member must be \"auto\", \"none\" or one of etcd.endpoints, "
                         f"got {local!r}")
    if bool(section.get("cert_file")) != bool(section.get("key_file")):
        raise ValueError("etcd.cert_file and etcd.key_file go together (client certificate)")


_NUM = (float, int)
SECTION = ConfigSection(
    "etcd",
    {
        "endpoints": Field((list,), None, "etcd client URLs (http:// or https://), every member",
                           required=True),
        "prefix": Field((str,), "/xce", "key prefix of this cluster's keys in etcd"),
        "lease_ttl": Field(_NUM, DEFAULT_LEASE_TTL,
                           "seconds of the candidates' leases (whole seconds; etcd needs "
                           "--election-timeout <= 2/3 of it, see docs/operator.md)"),
        "safety_margin": Field(_NUM, 0.1, "seconds before its lease could expire at which a "
                               "primary stops acknowledging writes"),
        "request_timeout": Field(_NUM, 1.0, "seconds an etcd request may take"),
        "max_txn_ops": Field((int,), DEFAULT_MAX_TXN_OPS, "operations per transaction "
                             "(etcd's --max-txn-ops must be at least this)"),
        "max_request_bytes": Field((int,), DEFAULT_MAX_REQUEST_BYTES, "bytes per transaction "
                                   "(etcd's --max-request-bytes must be at least this)"),
        "ca_file": Field((str,), None, "CA bundle that signs etcd's server certificates (TLS)"),
        "cert_file": Field((str,), None, "client certificate for etcd (TLS client auth)"),
        "key_file": Field((str,), None, "client certificate's key"),
        "transport": Field((str,), "grpc", "how the store's write transactions go to etcd: "
                           "\"grpc\" (etcd's gRPC API) or \"gateway\" (its JSON gateway, as "
                           "everything else)"),
        "local_member": Field((str,), "auto", "the etcd member on this candidate's host (one of "
                              "endpoints): a primary moves raft leadership off it, so losing its "
                              "host costs one lease TTL; \"auto\": the endpoint whose host is "
                              "the candidate's advertised host; \"none\": off"),
    },
    "the etcd backend of the controller ([controller] backend = \"etcd\")",
    check=check_etcd_section,
)


def settings_from(section: Mapping[str, Any]) -> EtcdSettings:
    """:class:`EtcdSettings` from a validated ``[etcd]`` section."""
    endpoints = section.get("endpoints")
    if not endpoints:
        raise ValueError("etcd.endpoints is required with [controller] backend = \"etcd\"")
    return EtcdSettings(
        endpoints=tuple(endpoints), prefix=section["prefix"], lease_ttl=float(section["lease_ttl"]),
        safety_margin=float(section["safety_margin"]),
        request_timeout=float(section["request_timeout"]), max_txn_ops=int(section["max_txn_ops"]),
        max_request_bytes=int(section["max_request_bytes"]), ca_file=section.get("ca_file"),
        cert_file=section.get("cert_file"), key_file=section.get("key_file"),
        transport=str(section.get("transport", "grpc")),
        local_member=str(section.get("local_member", "auto")))
