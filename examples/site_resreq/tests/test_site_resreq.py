"""The example site evaluator: through the hook, wrapping the built-in, selected by config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import xce_site_resreq.plugin as site

from xcecore.resreq import Evaluator, ResourceRegistry, ResreqError
from xcecore.runtime import load

pytestmark = pytest.mark.timeout(60)

HOSTS = [
    {"hname": "busy", "status": "ok", "ncpus": 2, "r1m": 1.8, "mem": 8000},
    {"hname": "idle", "status": "ok", "ncpus": 8, "r1m": 0.8, "mem": 4000},
    {"hname": "mute", "status": "ok", "ncpus": 4, "mem": 9000},  # no load reported: unknown
]
DECLARED = ResourceRegistry([site.DECLARATION, {"name": "gpu", "type": "bool"}])


def test_the_hook_prefers_the_site_evaluator_when_declared(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(site)
    ev = pm.resreq_evaluator(DECLARED)
    assert isinstance(ev, site.SiteEvaluator)
    assert [m.name for m in ev.select("select[load_per_cpu < 0.5]", HOSTS)] == ["idle"]
    # order[load_per_cpu]: smaller is better; an unknown value sorts last
    assert [m.name for m in ev.select("order[load_per_cpu]", HOSTS)] == ["idle", "busy", "mute"]
    assert [m.name for m in ev.select("select[!gpu && mem > 5000]", HOSTS)] == ["busy", "mute"]
    assert ev.compile("select[load_per_cpu < 0.5]").predicate(HOSTS[1]) is True


def test_undeclared_means_the_builtin_answers(xce_plugin_manager: Any) -> None:
    pm = xce_plugin_manager(site)
    ev = pm.resreq_evaluator(ResourceRegistry())
    assert type(ev) is Evaluator
    with pytest.raises(ResreqError) as err:
        ev.compile("select[load_per_cpu < 0.5]")
    assert err.value.code == "UNKNOWN_RESOURCE"


def test_selected_by_configuration(tmp_path: Path) -> None:
    declare = '[cluster]\nresources = [{ name = "load_per_cpu", type = "numeric", increasing = false }]\n'
    on = tmp_path / "on.toml"
    on.write_text(declare)
    off = tmp_path / "off.toml"
    off.write_text(declare + '[plugins]\ndisable = ["site_resreq"]\n')
    pm_on, cfg_on = load(on)
    pm_off, cfg_off = load(off)
    ev_on = pm_on.resreq_evaluator(ResourceRegistry(cfg_on.cluster["resources"]))
    ev_off = pm_off.resreq_evaluator(ResourceRegistry(cfg_off.cluster["resources"]))
    assert isinstance(ev_on, site.SiteEvaluator)
    assert type(ev_off) is Evaluator
    assert "site_resreq" in {i.name for i in pm_on.info()}
    assert "site_resreq" not in {i.name for i in pm_off.info()}
    # Blocked, the declared name is valid but never known: nothing qualifies.
    assert [m.name for m in ev_on.select("select[load_per_cpu < 0.5]", HOSTS)] == ["idle"]
    assert ev_off.select("select[load_per_cpu < 0.5]", HOSTS) == []
