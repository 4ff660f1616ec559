"""Reading the kernel's views of processes and control groups: pure parsers and small I/O.

The parsers take the text of a kernel file (``/proc/self/mountinfo``, ``/proc/<pid>/cgroup``,
``memory.events``, ``cpu.stat``, a CPU list) and return values; they are what the cgroup
implementations and the fallback share, and what the unit tests feed with text. The I/O
helpers read and write one control file each, naming the file in every error.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
CLK_TCK = os.sysconf("SC_CLK_TCK")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class CgroupError(OSError):
    """A control-group operation failed; the message names the file and the cause."""


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """One mounted cgroup hierarchy: v2 (``controllers`` empty) or a v1 one."""

    path: Path
    root: str  # the cgroup path the mount shows at its top ("/" unless namespaced)
    version: int
    controllers: frozenset[str]


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup mounts in ``/proc/self/mountinfo`` text, in order."""
    out: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        fstype, options = rest[0], rest[2]
        mnt = Path(_unescape(fields[4]))
        if fstype == "cgroup2":
            out.append(CgroupMount(mnt, _unescape(fields[3]), 2, frozenset()))
        elif fstype == "cgroup":
            names = {o for o in options.split(",") if o not in ("rw", "ro") and "=" not in o}
            names |= {o.split("=", 1)[1] for o in options.split(",") if o.startswith("name=")}
            out.append(CgroupMount(mnt, _unescape(fields[3]), 1, frozenset(names)))
    return out


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as controller -> path; the v2 entry's key is ``""``.

    A v1 line names several controllers when they are co-mounted (``4:cpu,cpuacct:/x``):
    each gets the path; a named hierarchy is ``name=systemd``.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if not names:
            out[""] = path
        for name in names.split(","):
            if name:
                out[name] = path
    return out


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``memory.events``, ``cpu.stat``, ``memory.oom_control``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_cpulist(text: str) -> list[int]:
    """A kernel CPU list (``0-3,8,10-11``) as sorted CPU numbers; empty text is none."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list")
        cpus.update(range(int(lo), int(hi) + 1) if sep else (int(lo),))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """CPU numbers as a kernel CPU list, ranges folded (``[0, 1, 2, 5]`` -> ``0-2,5``)."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def safe_name(text: str) -> str:
    """``text`` usable as one path component of a cgroup name."""
    return _SAFE.sub("_", text) or "_"


def group_path(mount: CgroupMount, cgroup: str) -> Path:
    """Where cgroup path ``cgroup`` (as ``/proc/<pid>/cgroup`` names it) is in ``mount``."""
    rel = cgroup
    if mount.root != "/" and (cgroup == mount.root or cgroup.startswith(mount.root + "/")):
        rel = cgroup[len(mount.root):]
    return mount.path / rel.lstrip("/")


# ----------------------------------------------------------------------------- file I/O

def read_text(path: Path) -> str:
    """A control file's content; :class:`CgroupError` names the file."""
    try:
        return path.read_text()
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot read {path}: {exc.strerror}") from None


def read_int(path: Path) -> int | None:
    """A control file holding one number (``max`` reads as None)."""
    text = read_text(path).strip()
    return None if text == "max" else int(text)


def write_text(path: Path, value: str) -> None:
    """Write ``value`` to a control file in one write (the kernel takes one per write)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot open {path}: {exc.strerror}") from None
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_pids(procs_file: Path) -> list[int]:
    """The pids in a ``cgroup.procs`` file (an empty list once the group is gone)."""
    try:
        return [int(p) for p in procs_file.read_text().split()]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot read {procs_file}: {exc.strerror}") from None


def remove_dir(path: Path) -> bool:
    """rmdir a cgroup directory; True if it is gone (also if it never was)."""
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise CgroupError(exc.errno, f"cannot remove {path}: {exc.strerror}") from None


def kill_pids(pids: Iterable[int], sig: int) -> int:
    """Send ``sig`` to each pid; the number that got it (gone ones are skipped)."""
    n = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            n += 1
        except ProcessLookupError:
            continue
    return n


def kill_group(pids: Callable[[], list[int]], wait_empty: Callable[[float], bool],
               freeze: Callable[[bool], None] | None) -> None:
    """SIGKILL every member of a group until it is empty (bounded: 50 rounds). With a
    freezer (``freeze``), each round freezes the group first, so a member forking as it
    dies cannot leave a child outside the round, and thaws it so the kills land."""
    for _ in range(50):
        if freeze is not None:
            freeze(True)
        members = pids()
        kill_pids(members, signal.SIGKILL)
        if freeze is not None:
            freeze(False)
        if not members or wait_empty(0.1):
            return


# ----------------------------------------------------------------------------- /proc

@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that job tracking needs (times in seconds)."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    utime: float
    stime: float
    cutime: float
    cstime: float
    rss: int  # bytes


def parse_stat(text: str) -> ProcStat:
    """``/proc/<pid>/stat`` text (the command name may hold spaces and parentheses)."""
    head, _, tail = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    f = tail.split()
    # f[0] is field 3 (state); utime is field 14 -> f[11]; rss (pages) field 24 -> f[21].
    return ProcStat(pid, f[0], int(f[1]), int(f[2]), int(f[3]), int(f[11]) / CLK_TCK,
                    int(f[12]) / CLK_TCK, int(f[13]) / CLK_TCK, int(f[14]) / CLK_TCK,
                    int(f[21]) * PAGE)


def proc_stat(pid: int) -> ProcStat | None:
    """The stat of process ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return parse_stat(fh.read())
    except (OSError, ValueError, IndexError):
        return None


def all_pids() -> list[int]:
    """Every process id on the host (a scan of ``/proc``)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def proc_memory(pid: int) -> tuple[int, int]:
    """Process ``pid``'s peak RSS since it last exec'd (``VmHWM``) and what of it is swapped
    out (``VmSwap``), bytes; zeros once it is gone.

    Unlike ``wait4``'s ``ru_maxrss``, which keeps the RSS the worker had when it forked the
    job's wrapper, ``VmHWM`` starts afresh at exec. ``VmSwap`` is swap, where the virtual
    size (``VmSize``) is only address space.
    """
    hwm = swap = 0
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
                elif line.startswith("VmSwap:"):
                    swap = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return hwm, swap
