"""Each distribution declares what it imports: a package imported from another xce distribution
is a dependency or an extra of the importer's pyproject.toml."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTS = {  # package -> (distribution, its folder)
    "xcecore": ("xce", ROOT),
    "xce_controller": ("xce-controller", ROOT / "plugins" / "controller"),
    "xce_worker": ("xce-worker", ROOT / "plugins" / "worker"),
    "xce_scheduler": ("xce-scheduler", ROOT / "plugins" / "scheduler"),
    "xce_apiserver": ("xce-apiserver", ROOT / "plugins" / "apiserver"),
    "xce_cli": ("xce-cli", ROOT / "plugins" / "cli"),
    "xce_auditor": ("xce-auditor", ROOT / "examples" / "auditor"),
    "xce_site_resreq": ("xce-site-resreq", ROOT / "examples" / "site_resreq"),
}
pytestmark = pytest.mark.timeout(30)


def _imported_packages(package_dir: Path) -> set[str]:
    found: set[str] = set()
    for path in package_dir.rglob("*.py"):
        if "testing" in path.relative_to(package_dir).parts:
            continue  # the test harness (xcecore.testing) runs whichever roles are installed
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
    return found & set(DISTS)


def _declared(folder: Path) -> set[str]:
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip() for r in reqs}


@pytest.mark.parametrize("package", sorted(DISTS))
def test_imports_of_other_distributions_are_declared(package: str) -> None:
    dist, folder = DISTS[package]
    used = _imported_packages(folder / package) - {package}
    declared = _declared(folder)
    missing = sorted(DISTS[p][0] for p in used if DISTS[p][0] not in declared)
    assert not missing, f"{dist} imports {missing} without declaring them in its pyproject.toml"


def test_every_package_ships_py_typed() -> None:
    for package, (dist, folder) in DISTS.items():
        assert (folder / package / "py.typed").exists(), f"{dist}: {package}/py.typed is missing"
        data = tomllib.loads((folder / "pyproject.toml").read_text())
        assert "py.typed" in str(data.get("tool", {}).get("setuptools", {}).get("package-data", {})), \
            f"{dist} does not install {package}/py.typed"


def test_the_version_is_written_once() -> None:
    from importlib.metadata import version

    import xcecore

    one = (ROOT / "xcecore" / "VERSION").read_text().strip()
    assert xcecore.__version__ == one
    for _package, (dist, folder) in DISTS.items():
        data = tomllib.loads((folder / "pyproject.toml").read_text())
        assert "version" not in data["project"], f"{dist} writes its own version"
        assert data["project"]["dynamic"] == ["version"]
        source = folder / data["tool"]["setuptools"]["dynamic"]["version"]["file"]
        assert source.resolve() == (ROOT / "xcecore" / "VERSION").resolve(), f"{dist} reads {source}"
        assert version(dist) == one
