"""Suite-wide: job cgroups that a test's workers could not remove themselves are removed;
one-shot commands' settings cache is in the session's temp tree; Hypothesis has no per-example deadline.

A worker removes its job groups as jobs end and its own directories when it stops; one that
a test SIGKILLs with jobs running cannot. Each worker lists its group directories in
``<state_dir>/cgroups``; after every test, the directories listed under the test's
``tmp_path`` are emptied (their processes SIGKILLed) and removed, and at the end of the
session those listed anywhere in its temp tree, so no test leaves a cgroup behind. Only what
the session's own workers listed is touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis's default 200 ms deadline per example is a timing assertion: a first example
# that builds a validator on a loaded machine failed it ("Unreliable test timings"). Tests
# bound time only to catch hangs (pytest-timeout does).
settings.register_profile("xce", deadline=None)
settings.load_profile("xce")


@pytest.fixture(autouse=True, scope="session")
def _settings_cache_in_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One-shot commands cache the settings they read in ``$XDG_CACHE_HOME/xce``
    (:mod:`xcecore.client.sectioncache`): the suite's go to its temp tree, not the home of
    whoever runs it (its processes inherit the variable)."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True)
def _remove_job_cgroups(request: pytest.FixtureRequest) -> Iterator[None]:
    # Asked before the test, so that tmp_path is torn down after this fixture, not before.
    root: Path | None = (request.getfixturevalue("tmp_path")
                         if "tmp_path" in request.fixturenames else None)
    yield
    if root is None:
        return
    from xce_worker.containment import remove_listed

    remove_listed(root, depth=3)


def _worker_bases() -> set[Path]:
    """Every ``xce-*`` directory beside where this process's workers make theirs."""
    from xce_worker.containment.cgroupfs import group_path, parse_mountinfo, parse_proc_cgroup

    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = parse_mountinfo(fh.read())
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        own = parse_proc_cgroup(fh.read())
    found: set[Path] = set()
    for m in mounts:
        keys = [""] if m.version == 2 else sorted(m.controllers)
        for key in keys:
            parent = group_path(m, own.get(key, "/"))
            if parent.is_dir():
                found.update(parent.glob("xce-*"))
    return found


@pytest.fixture(autouse=True, scope="session")
def _remove_session_job_cgroups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for workers whose state dirs are elsewhere in the session's temp tree; then
    the empty worker directories that appeared during the session (those of workers that
    were SIGKILLed, or whose state dir is gone, as ``xce up``'s). Removing another session's
    empty one is harmless: a worker makes its directory again when it next starts a job; a
    directory with a job group in it is never removed (rmdir refuses)."""
    before = _worker_bases()
    yield
    from xce_worker.containment import remove_listed
    from xce_worker.containment.cgroupfs import remove_dir

    remove_listed(tmp_path_factory.getbasetemp(), depth=4)
    for base in _worker_bases() - before:
        remove_dir(base)
