"""Meta-tests: every hook is documented in the plugin guide and exercised by a test."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from xce_controller import hookspecs as controller_hookspecs

from xcecore import hookspecs

ROOT = Path(__file__).resolve().parents[2]
# The core's hooks and those a distribution adds with xce_addhooks (the controller's).
SPEC_MODULES = (hookspecs, controller_hookspecs)
SPECS = {name: fn for module in SPEC_MODULES for name, fn in inspect.getmembers(module, inspect.isfunction)
         if name.startswith("xce_") and hasattr(fn, "xce_spec")}
HOOKS = sorted(SPECS)
pytestmark = pytest.mark.timeout(30)


def test_hooks_exist() -> None:
    assert len(HOOKS) >= 10
    assert {"xce_addhooks", "xce_roles", "xce_controller_store"} <= set(HOOKS)
    # Role behaviour is the role object's, not a hook broadcast to every role.
    assert not {"xce_join_attributes", "xce_rejoin_points", "xce_monitors"} & set(HOOKS)
    assert not {"xce_controller_election", "xce_controller_store"} & {
        n for n, _ in inspect.getmembers(hookspecs, inspect.isfunction)}


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_contract_docstring(hook: str) -> None:
    doc = inspect.getdoc(SPECS[hook]) or ""
    assert len(doc) > 80, f"{hook} has no real contract"
    assert re.search(r"[Cc]alled|runs|arrive", doc), f"{hook}'s docstring does not say when it is called"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_in_the_plugin_guide(hook: str) -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text()
    assert f"`{hook}(" in guide, f"{hook} is missing from docs/plugins.md"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_exercised_by_a_test(hook: str) -> None:
    tests = [p for p in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("examples/*/tests/*.py")]
             if p.name != "test_meta.py"]
    facade = hook.removeprefix("xce_")
    used = [p for p in tests if hook in (text := p.read_text()) or f".{facade}(" in text]
    assert used, f"no test exercises {hook}"
