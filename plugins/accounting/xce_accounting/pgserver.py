"""A throwaway PostgreSQL server for tests and benchmarks: a real ``postgres`` in a temp dir.

``initdb`` and ``pg_ctl`` from Debian's ``postgresql`` package (``/usr/lib/postgresql/N/bin``),
run as the ``postgres`` user when this process is root (PostgreSQL refuses to run as root),
listening only on a unix socket in the temp dir (no TCP at all). :meth:`PgServer.stop` stops
the postmaster by its pid (SIGINT: fast shutdown; SIGKILL if it lingers) and removes the dir.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = ("PostgreSQL's server (initdb, pg_ctl) is not installed: run "
                "`bash scripts/install-system-deps.sh` (Debian package postgresql)")


def find_bin() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` with initdb and pg_ctl; raises naming the package."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    for initdb in reversed(found):
        bindir = Path(initdb).parent
        if (bindir / "pg_ctl").exists() and (bindir / "postgres").exists():
            return bindir
    raise RuntimeError(INSTALL_HINT)


class PgServer:
    """One running server; ``dsn`` connects to its ``postgres`` database as user ``xce``."""

    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable  # False: fsync and synchronous commit off (tests)
        self.bindir = find_bin()
        self.root = Path(tempfile.mkdtemp(prefix="xce-pg-"))
        self.data = self.root / "data"
        self.port = 5432
        self.pid: int | None = None
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, PostgreSQL needs the 'postgres' user to run "
                                   "as; " + INSTALL_HINT) from None
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid}
        os.chmod(self.root, 0o755)

    @property
    def dsn(self) -> str:
        """The libpq connection string."""
        return f"host={self.root} port={self.port} dbname=postgres user=xce"

    def _run(self, *cmd: str) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root,
                              **self._user)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout)[-2000:]}")

    def start(self) -> PgServer:
        """initdb, then start the postmaster and wait until it accepts connections."""
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "xce", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        opts = f"-k {self.root} -c listen_addresses='' -p {self.port} -c shared_buffers=128MB"
        if not self.durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts, "-w", "-t", "60",
                  "-l", str(self.root / "server.log"), "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self

    def log(self) -> str:
        """The server's log."""
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text()[-4000:]
        return ""

    def stop(self) -> None:
        """Stop the postmaster by its pid and remove the temp dir."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGINT)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    time.sleep(0.05)
                os.kill(self.pid, signal.SIGKILL)
            self.pid = None
        shutil.rmtree(self.root, ignore_errors=True)
