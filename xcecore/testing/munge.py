"""A real ``munged`` for tests and benchmarks, and throwaway system users.

:class:`Munged` runs the Debian ``munge`` daemon with its own key, socket, pid, seed and log
files in a directory of its own (never the host's ``/etc/munge`` or ``/run/munge``), in the
foreground as a child process ended by its pid. It runs as root with ``--force`` (munged
otherwise insists on a dedicated owner of its files). Two daemons with different keys make
"a credential from another cluster" real.

:class:`TestUsers` creates system users with ``useradd`` (no home, no login shell) and removes
them with ``userdel``; both need root. Missing tools or privileges raise :class:`MissingTool`
naming what is missing, so a test fails with the reason instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

KEY_BYTES = 128  # munged wants 32..1024 bytes; mungekey's default is 128 (1024 bits)


class MissingTool(RuntimeError):
    """A tool or privilege a MUNGE test needs is missing (the message names it)."""


def require(*tools: str, root: bool = False) -> None:
    """Raise :class:`MissingTool` unless every tool is on PATH (and, if ``root``, we are root)."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise MissingTool(f"needs {', '.join(missing)} (Debian: run scripts/install-system-deps.sh, "
                          "which installs munge, libmunge2 and passwd)")
    if root and os.geteuid() != 0:
        raise MissingTool(f"needs root (to run {', '.join(tools)})")


def shared_dir(prefix: str) -> Path:
    """A fresh temporary directory every user may enter and read (mode 0755): for files that
    processes of the test users read (a cluster's config, munged's socket)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


class Munged:
    """One ``munged`` with its own key in ``root`` (created 0755; the key file 0600).

    ``key``: the key's bytes (default: fresh random ones). ``max_ttl``: munged's longest
    credential lifetime. Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, root: Path, *, key: bytes | None = None, max_ttl: int = 3600) -> None:
        require("munged", root=True)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # users' clients reach the socket through it
        self.key_file = root / "munge.key"
        self.socket = str(root / "munge.socket")
        self.pid_file = root / "munged.pid"
        self.log = root / "munged.log"
        self.key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        self.max_ttl = max_ttl
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """munged's process id (it runs in the foreground: the child itself)."""
        if self.popen is None:
            raise RuntimeError("munged is not started")
        return self.popen.pid

    def start(self, timeout: float = 10.0) -> Munged:
        """Write the key, start munged and wait until its socket answers a credential."""
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.key)
        cmd = ["munged", "--foreground", "--force", f"--key-file={self.key_file}",
               f"--socket={self.socket}", f"--pid-file={self.pid_file}",
               f"--log-file={self.log}", f"--seed-file={self.root / 'munged.seed'}",
               f"--max-ttl={self.max_ttl}", "--num-threads=4"]
        with self.log.open("ab") as fh:
            self.popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        from xcecore.auth.munge import SUCCESS, Libmunge

        lib = Libmunge(self.socket)
        deadline = time.monotonic() + timeout
        detail = ""
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"munged exited ({self.popen.returncode}): {self.text()[-2000:]}")
            if os.path.exists(self.socket):
                err, detail = lib.encode(b"ready")
                if err == SUCCESS:
                    return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"munged at {self.socket} not answering after {timeout} s: {detail}; "
                           f"{self.text()[-2000:]}")

    def text(self) -> str:
        """What munged logged."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM munged by its pid, SIGKILL after ``timeout``; reap it."""
        if self.popen is None or self.popen.poll() is not None:
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout)

    def __enter__(self) -> Munged:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class User(NamedTuple):
    """A system user a test created."""

    name: str
    uid: int
    gid: int


class TestUsers:
    """System users made for one test (``useradd``), all removed by :meth:`remove`."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        require("useradd", "userdel", root=True)
        self.made: list[User] = []
        self.tag = secrets.token_hex(3)
        self._opened: dict[str, int] = {}  # directory -> its mode before :meth:`open_code`

    def open_code(self) -> None:
        """Let the test users reach this environment's code: every directory above the
        interpreter's package paths and the sources of editable installs gets the others'
        search bit (``o+x``) if it lacks it -- a checkout in a ``mktemp -d`` directory (0700)
        or under ``/root`` is otherwise closed to them. Nothing is made readable that was not;
        :meth:`remove` puts every mode back."""
        import sysconfig

        import xcecore

        # The venv's packages and the checkout (the plugins' editable sources live in it);
        # not the interpreter's own library: the users run the system's Python.
        roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                 str(Path(xcecore.__file__).resolve().parents[1])}
        for root in roots:
            real = Path(os.path.realpath(root))
            for d in [real, *real.parents]:
                mode = os.stat(d).st_mode
                if not mode & 0o001 and str(d) not in self._opened:
                    self._opened[str(d)] = mode & 0o7777
                    os.chmod(d, (mode & 0o7777) | 0o001)

    def add(self, label: str) -> User:
        """A new user ``xce<label><tag>`` (a short random tag: concurrent runs never clash),
        with its own group, no home directory and no login shell."""
        import pwd

        name = f"xce{label}{self.tag}"[:31]
        deadline = time.monotonic() + 10
        while True:  # another process may hold /etc/passwd's lock for a moment
            done = subprocess.run(["useradd", "--no-create-home", "--user-group",
                                   "--shell", "/usr/sbin/nologin", name],
                                  capture_output=True, text=True, check=False)
            if done.returncode == 0:
                break
            if "lock" not in done.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"useradd {name} failed: {done.stderr.strip()}")
            time.sleep(0.1)
        entry = pwd.getpwnam(name)
        user = User(name, entry.pw_uid, entry.pw_gid)
        self.made.append(user)
        if len(self.made) == 1:
            self.open_code()
        return user

    def leftovers(self) -> list[int]:
        """Pids of processes still running as a user made here (jobs a test left running)."""
        uids = {u.uid for u in self.made}
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid in uids:
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def remove(self) -> list[str]:
        """Remove every user made here (and its group), ending first, by pid, any process
        still running as one of them (nothing else can be: the uids are fresh); the errors,
        if any."""
        errors = []
        for _ in range(50):
            pids = self.leftovers()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)  # the kernel reaps them (their parent, the worker, is gone)
        for user in reversed(self.made):
            deadline = time.monotonic() + 10
            while True:
                done = subprocess.run(["userdel", user.name], capture_output=True, text=True,
                                      check=False)
                if done.returncode == 0 or "lock" not in done.stderr or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if done.returncode != 0:
                errors.append(f"userdel {user.name}: {done.stderr.strip()}")
        self.made.clear()
        for d, mode in self._opened.items():
            try:
                os.chmod(d, mode)
            except OSError as exc:
                errors.append(f"chmod {d}: {exc}")
        self._opened.clear()
        return errors


def _world_executable(path: str) -> bool:
    """Whether any user may execute ``path`` (the file and every directory above it)."""
    real = os.path.realpath(path)
    parts = Path(real).parents
    try:
        return (os.stat(real).st_mode & 0o001 != 0
                and all(os.stat(p).st_mode & 0o001 != 0 for p in parts))
    except OSError:
        return False


def user_interpreter() -> str:
    """A Python of this version that every user can execute: this one, or the system's
    (a test's venv may live under a directory only root enters, such as ``/root``)."""
    import sys

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if candidate and _world_executable(candidate):
            return candidate
    raise MissingTool(f"needs a Python {version} that unprivileged test users can execute: "
                      f"{sys.executable} is not, nor is /usr/bin/python{version}")


def user_argv(*, module: str | None = None, code: str | None = None, args: tuple[str, ...] = ()) -> list[str]:
    """The argv running ``python -m module args`` (or ``code``) with this environment's
    packages, for a test user's process (see :func:`user_interpreter`)."""
    import sysconfig

    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    boot = "import site, sys\n" + "".join(f"site.addsitedir({p!r})\n" for p in paths)
    if module is not None:
        boot += (f"import runpy\nsys.argv[0] = {module!r}\n"
                 f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    elif code is not None:
        boot += code
    else:
        raise ValueError("user_argv needs module or code")
    return [user_interpreter(), "-c", boot, *args]
