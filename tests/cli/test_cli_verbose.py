"""One-shot commands print warnings only with -v: a candidate down is no news to a user whose
command succeeded through another one. Errors that end a command still print. Real cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from xcecore.testing import LocalCluster

pytestmark = [pytest.mark.timeout(120)]


def xce(cl: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True,
                          env={**os.environ, "XCE_CONFIG": str(cl.config_path)}, timeout=60)


def test_warnings_only_with_v_errors_always(xce_cluster: Callable[..., LocalCluster]) -> None:
    cl = xce_cluster(2)
    cl.kill_primary()  # candidate 0 (listed first) is down: every command tries it first
    quiet = xce(cl, "jobs")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", quiet.stderr
    loud = xce(cl, "-v", "jobs")
    assert loud.returncode == 0 and " WARNING " in loud.stderr, loud.stderr
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d WARNING xce \| ",
                    loud.stderr), loud.stderr
    assert " WARNING " in xce(cl, "--log-level", "WARNING", "jobs").stderr
    for i in list(cl.candidates):
        cl.candidates[i].kill()
    failed = xce(cl, "--timeout", "1", "jobs")
    assert failed.returncode != 0 and failed.stderr.strip(), failed
    assert " WARNING " not in failed.stderr
