"""The systemd units in examples/systemd: each is valid for `systemd-analyze verify` (Debian's
systemd package), runs `xce ... run ROLE` with arguments that command accepts, has the
KillMode its role needs, and its command really starts the role (real processes, with a
real controller) and writes and removes its pid file."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from xcecore.cli.options import parse_global
from xcecore.testing import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(120)
UNITS = Path(__file__).resolve().parents[2] / "examples" / "systemd"
ROLES = {"xce-controller@.service": "controller", "xce-worker.service": "worker",
         "xce-scheduler.service": "scheduler", "xce-apiserver.service": "apiserver"}
KILL_MODE = {"worker": "process"}  # a worker stop must not kill the jobs; the others: mixed
XCE = str(Path(sys.executable).with_name("xce"))


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections -> key -> values (a key may repeat); our own small parser."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None and key.strip(), f"line {n}: not key=value: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(unit: dict[str, dict[str, list[str]]], instance: str = "test") -> list[str]:
    (cmd,) = unit["Service"]["ExecStart"]
    return shlex.split(cmd.replace("%i", instance))


@pytest.mark.parametrize("name", sorted(ROLES))
def test_unit_runs_its_role_with_accepted_arguments(name: str) -> None:
    unit = parse_unit((UNITS / name).read_text())
    role = ROLES[name]
    argv = exec_start(unit)
    assert Path(argv[0]).name == "xce", argv
    opts, command, rest, wants_help = parse_global(argv[1:])
    assert command == "run" and rest[0] == role and not wants_help, argv
    assert opts.config and opts.config.startswith("/etc/xce/"), argv
    assert "--pid-file" in rest, argv
    service = unit["Service"]
    assert service["KillMode"] == [KILL_MODE.get(role, "mixed")]
    assert service["Restart"] == ["on-failure"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    if role == "controller":
        assert int(service["LimitNOFILE"][0]) >= 65536


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("this test needs systemd-analyze (Debian: apt-get install systemd)")
    for name in ROLES:
        # verify checks that ExecStart's binary exists: point it at this venv's xce
        (tmp_path / name).write_text((UNITS / name).read_text().replace("/opt/xce/bin/xce", XCE))
    targets = [n.replace("@.", "@test.") for n in ROLES]
    res = subprocess.run([tool, "verify", *targets], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stdout + res.stderr


def test_each_units_command_starts_its_role_and_keeps_a_pid_file(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1, start=False, extra_config='[apiserver]\nlisten = "127.0.0.1:0"\n')
    extra = {"controller": [f'controller.listen="{cl.address(0)}"', f'controller.state_dir="{cl.state_dir}"'],
             "worker": ['worker.hname="unit1"', f'worker.state_dir="{tmp_path / "w"}"']}
    procs: list[tuple[str, subprocess.Popen[bytes], Path, Path]] = []
    try:
        for name, role in ROLES.items():  # the controller first
            argv = exec_start(parse_unit((UNITS / name).read_text()))
            pid_file = tmp_path / f"{role}.pid"
            argv = [XCE if a == argv[0] else str(cl.config_path) if a.startswith("/etc/xce/") else
                    str(pid_file) if a.startswith("/run/") else a for a in argv]
            for o in extra.get(role, []):
                argv += ["--set", o]
            log = tmp_path / f"{role}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append((role, proc, pid_file, log))
            wait_for(lambda p=pid_file, pr=proc: p.exists() and p.read_text() == f"{pr.pid}\n", 30,
                     what=f"{role}'s pid file")
            if role == "controller":
                wait_for(lambda: cl.state_of(0) == "primary", 30, what="the controller primary")
        for role, _proc, _, log in procs[1:]:
            wait_for(lambda lg=log: "joined as" in lg.read_text(), 30, what=f"{role} joined")
        for role, proc, pid_file, log in reversed(procs):
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()[-3000:]
            assert not pid_file.exists(), f"{role} left its pid file"
    finally:
        for _, proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
