"""Plugins' one-shot commands (``xce.commands`` entry points): found by name without loading
the plugins, listed by ``xce --help``, and a broken one reported with its distribution."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MODULE = '''
from xcecore.cli.spec import arg, command
from xcecore.cli.session import echo


@command("greet", "Say hello (a test plugin's one-shot command).", arg("--name", default="world"))
def greet(s, ns):
    import sys
    loaded = sorted(m for m in sys.modules if m in ("pluggy", "click", "xcecore.plugins"))
    echo(f"hello {ns.name}; loaded: {','.join(loaded) or 'none'}")
    return 3
'''


def _distribution(root: Path) -> None:
    """A distribution ``xce-greet`` on ``root``: a working command and a broken one."""
    (root / "greet_cmds.py").write_text(MODULE)
    meta = root / "xce_greet-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: xce-greet\nVersion: 0.1\n\n")
    (meta / "entry_points.txt").write_text(
        "[xce.commands]\ngreet = greet_cmds\nbroken = no_such_module_here\nsilent = greet_cmds\n")


def _xce(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "xcecore", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_a_plugin_command_runs_without_the_plugins_and_a_broken_one_names_itself(tmp_path: Path) -> None:
    _distribution(tmp_path)
    ran = _xce(tmp_path, "greet", "--name", "ops")
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout.strip() == "hello ops; loaded: none"  # no plugin manager, no click

    helped = _xce(tmp_path, "greet", "--help")
    assert helped.returncode == 0 and "usage: xce greet" in helped.stdout and "--name" in helped.stdout

    broken = _xce(tmp_path, "broken")
    assert broken.returncode == 1
    assert "command 'broken' from xce-greet-0.1: no_such_module_here cannot be imported" in broken.stderr

    listing = _xce(tmp_path, "--help")
    assert listing.returncode == 0, listing.stderr
    plugin_part = listing.stdout.split("plugin commands:", 1)[1]
    assert "greet" in plugin_part and "Say hello" in plugin_part
    assert "broken (xce-greet-0.1): no_such_module_here cannot be imported" in plugin_part
    assert "silent (greet_cmds): the module declares no command 'silent'" in plugin_part
    builtin_part = listing.stdout.split("plugin commands:", 1)[0]
    assert "greet" not in builtin_part
