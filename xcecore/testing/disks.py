"""Small real file systems for tests that fill a disk: a tmpfs of a given size, and a writer
that fills one to its last byte."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, why: str = "a test mounts a tmpfs") -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``, e.g. ``"4m"``) mounted on ``path``, unmounted
    on exit (lazily if it is still busy). Needs root: raises :class:`PermissionError` saying
    ``why`` it is needed otherwise."""
    if os.geteuid() != 0:
        raise PermissionError(f"{why}: mounting it needs root (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)]).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: Path) -> int:
    """Write the file ``path`` until its file system is full (ENOSPC even for one byte); the
    bytes written."""
    chunk, written = b"\0" * 65536, 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                written += os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
