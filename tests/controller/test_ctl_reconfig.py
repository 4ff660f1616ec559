"""``xce admin reconfig`` and SIGHUP: a real candidate reads its file again and applies what can
change at once (queues, administrators), lists what needs a restart, and a broken file changes
nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from xcecore.testing import LocalCluster, wait_for
from xcecore.wire import RemoteError

pytestmark = [pytest.mark.timeout(120)]

BEFORE = '''[controller]
admins = ["ops"]
[[controller.queues]]
name = "normal"
priority = 30
[[controller.queues]]
name = "idle"
priority = 10
'''


def _rewrite(cl: LocalCluster, extra: str) -> None:
    cl.extra_config = extra
    cl.config_path.write_text(cl.config_text())


def _queues(c: Any) -> dict[str, dict[str, Any]]:
    return {q["name"]: q for q in c.call("queueinfo", {}, deadline=10)["queues"]}


def test_reconfig_applies_queues_and_admins_and_lists_what_needs_a_restart(
        xce_cluster: Any, xce_client: Any) -> None:
    cl: LocalCluster = xce_cluster(2, extra_config=BEFORE)
    front = xce_client(cl, "apiserver", join=False)  # a front end names the users it acts for
    cli = xce_client(cl, "cli", join=False)
    with pytest.raises(RemoteError) as refused:
        front.call("reconfig", {"user": "alice"}, deadline=10)
    assert refused.value.code == "DENIED"  # administrators only

    _rewrite(cl, BEFORE.replace('admins = ["ops"]', 'admins = ["ops", "alice"]\nmax_inflight = 77')
             .replace("priority = 10", 'priority = 12\ndescription = "scavenger"')
             + '[[controller.queues]]\nname = "night"\npriority = 5\nactive = false\n')
    res = cli.call("reconfig", {}, deadline=10)
    assert res == {"queues_added": ["night"], "queues_changed": ["idle"], "restart_needed": ["max_inflight"]}
    queues = _queues(cli)
    assert (queues["night"]["priority"], queues["night"]["active"]) == (5, False)
    assert (queues["idle"]["priority"], queues["idle"]["description"]) == (12, "scavenger")
    front.call("queuectrl", {"queue": "night", "action": "activate", "user": "alice"}, deadline=10)  # alice is one now
    job = front.call("jobsubmit", {"command": "true", "queue": "night", "user": "bob"}, deadline=10)
    assert job["queue"] == "night"

    # A file that does not load changes nothing, and says why.
    cl.config_path.write_text(cl.config_text() + "[controller\n")
    with pytest.raises(RemoteError) as bad:
        cli.call("reconfig", {}, deadline=10)
    assert bad.value.code == "INVALID" and "reconfig: nothing changed" in bad.value.message
    assert "night" in _queues(cli)

    # The new queue is a record: the standby that takes over has it (and its state).
    cl.kill_primary()
    assert _queues(cli)["night"]["active"] is True


def test_sighup_reconfigures_the_candidate_and_the_command_reports_it(xce_cluster: Any,
                                                                      xce_client: Any) -> None:
    cl: LocalCluster = xce_cluster(1, extra_config=BEFORE)
    cli = xce_client(cl, "cli", join=False)
    _rewrite(cl, BEFORE + '[[controller.queues]]\nname = "day"\npriority = 40\n')
    os.kill(cl.candidates[0].pid, signal.SIGHUP)
    wait_for(lambda: "day" in _queues(cli), 30, what="the SIGHUP's new queue")
    assert cl.candidates[0].alive()
    assert "reconfigured by SIGHUP (primary): queues added ['day']" in cl.candidates[0].text()

    _rewrite(cl, BEFORE + '[[controller.queues]]\nname = "day"\npriority = 41\n')
    out = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path),
                          "admin", "reconfig"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reconfigured: queues added none, changed day"
    assert _queues(cli)["day"]["priority"] == 41
