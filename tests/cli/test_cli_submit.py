"""``xce submit``'s job options through a real cluster (controller, worker, scheduler as
processes): limits, output and input files, exclusivity, the environment, job scripts with
#XCE / #BSUB / #SBATCH directives, the unit of a bare -M, and what it refuses."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from xcecore.client.settings import CLUSTER_KEYS
from xcecore.jobspec import DEFAULT_MEM_UNIT
from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.timeout(180)]
MB = 1 << 20
PY = sys.executable


@pytest.fixture
def cluster(xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> LocalCluster:
    c = xce_cluster(1, extra_config=f'[controller]\nadmins = ["{getpass.getuser()}"]\n',
                    cluster_extra='unit_for_limits = "KB"\n')
    c.start_role("worker", 'worker.hname="sn1"', f'worker.state_dir="{tmp_path / "sn1"}"',
                 "worker.slots=2", "worker.monitor_interval=0.2", name="sn1")
    c.start_role("scheduler")
    return c


def xce(config: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        ok: bool = True) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "XCE_CONFIG": str(config), "COLUMNS": "200", **(env or {})}
    res = subprocess.run([PY, "-m", "xcecore", *args], capture_output=True, text=True,
                         env=full, cwd=cwd, timeout=60)
    if ok:
        assert res.returncode == 0, f"xce {' '.join(args)}: {res.stdout}{res.stderr}"
    return res


def submit(config: Path, *args: str, **kw: Any) -> int:
    res = xce(config, "submit", "--json", *args, **kw)
    return int(orjson.loads(res.stdout)["jobid"])


def record(config: Path, jobid: int) -> dict[str, Any]:
    found = orjson.loads(xce(config, "jobs", "--json", str(jobid)).stdout)
    assert len(found) == 1
    return dict(found[0])


def finished(config: Path, jobid: int) -> dict[str, Any]:
    def end() -> dict[str, Any] | None:
        rec = record(config, jobid)
        return rec if rec["state"] in ("DONE", "EXIT") else None
    result: dict[str, Any] = wait_for(end, 60, what=f"job {jobid} to end")
    return result


def test_options_reach_the_record_and_the_job(cluster: LocalCluster, tmp_path: Path) -> None:
    cfg = cluster.config_path
    (tmp_path / "in.txt").write_text("from the input file\n")
    jobid = submit(cfg, "-M", "64MB", "-W", "1:30", "-o", "out.%J", "-e", "err.%J", "-i",
                   "in.txt", "-x", "--", "sh", "-c", "cat; echo oops >&2", cwd=tmp_path)
    rec = finished(cfg, jobid)
    assert rec["state"] == "DONE", rec
    assert (rec["mem_limit"], rec["run_limit"], rec["exclusive"]) == (64 * MB, 90 * 60, True)
    assert (rec["stdout"], rec["stderr"], rec["stdin"]) == ("out.%J", "err.%J", "in.txt")
    assert rec["cwd"] == str(tmp_path)
    assert (tmp_path / f"out.{jobid}").read_text() == "from the input file\n"
    assert (tmp_path / f"err.{jobid}").read_text() == "oops\n"
    plain = record(cfg, submit(cfg, "--", "true"))  # nothing asked: nothing recorded
    assert not {"mem_limit", "run_limit", "stdout", "stderr", "stdin", "exclusive"} & set(plain)


def test_a_memory_limit_from_the_command_line_ends_the_job(cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    cfg = cluster.config_path
    hog = f"{PY} -S -c \"b = bytearray(300 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])\""
    rec = finished(cfg, submit(cfg, "-M", "32MB", "--", hog, cwd=tmp_path))
    assert rec["state"] == "EXIT" and rec["reason"] == "memory limit exceeded", rec
    assert rec["usage"]["max_mem"] > 0  # the final figures came with the end report


def test_the_environment_is_the_submitters_unless_env_says(cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    cfg = cluster.config_path
    show = ["--", "sh", "-c", 'echo "A=$A B=$B C=$C"']
    env = {"A": "1", "B": "2", "ESCAPED": "a\x1b[0mb"}  # ESC: the controller refuses it
    res = xce(cfg, "submit", "--json", "-o", "all.txt", *show, cwd=tmp_path, env=env)
    assert "not passing 1 variable(s) the controller would refuse: ESCAPED (a control " \
           "character in its value)" in res.stderr
    one = int(orjson.loads(res.stdout)["jobid"])
    listed = submit(cfg, "--env", "A,C=3", "-o", "listed.txt", *show, cwd=tmp_path, env=env)
    none = submit(cfg, "--env", "none", "-o", "none.txt", *show, cwd=tmp_path, env=env)
    for jobid in (one, listed, none):
        assert finished(cfg, jobid)["state"] == "DONE"
    assert (tmp_path / "all.txt").read_text() == "A=1 B=2 C=\n"
    assert (tmp_path / "listed.txt").read_text() == "A=1 B= C=3\n"
    assert (tmp_path / "none.txt").read_text() == "A= B= C=\n"
    assert record(cfg, none)["env"] == {}


def test_a_job_script_with_directives_overridden_by_options(cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    cfg = cluster.config_path
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n"
                      "#BSUB -J from-bsub -q priority -o out.%J\n"
                      "#BSUB -M 100MB -W 10\n"
                      "#SBATCH --export=NONE\n"
                      "#XCE -x\n"
                      "#BSUB -u someone@example.com\n"
                      'echo "args: $*; A=$A"\n'
                      "#BSUB -J after-the-first-command-is-ignored\n")
    script.chmod(0o644)  # not executable: it runs through its #! interpreter
    res = xce(cfg, "submit", "--json", "-q", "normal", "job.sh", "one", "two", cwd=tmp_path,
              env={"A": "1"})
    assert "job.sh: line 6: #BSUB -u (mail) is ignored" in res.stderr
    jobid = int(orjson.loads(res.stdout)["jobid"])
    rec = finished(cfg, jobid)
    assert rec["state"] == "DONE", rec
    assert (rec["name"], rec["queue"], rec["exclusive"]) == ("from-bsub", "normal", True)
    assert (rec["mem_limit"], rec["run_limit"]) == (100 * MB, 600)
    assert rec["command"] == f"/bin/sh {script} one two"
    assert (tmp_path / f"out.{jobid}").read_text() == "args: one two; A=\n"  # --export=NONE
    # An executable script runs itself, by its absolute path, from any cwd.
    script.chmod(0o755)
    other = tmp_path / "elsewhere"
    other.mkdir()
    jobid = submit(cfg, "--cwd", str(other), "-J", "cli-name", "job.sh", cwd=tmp_path)
    rec = finished(cfg, jobid)
    assert rec["state"] == "DONE" and rec["name"] == "cli-name" and rec["command"] == str(script)
    assert (other / f"out.{jobid}").read_text() == "args: ; A=\n"


def test_a_bare_memory_limit_is_in_the_configured_unit(cluster: LocalCluster,
                                                       tmp_path: Path) -> None:
    assert CLUSTER_KEYS["unit_for_limits"][1] == DEFAULT_MEM_UNIT == "MB"
    kb = cluster.config_path  # [cluster] unit_for_limits = "KB"
    default = tmp_path / "default.toml"
    default.write_text(kb.read_text().replace('unit_for_limits = "KB"\n', ""))
    assert record(kb, submit(kb, "-M", "512", "--", "true"))["mem_limit"] == 512 << 10
    assert record(default, submit(default, "-M", "512", "--", "true"))["mem_limit"] == 512 * MB
    assert record(kb, submit(kb, "-M", "2G", "--", "true"))["mem_limit"] == 2 << 30
    script = tmp_path / "s.sh"
    script.write_text("#BSUB -M 8\ntrue\n")
    assert record(kb, submit(kb, str(script)))["mem_limit"] == 8 << 10
    bad = tmp_path / "bad.toml"
    bad.write_text(kb.read_text().replace('"KB"', '"XB"'))
    res = xce(bad, "submit", "-M", "512", "--", "true", ok=False)
    assert res.returncode == 1 and res.stderr.strip() == (
        "Error: cluster.unit_for_limits: unknown unit 'XB' (use KB, MB, GB, TB, PB or EB)")


@pytest.mark.parametrize(("args", "code", "words"), [
    (["-M", "12XB"], 2, "-M/--mem: unknown unit 'XB'"),
    (["-M", "0"], 2, "-M/--mem: '0' must be at least one byte"),
    (["-W", "1:2:3"], 2, "-W/--time: '1:2:3' is not a run limit"),
    (["-W", "0"], 2, "a run limit must be more than zero"),
    (["--env", "1A"], 2, "--env: '1A' is not a variable name"),
    (["-n", "0"], 2, "-n/--ntasks must be >= 1, got 0"),
    (["-o", "out.%x"], 1, "jobsubmit: argument 'stdout': output path 'out.%x': unknown pattern %x"),
    (["-i", "in\x1bx"], 1, "jobsubmit: argument 'stdin' must not contain control characters"),
])
def test_bad_options_are_refused_naming_them(cluster: LocalCluster, args: list[str], code: int,
                                             words: str) -> None:
    res = xce(cluster.config_path, "submit", *args, "--", "true", ok=False)
    assert res.returncode == code and words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    if code == 2:
        assert res.stderr.startswith("usage: xce submit")


def test_a_bad_directive_names_the_script_and_the_line(cluster: LocalCluster,
                                                       tmp_path: Path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/sh\n#BSUB -J ok\n#BSUB -Z 3\ntrue\n")
    res = xce(cluster.config_path, "submit", "bad.sh", cwd=tmp_path, ok=False)
    assert res.returncode == 1 and res.stderr.strip() == (
        "Error: submit: bad.sh: line 3: #BSUB -Z: not a supported option (see docs/operator.md, "
        "Job scripts)")
    assert orjson.loads(xce(cluster.config_path, "jobs", "--json", "-a", "-u", "all").stdout) == []
