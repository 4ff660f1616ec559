"""Fixtures of the etcd backend's tests: real etcd members, stopped by pid."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from xce_etcd.testing import EtcdCluster

_ports = itertools.count(0)


@pytest.fixture
def etcd_one(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """A one-member etcd on loopback (data in a temp dir), started."""
    # Ports above the system etcd's (2379/2380) and apart per test of one session.
    base = 23790 + (next(_ports) % 50) * 4
    cluster = EtcdCluster(tmp_path / "etcd", ["127.0.0.1"], client_port=base, peer_port=base + 1)
    try:
        cluster.start()
        yield cluster
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            sys.stderr.write(cluster.logs())
        cluster.stop()


@pytest.fixture
def etcd_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., EtcdCluster]]:
    """Factory: ``etcd_factory(addrs, netns=[...], extra=(...))`` -> an EtcdCluster, not
    started; every one made is stopped (by pid) at the end."""
    made: list[EtcdCluster] = []

    def make(addrs: list[str], netns: list[str | None] | None = None, extra: tuple[str, ...] = (),
             client_port: int = 2379, peer_port: int = 2380) -> EtcdCluster:
        c = EtcdCluster(tmp_path / f"etcd{len(made)}", addrs, list(netns or []),
                        client_port=client_port, peer_port=peer_port, extra=extra)
        made.append(c)
        return c

    try:
        yield make
    finally:
        failed = getattr(request.node, "rep_call", None)
        for c in made:
            if failed is not None and failed.failed:
                sys.stderr.write(c.logs())
            c.stop()
