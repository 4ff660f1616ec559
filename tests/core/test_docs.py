"""The docs stay true to the code: the config reference is generated, and the pages exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from xcecore.config import CORE_SECTIONS, reference_markdown
from xcecore.plugins import PluginManager

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def test_configuration_reference_matches_the_code() -> None:
    pm = PluginManager.load({})
    expected = reference_markdown([*CORE_SECTIONS, *pm.config_sections()])
    assert (ROOT / "docs" / "configuration.md").read_text() == expected, (
        "docs/configuration.md is stale: run `xce config reference > docs/configuration.md`")


def test_every_config_key_is_documented_with_a_meaning() -> None:
    pm = PluginManager.load({})
    for sec in [*CORE_SECTIONS, *pm.config_sections()]:
        for key, field in sec.fields.items():
            assert field.doc, f"{sec.name}.{key} has no meaning in its Field(doc=...)"


def test_config_check_command(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cluster]\npeers = "127.0.0.1:7600"\n')
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "config", "check"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and '"liveness_timeout": 2.0' in res.stdout
    cfg.write_text('[cluster]\nprot = 1\n')
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "config", "check"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "unknown key cluster.prot" in res.stderr


@pytest.mark.parametrize("page", ["architecture.md", "plugins.md", "operator.md", "rest.md", "protocol.md",
                                  "protocol-ops.md", "configuration.md", "resreq.md", "accounting.md"])
def test_doc_pages_exist_and_link_to_real_files(page: str) -> None:
    import re

    text = (ROOT / "docs" / page).read_text()
    for target in re.findall(r"\]\(([^)#:]+\.md)\)", text):
        assert (ROOT / "docs" / target).exists(), f"{page} links to missing {target}"


@pytest.mark.parametrize("name", ["single.toml", "three-on-one-host.toml", "three-hosts.toml"])
def test_example_configs_are_valid(name: str) -> None:
    from xcecore.candidates import candidates_from_config
    from xcecore.runtime import load

    _, config = load(ROOT / "examples" / "configs" / name)
    assert candidates_from_config(config.cluster)
