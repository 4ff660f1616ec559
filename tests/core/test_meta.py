"""Meta-tests: every hook is documented in the plugin guide and exercised by a test."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from xcecore import hookspecs

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted(name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("xce_"))
pytestmark = pytest.mark.timeout(30)


def test_hooks_exist() -> None:
    assert len(HOOKS) >= 12


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_contract_docstring(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
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
