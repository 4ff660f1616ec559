"""A parallel job's tasks in the REST job detail (``GET /jobs/ID``): the record's ``tasks``
as the controller pushes it, host, pid, state, exit status and times of each task."""

from __future__ import annotations

from typing import Any

import pytest
from apikit import job
from xce_apiserver.app import PREFIX

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_the_job_detail_lists_its_tasks(api: Any) -> None:
    tasks = {"blocked": True, "key": "0" * 64, "commands": ["./solver"],
             "list": [{"task": 1, "host": "n1", "launch": 0, "state": "DONE", "pid": 41,
                       "exit_status": 0, "launch_time": 1.0, "start_time": 2.0,
                       "end_time": 3.0, "reason": None, "usage": {"cputime": 0.5}},
                      {"task": 2, "host": "n2", "launch": 0, "state": "EXIT", "pid": None,
                       "exit_status": None, "launch_time": 1.0, "start_time": None,
                       "end_time": 3.0, "reason": "host n2 became unavailable"}]}
    api.store.apply("job", job(1, user="alice", state="RUN", ntasks=2, tasks=tasks,
                               alloc=[{"host": "n1", "ntasks": 1}, {"host": "n2", "ntasks": 1}],
                               rev=50))
    r = await api.client.get(f"{PREFIX}/jobs/1", headers=api.token("alice"))
    assert r.status_code == 200, r.text
    (rec,) = r.json()["data"]
    assert rec["tasks"]["blocked"] is True and rec["tasks"]["commands"] == ["./solver"]
    assert [(t["task"], t["host"], t["state"], t["pid"], t["exit_status"])
            for t in rec["tasks"]["list"]] == [(1, "n1", "DONE", 41, 0), (2, "n2", "EXIT", None, None)]
    assert rec["tasks"]["list"][1]["reason"] == "host n2 became unavailable"
