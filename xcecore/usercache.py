"""The per-user cache of one-shot commands: small files in ``$XDG_CACHE_HOME/xce/``
(default ``~/.cache/xce/``).

What is kept there spares a command work it would otherwise redo on every start: the plugin
commands' listing for ``xce --help`` (:mod:`xcecore.cli.plugins`) and the parsed settings
(:mod:`xcecore.client.sectioncache`). A cache must never change what a command does, so
only the user's own entries are read -- owned by the effective uid, not writable by group or
others, in such a directory -- since a planted entry could point a command at another
controller; entries are written atomically (a concurrent command never reads half of one),
mode 0600. Any problem (no home, a read-only disk, a damaged or foreign entry) reads as "not
cached" and writes as nothing: never an error.
"""

from __future__ import annotations

import os


def cache_dir() -> str | None:
    """This user's cache directory (None: no absolute home or cache base to put it in)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xce") if os.path.isabs(base) else None


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def read(name: str) -> bytes | None:
    """The entry ``name``'s bytes, or None (absent, foreign, unreadable)."""
    where = cache_dir()
    if where is None:
        return None
    try:
        if not _trusted(os.stat(where)):
            return None
        fd = os.open(os.path.join(where, name), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if not _trusted(os.fstat(fd)):
                return None
            with os.fdopen(fd, "rb", closefd=False) as fh:
                return fh.read()
        finally:
            os.close(fd)
    except OSError:
        return None


def write(name: str, data: bytes) -> None:
    """Replace the entry ``name`` with ``data`` atomically; nothing on any problem."""
    where = cache_dir()
    if where is None:
        return
    path = os.path.join(where, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        if not _trusted(os.stat(where)):
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        import contextlib

        with contextlib.suppress(OSError):
            os.unlink(tmp)
