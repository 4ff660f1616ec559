"""Controller candidate lists: the one parser every client role uses.

A client is configured with the whole list of controller candidates (``"h1:7600,h2:7600,
[::1]:7600"``) or, for a single controller, an address and a port. This module turns either
form into an ordered, validated, de-duplicated tuple of :class:`Candidate`, clamped to
:data:`N_MAX_MASTERS`. Every role calls :func:`parse_peers` (directly or through
:func:`candidates_from_config`), so every role rejects exactly the same bad input.
"""

from __future__ import annotations

from collections.abc import Mapping

from xcecore.protocol import AddressError, format_hostport, parse_hostport

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

N_MAX_MASTERS = 3
"""At most this many controller candidates: one primary and two live standbys."""

class CandidateError(AddressError):
    """A peers string or address/port is malformed; the message names the entry and why."""


class Candidate(tuple[str, int]):
    """One controller candidate address. ``host`` is unbracketed (``::1``, not ``[::1]``).

    A ``(host, port)`` tuple with named fields, written out rather than a dataclass or a
    ``typing.NamedTuple``: the one-shot commands import this module, and ``dataclasses``
    would cost them ~10 ms of start-up here, ``typing`` ~7 ms.
    """

    __slots__ = ()

    def __new__(cls, host: str, port: int) -> Candidate:
        return super().__new__(cls, (host, port))

    @property
    def host(self) -> str:
        return self[0]

    @property
    def port(self) -> int:
        return self[1]

    def __repr__(self) -> str:
        return f"Candidate(host={self[0]!r}, port={self[1]!r})"

    def __str__(self) -> str:
        return format_hostport(self.host, self.port)

    @property
    def address(self) -> str:
        """The ``host:port`` text, with IPv6 hosts bracketed; inverse of :func:`parse_address`."""
        return str(self)


def parse_address(entry: str) -> Candidate:
    """Parse one ``host:port`` or ``[ipv6]:port`` entry, raising :class:`CandidateError`.

    The rules are :func:`xcecore.protocol.parse_hostport`'s (port 1-65535).
    """
    try:
        host, port = parse_hostport(entry, what="candidate")
    except AddressError as exc:
        raise CandidateError(str(exc)) from None
    return Candidate(host, port)


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
        from loguru import logger  # only here: the one-shot commands never import loguru

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
