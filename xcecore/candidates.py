"""Controller candidate lists: the one parser every client role uses.

A client is configured with the whole list of controller candidates (``"h1:7600,h2:7600,
[::1]:7600"``) or, for a single controller, an address and a port. This module turns either
form into an ordered, validated, de-duplicated tuple of :class:`Candidate`, clamped to
:data:`N_MAX_MASTERS`. Every role calls :func:`parse_peers` (directly or through
:func:`candidates_from_config`), so every role rejects exactly the same bad input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loguru import logger

N_MAX_MASTERS = 3
"""At most this many controller candidates: one primary and two live standbys."""

# A hostname label: letters, digits, hyphen, underscore (common in lab names); dots join labels.
_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")


class CandidateError(ValueError):
    """A peers string or address/port is malformed; the message names the entry and why."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One controller candidate address. ``host`` is unbracketed (``::1``, not ``[::1]``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """The ``host:port`` text, with IPv6 hosts bracketed; inverse of :func:`parse_address`."""
        return str(self)


def _check_port(text: str, entry: str) -> int:
    if not text:
        raise CandidateError(f"candidate {entry!r}: missing port after ':'")
    if not text.isdigit():
        raise CandidateError(f"candidate {entry!r}: port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise CandidateError(f"candidate {entry!r}: port {port} is out of range 1-65535")
    return port


def _check_host(host: str, entry: str) -> str:
    if not host:
        raise CandidateError(f"candidate {entry!r}: empty host")
    if not _HOST_RE.match(host) or ".." in host:
        raise CandidateError(f"candidate {entry!r}: {host!r} is not a valid host name or address")
    return host


def parse_address(entry: str) -> Candidate:
    """Parse one ``host:port`` or ``[ipv6]:port`` entry, raising :class:`CandidateError`."""
    text = entry.strip()
    if not text:
        raise CandidateError("empty candidate entry")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise CandidateError(f"candidate {entry!r}: '[' without a closing ']'")
        host, rest = text[1:close], text[close + 1 :]
        if not host:
            raise CandidateError(f"candidate {entry!r}: empty host between brackets")
        if ":" not in host:
            raise CandidateError(f"candidate {entry!r}: brackets are only for IPv6 addresses")
        if not re.fullmatch(r"[0-9A-Fa-f:.%a-zA-Z]+", host):
            raise CandidateError(f"candidate {entry!r}: {host!r} is not an IPv6 address")
        if not rest.startswith(":"):
            raise CandidateError(f"candidate {entry!r}: missing ':port' after ']'")
        return Candidate(host, _check_port(rest[1:], entry))
    if "]" in text:
        raise CandidateError(f"candidate {entry!r}: ']' without an opening '['")
    if text.count(":") > 1:
        raise CandidateError(f"candidate {entry!r}: IPv6 addresses must be bracketed, as [::1]:7600")
    if ":" not in text:
        raise CandidateError(f"candidate {entry!r}: missing ':port'")
    host, _, port = text.partition(":")
    return Candidate(_check_host(host, entry), _check_port(port, entry))


def parse_peers(
    peers: str | None = None,
    *,
    address: str | None = None,
    port: int | None = None,
) -> tuple[Candidate, ...]:
    """Return the ordered controller candidates from a peers string or an address/port.

    ``peers`` wins when it is given (not None); otherwise ``address`` and ``port`` give the one
    candidate. Entries keep their order; more than :data:`N_MAX_MASTERS` are clamped with one
    WARN naming what was dropped. An empty list, a malformed entry (missing or bad port, empty
    host, bad brackets, stray separators) or a duplicate raises :class:`CandidateError` naming
    the entry and what is wrong.
    """
    if peers is None:
        if address is None and port is None:
            raise CandidateError("no controller candidates: set 'peers' or 'address' and 'port'")
        if address is None or port is None:
            missing = "address" if address is None else "port"
            raise CandidateError(f"single-controller configuration is missing {missing!r}")
        host = address[1:-1] if address.startswith("[") and address.endswith("]") else address
        return (parse_address(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"),)
    if not isinstance(peers, str):
        raise CandidateError(f"peers must be a string like 'h1:7600,h2:7600', not {peers!r}")
    if not peers.strip():
        raise CandidateError("peers is empty: list at least one controller candidate")
    entries = peers.split(",")
    found: list[Candidate] = []
    for index, raw in enumerate(entries):
        if not raw.strip():
            where = "leading" if index == 0 else "trailing" if index == len(entries) - 1 else "double"
            raise CandidateError(f"peers {peers!r}: stray {where} ',' (empty entry #{index + 1})")
        cand = parse_address(raw)
        if cand in found:
            raise CandidateError(f"peers {peers!r}: candidate {cand} is listed twice")
        found.append(cand)
    if len(found) > N_MAX_MASTERS:
        dropped = ", ".join(str(c) for c in found[N_MAX_MASTERS:])
        logger.warning(
            "candidates: {} listed, at most {} are used; dropping {}",
            len(found), N_MAX_MASTERS, dropped,
        )
        found = found[:N_MAX_MASTERS]
    return tuple(found)


def candidates_from_config(cluster: Mapping[str, Any]) -> tuple[Candidate, ...]:
    """Candidates from a ``[cluster]`` config mapping (``peers``, or ``address`` + ``port``)."""
    peers = cluster.get("peers")
    if peers is not None and not isinstance(peers, str):
        # A TOML list of "host:port" strings is accepted as well as one string.
        if isinstance(peers, list) and all(isinstance(p, str) for p in peers):
            peers = ",".join(peers)
        else:
            raise CandidateError(f"cluster.peers must be a string or a list of strings: {peers!r}")
    return parse_peers(peers, address=cluster.get("address"), port=cluster.get("port"))
