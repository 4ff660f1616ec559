"""Job execution end to end and around the edges: limits and reasons recorded by a real
controller, a job script's directives and environment reaching the job, a worker configured
to use the fallback, the clean environment, input files, and GPUs (with a fake NVML)."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobkit import MB, PY, ended, job, manager, need_root, text_of
from test_worker_cluster import admin, host_up, job_state, start_worker, wait_log
from xce_worker import attrs
from xce_worker.attrs import gpu_facts, join_attributes

from xcecore.jobenv import resolve_env
from xcecore.jobscript import parse_script
from xcecore.testing import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(120)


def submit(c: Any, hname: str, **args: Any) -> int:
    jobid: int = c.call("jobsubmit", dict(args))["jobid"]
    c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": hname, "ntasks": 1}],
                           "force": True})
    return jobid


def finished(c: Any, jobid: int) -> dict[str, Any]:
    return wait_for(lambda: (j := job_state(c, jobid))["state"] in ("DONE", "EXIT") and j,
                    30, what=f"job {jobid} finished")  # type: ignore[no-any-return]


@pytest.mark.e2e
def test_limits_and_reasons_through_a_real_controller(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    need_root()
    cl = xce_cluster(1)
    w = start_worker(cl, "x1", tmp_path / "w", "w")
    wait_log(w, "job containment cgroup1")  # what this machine has: the v1 hierarchies
    with admin(cl) as c:
        wait_for(lambda: host_up(c, "x1"), 20, what="host x1")
        neighbour = submit(c, "x1", command="sleep 2")
        hog = submit(c, "x1", command=f"{PY} -S -c \"b = bytearray(300 * 2**20)\"",
                     mem_limit=64 * MB)
        late = submit(c, "x1", command="sleep 30", run_limit=60)
        ok = submit(c, "x1", command="exit 3")
        timed = submit(c, "x1", command="sleep 30", run_limit=1)
        signalled = submit(c, "x1", command="kill -9 $$")
        nowhere = submit(c, "x1", command="true", cwd=str(tmp_path / "missing"))
        rec = finished(c, hog)
        assert rec["state"] == "EXIT" and rec["reason"] == "memory limit exceeded"
        assert rec["usage"]["max_mem"] <= 65 and rec["mem_limit"] == 64 * MB
        assert rec["start_time"] <= rec["end_time"]
        assert finished(c, ok)["reason"] == "exit code 3"
        assert finished(c, timed)["reason"] == "run limit reached"
        for jobid, reason in ((hog, "memory limit exceeded"), (timed, "run limit reached")):
            long = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cl.config_path),
                                   "--timeout", "10", "jobs", "-l", str(jobid)],
                                  capture_output=True, text=True, timeout=60, check=False)
            assert long.returncode == 0 and f"Reason: {reason}" in long.stdout, long
        assert finished(c, signalled)["reason"] == "killed by signal 9"
        assert finished(c, nowhere)["reason"].startswith("could not start: ")
        assert finished(c, neighbour)["state"] == "DONE"  # the neighbour was untouched
        c.call("jobctrl", {"jobid": late, "action": "kill"})
        killed = finished(c, late)
        assert killed["reason"] == f"killed by owner {killed['user']}"


@pytest.mark.e2e
def test_script_directives_and_environment_on_a_fallback_worker(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1)
    w = cl.start_role("worker", 'worker.hname="f1"', f'worker.state_dir="{tmp_path / "w"}"',
                      "worker.monitor_interval=0.1", 'worker.containment="fallback"',
                      name="w", env={"WORKER_ONLY": "must not leak into jobs"})
    wait_log(w, "job containment fallback (process group and session")
    script = ("#!/bin/sh\n#XCE -J greet -o greet.%J.out\n#BSUB -W 5\n"
              "#SBATCH --export=ALL,MODE=fast\n"
              'echo "$GREETING|$MODE|$WORKER_ONLY|$XCE_JOBID|$PATH"\n')
    d = parse_script(script)
    submitter = {"GREETING": "hello", "PATH": "/opt/site/bin:/usr/bin:/bin", "PWD": "/x"}
    assert d.env is not None
    with admin(cl) as c:
        wait_for(lambda: host_up(c, "f1"), 20, what="host f1")
        jobid = submit(c, "f1", command=script, name=d.name, stdout=d.stdout,
                       run_limit=d.run_limit, cwd=str(tmp_path), env=resolve_env(d.env, submitter))
        rec = finished(c, jobid)
    assert rec["state"] == "DONE" and rec["name"] == "greet" and rec["run_limit"] == 300
    out = (tmp_path / f"greet.{jobid}.out").read_text().strip()
    assert out == f"hello|fast||{jobid}|/opt/site/bin:/usr/bin:/bin"


def test_clean_environment_and_input(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("from the input file\n")
    with manager(tmp_path, "fallback") as pm:
        assert pm.start(job(1, "cat; env | sort", cwd=str(tmp_path), stdin="in.txt",
                            stdout="o.%J", env={"ONLY": "me"}))
        assert ended(pm, 1)["exit_status"] == 0
        lines = (tmp_path / "o.1").read_text().splitlines()
        assert lines[0] == "from the input file"
        names = {line.split("=", 1)[0] for line in lines[1:]}
        # The base, the job's own variables, XCE_*: nothing of the worker's environment
        # (pytest's, here) beyond what a shell sets itself.
        assert {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "ONLY", "XCE_JOBID"} <= names
        assert not {"PYTEST_CURRENT_TEST", "VIRTUAL_ENV"} & names
        assert not pm.start(job(2, "true", cwd=str(tmp_path), stdin="missing.txt"))
        report = ended(pm, 2)
        assert report["event"] == "fail" and "input file" in report["reason"]
        assert report["exit_reason"] == "no_start"


# ----------------------------------------------------------------------------- GPUs


class FakeNVML(types.ModuleType):
    """Enough of pynvml for the worker: devices with a name, a UUID and memory."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: list[tuple[str, int]], broken: bool = False) -> None:
        super().__init__("pynvml")
        self.devices, self.broken, self.inits, self.shutdowns = devices, broken, 0, 0

    def nvmlInit(self) -> None:
        if self.broken:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h][0].encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(total=self.devices[h][1] * MB)


def test_gpus_reported_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML([("NVIDIA A100-SXM4-40GB", 40960), ("NVIDIA A100-SXM4-40GB", 40000)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = attrs.gpus()
    assert [g.uuid for g in found] == ["GPU-00000000", "GPU-00000001"]
    assert fake.inits == fake.shutdowns == 1
    assert gpu_facts(found) == {"ngpus": 2, "gpu_model": "NVIDIA A100-SXM4-40GB",
                                "gpu_mem": 40000}
    facts = {"type": "X86_64", "model": "m", "ncpus": 4, "ncores": 4, "nthreads": 1,
             "maxmem": 1, "maxswp": 0, "maxtmp": 1, **gpu_facts(found)}
    assert join_attributes({"hname": "g1"}, facts)["ngpus"] == 2
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], broken=True))
    assert attrs.gpus() == [] and gpu_facts([]) == {"ngpus": 0}


def test_the_real_nvml_binding_without_a_driver() -> None:
    """nvidia-ml-py is installed; on a host without NVIDIA's library it reports none."""
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.fail("this host has an NVIDIA driver: run the GPU checks on it by hand")
    except pynvml.NVMLError:
        assert attrs.gpus() == []


def test_jobs_get_distinct_gpus(tmp_path: Path) -> None:
    with manager(tmp_path, "fallback", gpus=2) as pm:
        for i in (1, 2):
            assert pm.start(job(i, 'echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER"; sleep 30',
                                resreq="select[ngpus>0] rusage[ngpus=1]", cwd=str(tmp_path),
                                stdout=f"g{i}"))
        seen = [wait_for(lambda i=i: text_of(tmp_path / f"g{i}").split(), 10,
                         what="devices") for i in (1, 2)]
        assert sorted(s[0] for s in seen) == ["0", "1"] and seen[0][1] == "PCI_BUS_ID"
        assert not pm.start(job(3, "true", resreq="rusage[ngpus=3]"))
        assert "asks for 3 GPU(s); h1 has 2" in ended(pm, 3)["reason"]
        for i in (1, 2):
            pm.signal(i, 0, "kill")
            ended(pm, i)
        assert pm.start(job(4, 'echo "[$CUDA_VISIBLE_DEVICES]"', resreq="rusage[ngpus=2]",
                            cwd=str(tmp_path), stdout="g4"))
        ended(pm, 4)
        assert (tmp_path / "g4").read_text().strip() == "[0,1]"
        assert pm.start(job(5, 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"', cwd=str(tmp_path),
                            stdout="g5"))
        ended(pm, 5)
        assert (tmp_path / "g5").read_text().strip() == "[unset]"
