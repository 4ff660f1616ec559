"""The built-in ``resreq`` plugin answers the ``xce_resreq_evaluator`` hook."""

from __future__ import annotations

import pytest

from xcecore.resreq import Evaluator, ResourceRegistry

pytestmark = pytest.mark.timeout(60)

hookspecs = pytest.importorskip("xcecore.hookspecs")


def test_plugin_function_returns_default_evaluator() -> None:
    from xcecore.resreq import plugin

    reg = ResourceRegistry([{"name": "gpu", "type": "bool"}])
    ev = plugin.xce_resreq_evaluator(reg)
    assert isinstance(ev, Evaluator) and ev.registry is reg
    assert [m.name for m in ev.select("gpu", [{"hname": "a", "gpu": True}, {"hname": "b"}])] == ["a"]


def test_plugin_through_pluggy() -> None:
    import pluggy

    from xcecore.resreq import plugin

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="resreq")
    reg = ResourceRegistry()
    ev = pm.hook.xce_resreq_evaluator(registry=reg)
    assert isinstance(ev, Evaluator) and ev.registry is reg

    class Override:
        @hookspecs.hookimpl
        def xce_resreq_evaluator(self, registry: ResourceRegistry) -> str:
            return "site"

    pm.register(Override(), name="site")
    assert pm.hook.xce_resreq_evaluator(registry=reg) == "site"  # trylast: site plugins win
