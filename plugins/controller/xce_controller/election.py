"""The built-in election: an exclusive ``flock`` on ``<state_dir>/primary.lock``.

The candidate that holds the lock is primary. The kernel drops a ``flock`` the instant its
holder dies (SIGKILL included), so a standby blocked in :meth:`FileLockElection.wait` wakes up
within milliseconds. The primary publishes its address in ``<state_dir>/primary`` (written to a
temporary file and renamed, so a reader never sees half an address), and every candidate
registers itself in ``<state_dir>/candidates/`` so ``status`` can list them.

A site replaces this through the ``xce_controller_election`` hook with any object offering the
same methods.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import orjson


class Election(Protocol):
    """What the controller needs from an election (the hook's contract)."""

    advertise: str

    def try_acquire(self) -> bool:
        """Become primary now if nobody is; never blocks."""

    def wait(self) -> bool:
        """Block until primary (True), or until :meth:`abandon` was called (False)."""

    def abandon(self) -> None:
        """Make a pending or later :meth:`wait` give up (called from another thread)."""

    def publish(self) -> None:
        """Advertise this candidate as the primary."""

    def current_primary(self) -> str | None:
        """The advertised primary's address, or None."""

    def register(self, state: str) -> None:
        """Record this candidate and its state (primary or standby) for ``status``."""

    def candidates(self) -> list[dict[str, Any]]:
        """Every live registered candidate."""

    def release(self) -> None:
        """Stop being primary (withdraw the address, drop the lock)."""


def _safe_name(address: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in address)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FileLockElection:
    """Primary election by an exclusive ``flock`` on a file in the shared state directory."""

    def __init__(self, state_dir: str, advertise: str) -> None:
        self.state_dir = Path(state_dir)
        self.advertise = advertise
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "candidates").mkdir(exist_ok=True)
        self.lock_path = self.state_dir / "primary.lock"
        self.primary_path = self.state_dir / "primary"
        self._fd: int | None = None
        self._held = False
        self._abandoned = threading.Event()
        self._waiting = False
        self._mutex = threading.Lock()

    @property
    def is_primary(self) -> bool:
        """True while this candidate holds the lock."""
        return self._held

    def _open(self) -> int:
        with self._mutex:
            if self._fd is None:
                self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            return self._fd

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never blocks."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = True
        return True

    def wait(self) -> bool:
        """Block (on a thread) until the lock is ours; False if abandoned meanwhile."""
        fd = self._open()
        with self._mutex:
            if self._abandoned.is_set():
                return False
            self._waiting = True
        fcntl.flock(fd, fcntl.LOCK_EX)
        with self._mutex:
            self._waiting = False
            if self._abandoned.is_set():
                # Given up while blocked: hand the lock straight on to the next waiter, and
                # close the descriptor that release() left open for us.
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._fd = None
                return False
            self._held = True
            return True

    def abandon(self) -> None:
        """Make :meth:`wait` return False once it wakes (a blocked flock cannot be interrupted)."""
        self._abandoned.set()

    def publish(self) -> None:
        """Write this candidate's address as the primary's, atomically (rename; no fsync: the
        file is advice for redirects, rewritten at every promotion, and fsync costs ms)."""
        tmp = self.state_dir / f".primary.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(self.advertise + "\n")
        os.replace(tmp, self.primary_path)

    def current_primary(self) -> str | None:
        """The advertised primary, or None when none is advertised."""
        try:
            text = self.primary_path.read_text().strip()
        except OSError:
            return None
        return text or None

    def register(self, state: str) -> None:
        """Record this candidate (address, pid, state) in ``candidates/``."""
        path = self.state_dir / "candidates" / (_safe_name(self.advertise) + ".json")
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        body = {"address": self.advertise, "pid": os.getpid(), "state": state, "since": time.time()}
        tmp.write_bytes(orjson.dumps(body))
        os.replace(tmp, path)

    def candidates(self) -> list[dict[str, Any]]:
        """Registered candidates whose process is alive (pids are only meaningful locally)."""
        out: list[dict[str, Any]] = []
        for path in sorted((self.state_dir / "candidates").glob("*.json")):
            try:
                entry = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(entry, dict) and _pid_alive(int(entry.get("pid", 0)) or -1):
                out.append(entry)
        return out

    def release(self) -> None:
        """Withdraw the address (if it is ours), unregister, and drop the lock."""
        if self._held and self.current_primary() == self.advertise:
            with contextlib.suppress(OSError):
                self.primary_path.write_text("")
        with contextlib.suppress(OSError):
            (self.state_dir / "candidates" / (_safe_name(self.advertise) + ".json")).unlink()
        self._abandoned.set()
        with self._mutex:
            # A thread still blocked in wait() owns the descriptor; it closes it on waking.
            if self._fd is not None and not self._waiting:
                if self._held:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
            self._held = False
