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
    hosts = cli.call("hostinfo", {}, deadline=10)["hosts"]
    assert [h["name"] for h in hosts] == ["fx1"] and hosts[0]["max_slots"] == 2
    old, new = cluster.kill_primary()
    assert old == 0 and new in (1, 2) and cluster.state_of(new) == "primary"
    # The joined client re-joins the new primary through the core: its host is known there.
    assert worker.call("hello", deadline=10)["state"] == "primary"
    assert [h["name"] for h in cli.call("hostinfo", {}, deadline=10)["hosts"]] == ["fx1"]


def test_plugin_manager_fixture_registers_only_what_is_named(xce_plugin_manager: Any) -> None:
    from xcecore.hookspecs import hookimpl
    from xcecore.role import Role, RoleSpec

    class ProbeRole(Role):
        rejoin_points = frozenset({"hello"})

    class Probe:
        @hookimpl
        def xce_roles(self) -> list[RoleSpec]:
            return [RoleSpec("probe", ProbeRole)]

    pm = xce_plugin_manager(Probe())
    names = {i.name for i in pm.info()}
    assert {"rejoin", "resreq"} <= names and "worker" not in names
    assert list(pm.roles()) == ["probe"]
    assert {i.name for i in xce_plugin_manager(builtins=False).info()} == set()


def test_role_fixture_builds_the_object_as_xce_run_does(xce_plugin_manager: Any, xce_role: Any) -> None:
    """The guide's unit-test recipe: a role object from a config dict, no connection."""
    from xce_auditor import plugin

    from xcecore.config import ConfigError
    from xcecore.hookspecs import hookimpl
    from xcecore.records import ConfigSection, Field
    from xcecore.role import Role, RoleSpec

    pm = xce_plugin_manager(plugin)
    role = xce_role(pm, "auditor", {"auditor": {"log_file": "/tmp/x/audit.jsonl"}})
    assert role.join_attributes() == {"log_file": "/tmp/x/audit.jsonl"}
    assert role.ctx.identity.startswith("auditor@") and role.ctx.client is None

    class Needy:
        @hookimpl
        def xce_roles(self) -> list[RoleSpec]:
            return [RoleSpec("needy", Role)]

        @hookimpl
        def xce_config_sections(self) -> list[ConfigSection]:
            return [ConfigSection("needy", {"token": Field((str,), required=True, doc="API token")})]

    pm = xce_plugin_manager(Needy())
    with pytest.raises(ConfigError, match="needy.token is required: API token"):
        xce_role(pm, "needy")
    assert xce_role(pm, "needy", {"needy": {"token": "t"}}).ctx.section == {"token": "t"}
