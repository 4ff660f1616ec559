"""Exit reasons in the pure state model: who killed a job (its owner, an administrator),
the run and memory limits, a signal, an exit code, a job that could not start -- each in
words in the job record, as the worker's end report and the kill request give them."""

from __future__ import annotations

from typing import Any

import pytest
from test_ctl_state import T0, indexes_agree, new_state, running, submit, with_hosts  # noqa: F401

pytestmark = pytest.mark.timeout(30)


def ended(st: Any, jobid: int, **report: Any) -> str | None:
    st.notify("n1", {"jobid": jobid, "attempt": 0, **report}, T0 + 5)
    job = st.jobs[jobid]
    assert job.state in ("DONE", "EXIT")
    reason: str | None = job.reason
    return reason


def test_a_kill_names_who_asked() -> None:
    st = with_hosts(new_state(), "n1", slots=8)
    pending = submit(st)
    st.control(pending, "kill", T0, by="owner alice")
    assert (st.jobs[pending].state, st.jobs[pending].reason) == ("EXIT", "killed by owner alice")
    mine, theirs = running(st), running(st)
    st.control(mine, "kill", T0, by="owner alice")
    st.control(theirs, "kill", T0, by="administrator root")
    assert st.jobs[mine].state == "RUN"  # until its worker reports the end
    killed = {"event": "finish", "exit_status": 143, "exit_reason": "killed"}
    assert ended(st, mine, **killed) == "killed by owner alice"
    assert ended(st, theirs, **killed) == "killed by administrator root"
    # A job that ended by itself before the kill took effect keeps its own reason.
    late = running(st)
    st.control(late, "kill", T0, by="owner alice")
    assert ended(st, late, event="finish", exit_status=3, exit_reason="exit_code") == "exit code 3"
    done = running(st)
    st.control(done, "kill", T0, by="owner alice")
    assert ended(st, done, event="finish", exit_status=0, exit_reason="done") is None
    # Killed before it started on its host: the worker's fail report; the kill's reason wins.
    early = running(st)
    st.control(early, "kill", T0, by="administrator root")
    assert ended(st, early, event="fail", reason="killed before it started on n1",
                 exit_reason="no_start") == "killed by administrator root"


def test_the_worker_reasons_in_words() -> None:
    st = with_hosts(new_state(), "n1", slots=8)
    cases = [({"exit_status": 137, "exit_reason": "mem_limit"}, "memory limit exceeded"),
             ({"exit_status": 143, "exit_reason": "run_limit"}, "run limit reached"),
             ({"exit_status": 137, "exit_reason": "signal"}, "killed by signal 9"),
             ({"exit_status": 4, "exit_reason": "exit_code"}, "exit code 4"),
             ({"exit_status": 143, "exit_reason": "killed"}, "killed"),  # e.g. its worker stopping
             ({"exit_status": 5}, "exit status 5")]
    for report, words in cases:
        assert ended(st, running(st), event="finish", **report) == words
    cannot = running(st)
    assert ended(st, cannot, event="fail", reason="working directory /nope does not exist",
                 exit_reason="no_start") == "could not start: working directory /nope does not exist"
