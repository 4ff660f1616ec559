"""Suite-wide: job cgroups that a test's workers could not remove themselves are removed.

A worker removes its job groups as jobs end and its own directories when it stops; one that
a test SIGKILLs with jobs running cannot. Each worker lists its group directories in
``<state_dir>/cgroups``; after every test, the directories listed under the test's
``tmp_path`` are emptied (their processes SIGKILLed) and removed, and at the end of the
session those listed anywhere in its temp tree, so no test leaves a cgroup behind. Only what
the session's own workers listed is touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def _listed(root: Path, depth: int = 4) -> list[Path]:
    out: list[Path] = []
    for pattern in ["/".join(["*"] * n + ["cgroups"]) for n in range(depth)]:
        for record in root.glob(pattern):
            out += [Path(line) for line in record.read_text().splitlines() if line.strip()]
    return out


@pytest.fixture(autouse=True)
def _remove_job_cgroups(request: pytest.FixtureRequest) -> Iterator[None]:
    # Asked before the test, so that tmp_path is torn down after this fixture, not before.
    root: Path | None = (request.getfixturevalue("tmp_path")
                         if "tmp_path" in request.fixturenames else None)
    yield
    if root is None:
        return
    from xce_worker.containment import remove_groups

    for base in _listed(root):
        remove_groups(base)


@pytest.fixture(autouse=True, scope="session")
def _remove_session_job_cgroups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for workers whose state dirs are elsewhere in the session's temp tree."""
    yield
    from xce_worker.containment import remove_groups

    for base in _listed(tmp_path_factory.getbasetemp(), depth=5):
        remove_groups(base)
