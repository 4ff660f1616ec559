"""The parsed configuration sections a one-shot command reads, kept in the user's cache
(:mod:`xcecore.usercache`) while the file is unchanged.

Parsing TOML is the largest part of a one-shot command's start-up after the interpreter's
own: importing :mod:`tomllib` compiles its regular expressions and pulls in :mod:`datetime`
and :mod:`string` -- several ms of a ~50 ms ``xce jobs`` on a quiet 2-core machine, paid again
by every command for a file that hardly ever changes. So the reader keeps the sections it
needs, as parsed, in :mod:`marshal` form (a built-in module: nothing to import).

"Unchanged" is the file's device, inode, size, modification and change times (ns), checked
with one ``stat`` per command; the entry also names the file and the host (a home directory
shared between hosts must not hand one host's settings to another). An entry is written only
for a file last modified more than :data:`SETTLED` seconds ago: a file rewritten within the
same timestamp tick as its entry could otherwise look unchanged (git's "racy" entries).
A value marshal cannot hold (a TOML date) means no entry: the file is parsed each time.
"""

from __future__ import annotations

import marshal
import os
import time

from xcecore import usercache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SETTLED = 2.0
"""Seconds since a file's last modification before its sections are cached."""
FORMAT = 1
"""Bumped when an entry's layout changes (older entries are then not used)."""


def _entry(path: str) -> tuple[str, tuple[Any, ...]] | None:
    """The entry's name for the file at ``path`` and the stamp that says it is unchanged.
    Errors reaching the file itself propagate (:class:`OSError`)."""
    st = os.stat(path)
    host = os.uname().nodename
    name = f"settings-{host}-" + path.replace("%", "%25").replace("/", "%2F")
    if len(name) > 240:
        return None
    return name, (FORMAT, path, host, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                  st.st_ctime_ns)


def load(path: str) -> dict[str, Any] | None:
    """The cached sections of the file at ``path`` (absolute), or None: no valid entry.
    Errors reaching the file itself propagate (:class:`OSError`)."""
    entry = _entry(path)
    data = usercache.read(entry[0]) if entry is not None else None
    if entry is None or data is None:
        return None
    try:
        stamp, sections = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None
    return sections if stamp == entry[1] and isinstance(sections, dict) else None


def store(path: str, sections: dict[str, Any]) -> None:
    """Cache ``sections`` of the file at ``path`` (absolute) if it has settled; nothing on
    any problem."""
    try:
        entry = _entry(path)
        if entry is None or time.time() - entry[1][6] / 1e9 < SETTLED:
            return
        data = marshal.dumps((entry[1], sections))
    except (OSError, ValueError):  # ValueError: a value marshal cannot hold
        return
    usercache.write(entry[0], data)
