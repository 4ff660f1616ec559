"""What a one-shot command costs and how it reads its settings: no plugins, no event loop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from xcecore.testing.cluster import LocalCluster

pytestmark = [pytest.mark.timeout(120)]

HEAVY = ("anyio", "loguru", "pluggy", "click", "orjson", "dataclasses", "importlib.metadata",
         "hashlib", "hmac", "threading",
         "rich", "argparse", "asyncio", "uvloop", "xcecore.plugins", "xcecore.config",
         "inspect", "random", "logging")
# (pathlib is not listed: an editable install's path hook imports it at interpreter start-up.)
LIGHT = ("typing", "contextlib", "importlib", "warnings", "socket", "selectors")
"""Cheaper still, but each a millisecond or more of a ~45 ms command: not imported by the
one-shot commands themselves (an editable install's path hook imports some of them before
any xce code runs, so the probe counts only what the command adds)."""
PROBE = """
import sys
before = set(sys.modules)
from xcecore.cli import run
code = run(sys.argv[1:])
sys.stdout.flush()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {names} or m in {names})
sys.stderr.write("HEAVY " + ",".join(heavy) + "\\n")
added = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in {light})
sys.stderr.write("ADDED " + ",".join(added) + "\\n")
sys.exit(code)
"""


def _run(config: Path, *args: str, names: tuple[str, ...] = HEAVY) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XCE_CONFIG": str(config)}
    probe = PROBE.format(names=repr(set(names)), light=repr(set(LIGHT)))
    return subprocess.run([sys.executable, "-c", probe, *args],
                          capture_output=True, text=True, env=env, timeout=60)


def _heavy(res: subprocess.CompletedProcess[str], tag: str = "HEAVY") -> list[str]:
    line = next(x for x in res.stderr.splitlines() if x.startswith(f"{tag} "))
    return [m for m in line[len(tag) + 1:].split(",") if m]


@pytest.fixture
def cluster(xce_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return xce_cluster(2, extra_config='[controller]\nadmins = ["root"]\n')


def test_one_shot_commands_load_no_plugin_no_event_loop(cluster: LocalCluster) -> None:
    for args in (["submit", "--json", "--", "true"], ["jobs", "--json"], ["jobs", "-l", "-a"],
                 ["status", "--json"],
                 ["queues"], ["hosts"], ["outcome", "no-such-key"], ["version"]):
        res = _run(cluster.config_path, *args)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        assert _heavy(res) == [], (args, _heavy(res))
    jobs = orjson.loads(_run(cluster.config_path, "jobs", "--json").stdout)
    assert [j["command"] for j in jobs] == ["true"]


def test_one_shot_commands_import_no_typing(cluster: LocalCluster) -> None:
    """``typing`` (with its classes) is ~7 ms of a one-shot command: records on the one-shot
    path are tuples with named fields, type-only names sit under ``TYPE_CHECKING = False``.
    (Reading the TOML file imports it -- ``tomllib`` does -- so the settings come from the
    section cache, as for every command but the first after the file changed.)"""
    settled = time.time() - 60  # the cache takes a file only once it has settled
    os.utime(cluster.config_path, (settled, settled))
    assert _run(cluster.config_path, "jobs").returncode == 0  # reads the file, fills the cache
    for args in (["submit", "--", "true"], ["jobs"], ["jobs", "--json"], ["hosts"], ["queues"],
                 ["status"], ["version"], ["jobs", "--help"]):
        res = _run(cluster.config_path, *args)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        assert _heavy(res, "ADDED") == [], (args, _heavy(res, "ADDED"))


def test_the_help_cache_key_loads_no_plugin_manager() -> None:
    """``xce --help`` reads its cached plugin commands under a key computed without pluggy."""
    probe = ("import sys\nfrom xcecore.cli import plugins\nplugins._cache_name({})\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('pluggy', 'dataclasses', 'inspect', 'hashlib', 'typing') or m == 'xcecore.plugins'))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", (res.stdout, res.stderr)


def test_submit_loads_the_job_parsers_only_when_used(cluster: LocalCluster, tmp_path: Path) -> None:
    parsers = ("xcecore.jobspec", "xcecore.jobscript", "shlex")
    plain = _run(cluster.config_path, "submit", "--", "true", names=parsers)
    assert plain.returncode == 0 and _heavy(plain) == [], (plain.stderr, _heavy(plain))
    limited = _run(cluster.config_path, "submit", "-M", "64MB", "-W", "10", "--env", "none", "-x",
                   "-o", "o.%J", "--", "true")
    assert limited.returncode == 0 and _heavy(limited) == [], (limited.stderr, _heavy(limited))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#BSUB -J scripted -M 8MB\ntrue\n")
    scripted = _run(cluster.config_path, "submit", str(script))
    assert scripted.returncode == 0 and _heavy(scripted) == [], (scripted.stderr, _heavy(scripted))


def test_outcome_command(cluster: LocalCluster) -> None:
    res = _run(cluster.config_path, "outcome", "--json", "never-sent")
    assert orjson.loads(res.stdout) == {"rid": "never-sent", "outcome": "not_applied"}
    assert "not applied (final" in _run(cluster.config_path, "outcome", "never-sent").stdout


def test_help_lists_built_in_and_plugin_commands(cluster: LocalCluster) -> None:
    res = subprocess.run([sys.executable, "-m", "xcecore", "--help"], capture_output=True, text=True,
                         env={**os.environ, "XCE_CONFIG": str(cluster.config_path)}, timeout=60)
    assert res.returncode == 0
    commands, _, plugins = res.stdout.partition("plugin commands:")
    for name in ("submit", "jobs", "hosts", "status", "outcome", "run", "plugins", "config"):
        assert f"\n  {name} " in commands
    assert "\n  up " in plugins  # xce_cli's, loaded for the listing only
    res = subprocess.run([sys.executable, "-m", "xcecore", "jobs", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("usage: xce jobs [OPTIONS] [JOBIDS...]")


def test_usage_errors_and_unknown_commands(tmp_path: Path) -> None:
    def xce(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "XCE_CONFIG": ""})

    bad = xce("jobs", "--nope")
    assert bad.returncode == 2 and "unrecognized option: --nope" in bad.stderr
    bad = xce("jobs", "-s", "RUNNING")
    assert bad.returncode == 2 and "invalid choice: 'RUNNING'" in bad.stderr
    bad = xce("run-job", "3")
    assert bad.returncode == 2 and "option -m/--hosts is required" in bad.stderr
    bad = xce("--timeout", "soon", "jobs")
    assert bad.returncode == 2 and "--timeout: 'soon' is not a number" in bad.stderr
    unknown = xce("nosuch")
    assert unknown.returncode == 1 and "no such command 'nosuch'" in unknown.stderr
    assert "jobs" in unknown.stderr and "up" in unknown.stderr


@pytest.mark.parametrize(("body", "message"), [
    ('[client]\nconnect_timeout = "fast"\n', "client.connect_timeout: expected float or int, got str"),
    ("[client]\nconect_timeout = 1\n", "unknown key client.conect_timeout; keys of [client]: "),
    ('[cluster]\nport = true\naddress = "h"\n', "cluster.port: expected int, got bool"),
    ('[cluster]\npeers = "ctl1:7600,,ctl2:7600"\n', "stray double ','"),
    ("[cluster]\npeers = 5\n", "cluster.peers: expected str or list, got int"),
    ("[client]\nbackoff_cap = 0\n[cluster]\npeers = \"127.0.0.1:1\"\n",
     "ClientConfig.backoff_cap must be positive, got 0.0"),
    ("client = 3\n", "client: must be a table ([client]), got int"),
    ("[cluster\n", "is not valid TOML"),
])
def test_bad_client_settings_are_one_line_with_the_loaders_message(tmp_path: Path, body: str,
                                                                   message: str) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text(body)
    res = subprocess.run([sys.executable, "-m", "xcecore", "--config", str(cfg), "jobs"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_light_reader_and_loader_agree(tmp_path: Path) -> None:
    """The one-shot reader's checks are the configuration loader's, message for message."""
    from xcecore.client.settings import SettingsError, read_sections
    from xcecore.config import CORE_SECTIONS, ConfigError, read_file, validate

    bodies = ['[client]\nliveness_timeout = "x"\n', "[client]\nheartbeat_interval = [1]\n",
              "[client]\nbogus = 1\n", "[cluster]\nmax_frame = 1.5\n", "[cluster]\nkey = 7\n",
              '[cluster]\nallow_unlisted_redirect = "yes"\n', "[cluster]\naddress = 1\n",
              "cluster = []\n", "[client]\nbackoff_base = 1\n"]
    for n, body in enumerate(bodies):
        path = tmp_path / f"c{n}.toml"
        path.write_text(body)
        light: Any = None
        try:
            read_sections(str(path))
        except SettingsError as exc:
            light = str(exc)
        try:
            validate(read_file(path)[1], CORE_SECTIONS)
            loader = None
        except ConfigError as exc:
            loader = str(exc)
        assert light == loader, body


def test_a_one_shot_command_leaves_at_once_with_its_status_and_output(tmp_path: Path) -> None:
    """cli() ends a one-shot command with os._exit after flushing its output: the statuses
    and output are the command's, and a reader that went away is no traceback (status 141,
    as a shell reports a writer killed by SIGPIPE)."""
    env = {**os.environ, "XCE_CONFIG": str(tmp_path / "absent.toml")}
    ok = subprocess.run([sys.executable, "-m", "xcecore", "version"], capture_output=True,
                        text=True, env=env, timeout=60)
    assert (ok.returncode, ok.stdout.startswith("xce "), ok.stderr) == (0, True, "")
    bad = subprocess.run([sys.executable, "-m", "xcecore", "jobs"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("Error: config file"), bad.stderr
    usage = subprocess.run([sys.executable, "-m", "xcecore", "jobs", "--bogus"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert usage.returncode == 2 and "unrecognized option: --bogus" in usage.stderr
    gone = subprocess.Popen([sys.executable, "-m", "xcecore", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert gone.stdout is not None and gone.stderr is not None
    gone.stdout.close()  # the reader leaves before the command writes
    err = gone.stderr.read().decode()
    assert gone.wait(timeout=60) == 141 and "Traceback" not in err and "Exception" not in err, err
