"""pytest plugin for role authors (``pytest11`` entry point): real clusters in tests.

Installing xce makes these fixtures available to any test session:

- ``xce_cluster``: a factory for a :class:`LocalCluster` — one to three controller candidates
  as real processes on free loopback ports sharing a temporary state directory, plus any
  role (``cluster.start_role("worker", 'worker.hname="n1"')``, each override a
  ``section.key=value`` in TOML syntax) as a real ``xce run`` process. Every process it
  started is killed (by pid) at teardown, also when the test fails.
- ``xce_client``: a factory for a client already joined to a cluster as a chosen role
  (``xce_client(cluster, "worker", hname="n1", ncpus=4)``), a blocking
  :class:`~xcecore.client.SyncClient` closed at teardown.
- ``xce_plugin_manager``: a factory for a plugin manager holding only the plugins a test
  names (objects or modules), for unit tests that mock hooks.
- ``xce_role``: a factory for a role's object built in-process, as ``xce run`` builds it
  (``xce_role(pm, "auditor", {"auditor": {"log_file": ...}})``), not connected: call its
  ``join_attributes()``, ``push(...)``, ``connection_state(...)`` directly.
- ``xce_munged``: a factory for a real ``munged`` with its own key, socket and files in a
  temporary directory (:class:`~xcecore.testing.munge.Munged`), for ``xce_cluster(...,
  auth="munge", munge_socket=daemon.socket)``. Needs root and munged.
- ``xce_faultbed``: a :class:`~xcecore.testing.faultbed.FaultBed` of simulated hosts (network
  namespaces) with its faults; ``bed.cluster(host)`` runs a cluster on it. Needs root: without
  it (or a tool) the test errors with a message naming what is missing, never skips. Every
  namespace, mount and process is removed at teardown, also when the test fails.

Which candidate is primary is read from the handshake each candidate answers with, so these
helpers do not depend on the client library they are used to test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from xcecore.testing.cluster import DEFAULT_KEY, LocalCluster, Proc, free_port, probe, wait_for

__all__ = ["DEFAULT_KEY", "LocalCluster", "Proc", "free_port", "probe", "wait_for"]


@pytest.fixture
def xce_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: ``xce_cluster(ncandidates=3, start=True, extra_config="", cluster_extra="",
    auth="key", munge_socket=None, tls=False, require_client_cert=False)``.

    ``extra_config`` is appended to the config file (whole tables); ``cluster_extra`` adds keys
    to its ``[cluster]`` table (e.g. ``resources = [...]``); ``auth = "munge"`` with the
    ``munge_socket`` of a running munged (``xce_munged``) makes a MUNGE cluster; ``tls``
    a TLS cluster (its CA and certificate in the cluster's ``tls_dir``).
    """
    made: list[LocalCluster] = []

    def make(ncandidates: int = 3, *, start: bool = True, extra_config: str = "",
             key: str | None = DEFAULT_KEY, cluster_extra: str = "", auth: str = "key",
             munge_socket: str | None = None, tls: bool = False,
             require_client_cert: bool = False) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(made)}", ncandidates, key, extra_config,
                               cluster_extra=cluster_extra, auth=auth, munge_socket=munge_socket,
                               tls=tls, require_client_cert=require_client_cert)
        made.append(cluster)
        if start:
            cluster.start()
        return cluster

    yield make
    failed = getattr(request.node, "rep_call", None)
    for cluster in made:
        if failed is not None and failed.failed:
            sys.stderr.write(cluster.logs())
        cluster.close()


@pytest.fixture
def xce_client() -> Iterator[Callable[..., Any]]:
    """Factory: ``xce_client(cluster, role, **attrs)`` -> a SyncClient joined as ``role``.

    ``attrs`` are the join attributes (a ``worker`` needs ``hname``); with ``join=False`` the
    client only connects (as the command line does).
    """
    from contextlib import ExitStack

    from xcecore.client import SyncClient
    from xcecore.runtime import client_config, load

    with ExitStack() as stack:

        def make(cluster: LocalCluster, role: str = "cli", *, join: bool = True, **attrs: Any) -> SyncClient:
            _, config = load(cluster.config_path)
            name = attrs.get("hname") or "test"
            cfg = client_config(config, f"{role}@{name}")
            client = stack.enter_context(SyncClient.open(cfg, role=role, join_attrs=attrs or None))
            if join:
                client.join(deadline=30)
            return client

        yield make


@pytest.fixture
def xce_plugin_manager() -> Callable[..., Any]:
    """Factory: a plugin manager with only the given plugins (objects or modules) registered."""
    from xcecore.plugins import PluginManager

    def make(*plugins: object, builtins: bool = True) -> PluginManager:
        import importlib

        from xcecore.plugins import BUILTINS

        pm = PluginManager()
        if builtins:
            for name, module in BUILTINS.items():
                pm.register(importlib.import_module(module), name)
        for i, plugin in enumerate(plugins):
            pm.register(plugin, getattr(plugin, "__name__", f"plugin{i}"))
        return pm

    return make


@pytest.fixture
def xce_role() -> Callable[..., Any]:
    """Factory: ``xce_role(pm, role, raw_config=None, client=None)`` -> the role's object.

    ``raw_config`` is the config file's content as a dict (validated against the manager's
    sections, as a file would be); ``client`` stands in for the connected client (a fake).
    """
    from xcecore.testing.roles import make_role

    return make_role


@pytest.fixture
def xce_faultbed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fault test bed in ``tmp_path``; closed (everything removed) at teardown."""
    from xcecore.testing.faultbed import FaultBed

    bed = FaultBed(tmp_path / "bed")
    if bed.stale_removed:
        sys.stderr.write("fault bed: removed leftovers of an earlier run: "
                         + "; ".join(bed.stale_removed) + "\n")
    try:
        yield bed
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            for cluster in bed.clusters:
                sys.stderr.write(cluster.logs())
        bed.close()


@pytest.fixture
def xce_munged() -> Iterator[Callable[..., Any]]:
    """Factory: ``xce_munged(key=None)`` -> a started :class:`~xcecore.testing.munge.Munged`
    (a real munged with its own key and socket in a directory every user may enter), stopped
    by its pid and removed at teardown. Needs root and munged: errors naming them otherwise."""
    import shutil

    from xcecore.testing.munge import Munged, shared_dir

    made: list[Munged] = []
    root = shared_dir("xce-munged-")

    def make(key: bytes | None = None) -> Munged:
        daemon = Munged(root / f"munged{len(made)}", key=key)
        made.append(daemon)
        return daemon.start()

    try:
        yield make
    finally:
        for daemon in made:
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can print logs of failed tests."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
