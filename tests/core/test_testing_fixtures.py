"""The pytest plugin's fixtures, as a role author uses them."""

from __future__ import annotations

from typing import Any

import pytest

from xcecore.testing.cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


def test_joined_client_fixture_and_kill_primary(xce_cluster: Any, xce_client: Any) -> None:
    cluster: LocalCluster = xce_cluster(3)
    worker = xce_client(cluster, "worker", hname="fx1", ncpus=2)
    cli = xce_client(cluster, "cli", join=False)
    hosts = cli.call("hostinfo", {"user": "t"}, deadline=10)["hosts"]
    assert [h["name"] for h in hosts] == ["fx1"] and hosts[0]["max_slots"] == 2
    old, new = cluster.kill_primary()
    assert old == 0 and new in (1, 2) and cluster.state_of(new) == "primary"
    # The joined client re-joins the new primary through the core: its host is known there.
    assert worker.call("hello", deadline=10)["state"] == "primary"
    assert [h["name"] for h in cli.call("hostinfo", {"user": "t"}, deadline=10)["hosts"]] == ["fx1"]


def test_plugin_manager_fixture_registers_only_what_is_named(xce_plugin_manager: Any) -> None:
    class Probe:
        from xcecore.hookspecs import hookimpl

        @hookimpl
        def xce_rejoin_points(self, role: str) -> list[str] | None:
            return ["hello"] if role == "probe" else None

    pm = xce_plugin_manager(Probe())
    names = {i.name for i in pm.info()}
    assert {"rejoin", "resreq"} <= names and "worker" not in names
    assert pm.rejoin_points("probe") == frozenset({"hello"})
    assert {i.name for i in xce_plugin_manager(builtins=False).info()} == set()
