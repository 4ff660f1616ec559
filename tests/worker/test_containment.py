"""Job containment with real processes and real cgroups (v1 hierarchies, the v2 unified
hierarchy, and the fallback): memory and run limits, kill of everything a job forked, usage
figures, stop/resume by the freezer, cores, and every group removed afterwards.

What this machine's cgroup v2 cannot show: its controllers are all bound to v1 hierarchies,
so v2 groups here have no memory, cpuset or pids controller (memory limits are enforced by
sampling there, as the containment's start line says); ``cgroup.kill``, ``cgroup.freeze``,
``cpu.stat`` and membership are real v2 and are exercised.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from jobkit import (
    MB,
    PY,
    containment,
    ended,
    group_dirs,
    have_cgroup,
    is_dead,
    job,
    manager,
    need_root,
    notes,
    text_of,
)
from xce_worker.containment import ContainConfig, ContainmentError, Limits, builtin_specs, select
from xce_worker.containment.cgroupfs import read_pids, read_text
from xce_worker.procman import ProcessManager
from xce_worker.spool import Journal

from xcecore.testing import wait_for

pytestmark = pytest.mark.timeout(120)
CGROUPS = ["cgroup1", "cgroup2"]
ALL = [*CGROUPS, "fallback"]


@pytest.fixture(autouse=True)
def _root_and_hierarchies(request: pytest.FixtureRequest) -> None:
    need_root()
    kind = request.node.callspec.params.get("kind") if hasattr(request.node, "callspec") else None
    if kind == "cgroup1" and not (have_cgroup(1, "memory") and have_cgroup(1, "freezer")):
        pytest.fail("cgroup1 tests need v1 memory and freezer hierarchies mounted")
    if kind == "cgroup2" and not have_cgroup(2):
        pytest.fail("cgroup2 tests need a cgroup2 file system mounted")


def alloc(mb: int, hold: float = 0.0, then: str = "") -> str:
    """A job that allocates and touches ``mb`` MiB, holds it ``hold`` s, then runs ``then``."""
    return (f"{PY} -S -c \"import time; b = bytearray({mb} * 1024 * 1024); "
            f"b[::4096] = b'x' * len(b[::4096]); time.sleep({hold})\"{then}")


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("kind", CGROUPS)
def test_memory_limit_kills_the_job_and_spares_its_neighbour(tmp_path: Path, kind: str) -> None:
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(2, alloc(8, hold=60)))  # a neighbour on the same host
        assert pm.start(job(1, alloc(300, hold=30), mem_limit=64 * MB))
        report = ended(pm, 1)
        assert report["event"] == "finish" and report["exit_reason"] == "mem_limit"
        assert report["exit_status"] != 0
        assert 2 in pm.running and not pm.running[2].done.is_set()  # untouched
        pm.signal(2, 0, "kill")
        assert ended(pm, 2)["exit_reason"] == "killed"


def test_cgroup1_limit_is_the_kernels(tmp_path: Path) -> None:
    """v1: the limit is in memory.limit_in_bytes and the kernel's OOM killer acts."""
    with manager(tmp_path, "cgroup1", sample=None) as pm:  # no sampling: the kernel alone
        assert pm.start(job(1, f"cat /proc/self/cgroup; {alloc(300)}", mem_limit=64 * MB))
        rj = pm.running[1]
        mem_dir = rj.group.dirs["memory"]  # type: ignore[attr-defined]
        assert int(read_text(mem_dir / "memory.limit_in_bytes")) == 64 * MB
        report = ended(pm, 1)
        assert report["exit_reason"] == "mem_limit" and report["exit_status"] == 137
        assert report["usage"]["max_mem"] <= 64.5


def test_fallback_memory_limit_by_sampling_and_rlimit(tmp_path: Path) -> None:
    """Fallback: RLIMIT_DATA stops one process; the sum of several is caught by sampling."""
    with manager(tmp_path, "fallback") as pm:
        assert pm.start(job(1, f"{alloc(200)} || echo refused", mem_limit=64 * MB,
                            stdout="one.out", cwd=str(tmp_path)))
        assert ended(pm, 1)["exit_status"] == 0
        assert "MemoryError" in (tmp_path / "one.out").read_text()  # the rlimit said no
        assert pm.start(job(2, f"{alloc(40, 30)} & {alloc(40, 30)} & wait",
                            mem_limit=64 * MB))
        report = ended(pm, 2)
        assert report["exit_reason"] == "mem_limit"


# ----------------------------------------------------------------------------- run limit


@pytest.mark.parametrize("kind", ALL)
def test_run_limit_fires(tmp_path: Path, kind: str) -> None:
    with manager(tmp_path, kind) as pm:
        started = time.monotonic()
        assert pm.start(job(1, "trap '' TERM; sleep 60", run_limit=1))
        report = ended(pm, 1)
        assert report["exit_reason"] == "run_limit"
        assert report["exit_status"] == 128 + signal.SIGKILL  # TERM ignored: KILL after grace
        assert time.monotonic() - started >= 1.0


def test_stopped_time_does_not_count_against_the_run_limit(tmp_path: Path) -> None:
    with manager(tmp_path, "cgroup1") as pm:
        assert pm.start(job(1, "sleep 60", run_limit=1))
        pm.signal(1, 0, "stop")
        stopped_at = time.monotonic()
        wait_for(lambda: time.monotonic() - stopped_at > 1.5, 5, what="1.5 s stopped")
        assert notes(pm, 1)[-1]["event"] not in ("finish", "fail")
        assert 1 in pm.running  # stopped: the limit waits
        pm.signal(1, 0, "resume")
        assert ended(pm, 1)["exit_reason"] == "run_limit"


# ----------------------------------------------------------------------------- usage


@pytest.mark.parametrize("kind", ALL)
def test_cpu_time_of_a_known_burn(tmp_path: Path, kind: str) -> None:
    burn = (f"{PY} -S -c \"import time\nwhile time.process_time() < 2.0: pass\" & "
            f"{PY} -S -c \"import time\nwhile time.process_time() < 1.0: pass\"; wait")
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(1, burn))
        usage = ended(pm, 1, timeout=60)["usage"]
        assert 3.0 <= usage["cputime"] <= 3.0 * 1.05, usage
        assert usage["cputime"] == pytest.approx(usage["utime"] + usage["stime"], abs=0.01)


@pytest.mark.parametrize("kind", ALL)
def test_peak_memory_of_a_known_allocation(tmp_path: Path, kind: str) -> None:
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(1, alloc(300, hold=1.0)))
        usage = ended(pm, 1)["usage"]
        assert usage["max_mem"] == pytest.approx(300, rel=0.05), usage


def test_running_usage_is_reported(tmp_path: Path) -> None:
    with manager(tmp_path, "cgroup1") as pm:
        assert pm.start(job(1, alloc(50, hold=30)))
        posts = pm.posts  # type: ignore[attr-defined]

        def sampled() -> dict[str, float] | None:
            mine = [a["usage"] for k, op, a in posts if k == "jusage:1"]
            return mine[-1] if mine and mine[-1]["mem"] >= 50 else None
        usage = wait_for(sampled, 10, what="a usage sample with the 50 MB")
        assert usage["max_mem"] >= usage["mem"] and usage["nprocs"] >= 2
        pm.signal(1, 0, "kill")
        ended(pm, 1)


# ----------------------------------------------------------------------------- kill


@pytest.mark.parametrize("kind", CGROUPS)
def test_a_double_fork_does_not_escape(tmp_path: Path, kind: str) -> None:
    daemon = tmp_path / "daemon.pid"
    # The grandchild leaves the session (setsid) and is re-parented to init: only the cgroup
    # still knows it belongs to the job.
    cmd = f"(setsid sh -c 'echo $$ > {daemon}; exec sleep 300' &); sleep 300"
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(1, cmd))
        pid = wait_for(lambda: daemon.exists() and daemon.read_text().strip(), 10,
                       what="the daemon's pid")
        pid = int(pid)
        assert os.getsid(pid) != pm.running[1].pid  # out of the job's session indeed
        assert pid in pm.running[1].group.pids()
        pm.signal(1, 0, "kill")
        ended(pm, 1)
        wait_for(lambda: is_dead(pid), 10, what=f"daemon {pid} killed with its job")


@pytest.mark.parametrize("kind", CGROUPS)
def test_leftovers_end_with_the_job(tmp_path: Path, kind: str) -> None:
    daemon = tmp_path / "daemon.pid"
    cmd = f"(setsid sh -c 'echo $$ > {daemon}; exec sleep 300' &); sleep 0.2"
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(1, cmd))
        assert ended(pm, 1)["exit_reason"] == "done"
        assert is_dead(int(daemon.read_text()))


def test_fallback_kills_the_session(tmp_path: Path) -> None:
    """Fallback: a child that left the process group but not the session is still killed
    (one that calls setsid escapes; the start line says so)."""
    child = tmp_path / "child.pid"
    cmd = f"(sh -c 'echo $$ > {child}; exec sleep 300' &); sleep 300"
    with manager(tmp_path, "fallback") as pm:
        assert pm.start(job(1, cmd))
        pid = int(wait_for(lambda: child.exists() and child.read_text().strip(), 10,
                           what="child pid"))
        pm.signal(1, 0, "kill")
        ended(pm, 1)
        wait_for(lambda: is_dead(pid), 10, what=f"child {pid} killed")


# ----------------------------------------------------------------------------- freezer


@pytest.mark.parametrize("kind", CGROUPS)
def test_stop_and_resume_by_the_freezer(tmp_path: Path, kind: str) -> None:
    marks = tmp_path / "ticks"
    cmd = f"while :; do echo x >> {marks}; sleep 0.05; done"
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(1, cmd))
        rj = pm.running[1]
        assert rj.group.freezer
        wait_for(lambda: marks.exists() and marks.stat().st_size > 0, 10, what="ticks")
        pm.signal(1, 0, "stop")
        if kind == "cgroup1":
            state = rj.group.dirs["freezer"] / "freezer.state"  # type: ignore[attr-defined]
            assert read_text(state).strip() == "FROZEN"
        else:
            assert "frozen 1" in read_text(rj.group.path / "cgroup.events")  # type: ignore[attr-defined]
        size = marks.stat().st_size
        time.sleep(0.3)  # a frozen job writes nothing: there is no event to wait for
        assert marks.stat().st_size == size
        pm.signal(1, 0, "resume")
        wait_for(lambda: marks.stat().st_size > size, 10, what="ticks after resume")
        pm.signal(1, 0, "stop")
        pm.signal(1, 0, "kill")  # a frozen job is thawed to hear SIGTERM
        assert ended(pm, 1)["exit_reason"] == "killed"


# ----------------------------------------------------------------------------- cores, files


@pytest.mark.parametrize("kind", ALL)
def test_concurrent_jobs_get_distinct_cores(tmp_path: Path, kind: str) -> None:
    with manager(tmp_path, kind) as pm:
        ncpu = len(pm.cores.items)
        if ncpu < 2:
            pytest.fail("this test needs a host with 2 CPUs or more")
        for i in (1, 2):
            assert pm.start(job(i, "grep Cpus_allowed_list /proc/self/status; sleep 30",
                                stdout=f"cores{i}", cwd=str(tmp_path)))
        got = [wait_for(lambda i=i: text_of(tmp_path / f"cores{i}").split()[-1:], 10,
                        what="cores")[0] for i in (1, 2)]
        assert got[0] != got[1] and all("," not in g and "-" not in g for g in got)
        for i in (1, 2):
            pm.signal(i, 0, "kill")
            ended(pm, i)
        assert not pm.cores.held()


@pytest.mark.parametrize("kind", CGROUPS)
def test_job_is_in_its_group_and_groups_are_removed(tmp_path: Path, kind: str) -> None:
    with manager(tmp_path, kind) as pm:
        assert pm.start(job(5, "cat /proc/self/cgroup; sleep 30", stdout="cg", cwd=str(tmp_path)))
        rj = pm.running[5]
        dirs = group_dirs(pm.containment)
        assert dirs and all("xce-h1-" in str(d) and d.name == "job-5.0" for d in dirs)
        wait_for(lambda: "job-5.0" in text_of(tmp_path / "cg"), 10, what="cgroup line")
        assert rj.pid in read_pids(dirs[0] / "cgroup.procs")
        pm.signal(5, 0, "kill")
        ended(pm, 5)
        assert not group_dirs(pm.containment)


def test_stale_groups_of_a_crashed_worker_are_removed_at_start(tmp_path: Path) -> None:
    c = containment("cgroup1", "h1")
    stale = c.create("77.0", Limits())
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        stale.attach(sleeper.pid)
        pm = ProcessManager("h1", Journal(tmp_path / "j.jsonl"), tmp_path, kill_grace=0.5,
                            containment=c)
        pm.adopt()  # nothing in the journal runs: the group is stale
        assert sleeper.wait(10) == -signal.SIGKILL
        assert not group_dirs(c)
        pm.shutdown(keep_jobs=False)
        assert not any(b.exists() for b in c.bases())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_a_containment_that_is_unavailable_says_why(tmp_path: Path) -> None:
    specs = {s.name: s for s in builtin_specs()}
    with pytest.raises(ContainmentError, match="choose one of: auto, cgroup1, cgroup2, fallback"):
        select(specs, "systemd", ContainConfig("h1"))
    with pytest.raises(ContainmentError, match="not available on h1: .*not a writable cgroup"):
        select(specs, "cgroup2", ContainConfig("h1", parent="/no/such/xce/parent"))


def test_listed_groups_of_a_killed_worker_are_removed_from_its_state_dir(tmp_path: Path) -> None:
    # What tests, benchmarks and `xce up` do after a worker was SIGKILLed with a job running:
    # the groups listed in <state_dir>/cgroups (here two levels down) are emptied and removed.
    c = containment("cgroup1", "h-listed")
    group = c.create("5.0", Limits())
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        group.attach(sleeper.pid)
        state = tmp_path / "bed" / "n1" / "state"
        state.mkdir(parents=True)
        (state / "cgroups").write_text("".join(f"{b}\n" for b in c.bases()))
        from xce_worker.containment import remove_listed

        assert remove_listed(tmp_path, depth=1) == 0  # deeper than asked: not touched
        assert sleeper.poll() is None and all(b.exists() for b in c.bases())
        assert remove_listed(tmp_path, depth=3) == len(c.bases())
        assert sleeper.wait(10) == -signal.SIGKILL
        assert not any(b.exists() for b in c.bases())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        c.close()
