"""The dashboard's test kit: an API server on a real cluster, and a real headless Chromium.

:func:`chromium` starts Debian's ``chromedriver`` (which starts ``chromium``) through
selenium, with a profile directory of its own, and on the way out ends every process of that
tree by pid -- chromedriver, chromium and its zygote/renderer/GPU children -- also when the
test failed or selenium could not quit cleanly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from xce_apiserver.auth import hash_password, write_token_key

from xcecore.testing import LocalCluster, Proc, wait_for

USER, PASSWORD = "alice", "pw"


def start_api(cluster: LocalCluster, tmp_path: Path, listen: str = "127.0.0.1:0") -> tuple[Proc, str]:
    """Start an API server with user alice/pw and a token key file (a restarted one on the
    same ``listen`` accepts the tokens of the last); (its process, its base URL) once ready."""
    port_file = tmp_path / "api.port"
    port_file.unlink(missing_ok=True)
    key = tmp_path / "token.key"
    if not key.exists():
        write_token_key(str(key))
    users = (f'[{{name = "{USER}", password_hash = "{hash_password(PASSWORD, iterations=1000)}", '
             'role = "user"}]')
    proc = cluster.start_role("apiserver", f'apiserver.listen="{listen}"',
                              f'apiserver.port_file="{port_file}"', f"apiserver.users={users}",
                              f'apiserver.token_key_file="{key}"')
    wait_for(lambda: (port_file.exists() and port_file.read_text().strip()) or not proc.alive(),
             30, what="the API server's port file")
    assert proc.alive(), proc.text()
    base = f"http://127.0.0.1:{int(port_file.read_text())}"
    wait_for(lambda: httpx.get(f"{base}/xce/v1/readyz").status_code == 200, 30, what="readyz")
    return proc, base


def logon(base: str) -> dict[str, str]:
    """Headers with a fresh bearer token of alice."""
    r = httpx.post(f"{base}/xce/v1/auth/logon", json={"username": USER, "password": PASSWORD})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['data']['token']}"}


def _children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (from /proc)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _tree(root: int) -> list[int]:
    kids = _children()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, ()))
    return found


def _profile_pids(profile: Path) -> list[int]:
    """Processes whose command line names ``profile`` (the chromium this test started)."""
    mark = str(profile).encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                continue
    return out


def binary(name: str, *alternatives: str) -> str:
    """The path of ``name`` (or an alternative) on PATH; RuntimeError naming it otherwise."""
    for candidate in (name, *alternatives):
        path = shutil.which(candidate)
        if path is not None:
            return path
    raise RuntimeError(f"{name} not found on PATH: the dashboard test drives Debian's chromium "
                       "and chromium-driver (scripts/install-system-deps.sh installs them)")


@contextlib.contextmanager
def chromium(tmp_path: Path, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A selenium driver of a headless Chromium; every process of it ended on the way out."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise RuntimeError("selenium is not installed: pip install -r requirements-dev.txt") from None
    browser = binary("chromium", "chromium-browser")
    driver_path = binary("chromedriver")
    profile = tmp_path / "chromium-profile"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(arg)
    service = Service(executable_path=driver_path, log_output=str(tmp_path / "chromedriver.log"))
    driver = None
    pids: list[int] = []
    try:
        driver = webdriver.Chrome(service=service, options=options)
        yield driver
    finally:
        proc = getattr(service, "process", None)
        if proc is not None:
            pids = _tree(proc.pid)
        pids += _profile_pids(profile)
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        with contextlib.suppress(Exception):
            service.stop()
        for pid in dict.fromkeys(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _profile_pids(profile):
            time.sleep(0.05)
        left = _profile_pids(profile)
        assert not left, f"chromium processes left running: {left}"
