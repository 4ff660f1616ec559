"""cgroup v1: one directory per job in each of the ``memory``, ``cpuacct``, ``cpuset``,
``freezer`` and ``pids`` hierarchies that are mounted and writable.

- membership: the ``freezer`` hierarchy's ``cgroup.procs`` (else ``pids``, ``cpuacct``,
  ``memory``, ``cpuset``, in that order): a process forked by a job is in its groups, also
  after ``setsid`` or a double fork;
- kill: freeze the group, SIGKILL every member, thaw (Slurm's proctrack/cgroup): a job that
  forks while being killed cannot leave a child behind; without a freezer, SIGKILL rounds
  until the group is empty;
- memory: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` when swap is
  accounted, so a job cannot swap past its limit); the kernel's OOM killer acts inside the
  group only, and ``memory.oom_control``'s ``oom_kill`` count tells the worker it happened;
  ``memory.max_usage_in_bytes`` is the peak;
- CPU time: ``cpuacct.usage`` (nanoseconds, exact), split into user and system time in the
  proportion of ``cpuacct.stat``'s ticks;
- cores: ``cpuset.cpus`` (``cpuset.mems`` copied from the parent, as v1 requires before a
  task may join).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from xce_worker.containment import (
    ContainConfig,
    Containment,
    ContainmentError,
    JobGroup,
    Limits,
    Unavailable,
    Usage,
)
from xce_worker.containment.cgroupfs import (
    CgroupError,
    CgroupMount,
    format_cpulist,
    group_path,
    kill_group,
    parse_flat_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    proc_stat,
    read_int,
    read_pids,
    read_text,
    remove_dir,
    write_text,
)

CONTROLLERS = ("freezer", "memory", "cpuacct", "cpuset", "pids")
MEMBERSHIP_ORDER = ("freezer", "pids", "cpuacct", "memory", "cpuset")
PREFIX = "job-"


def _bases(config: ContainConfig) -> dict[str, Path]:
    """Controller -> the worker's base directory (``.../xce-<host>``) in its hierarchy."""
    mounts: dict[str, CgroupMount] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for m in parse_mountinfo(fh.read()):
            if m.version == 1:
                for c in m.controllers & set(CONTROLLERS):
                    mounts.setdefault(c, m)
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        own = parse_proc_cgroup(fh.read())
    out: dict[str, Path] = {}
    for ctrl, mount in mounts.items():
        parent = config.parent or own.get(ctrl, "/")
        where = group_path(mount, parent)
        if where.is_dir() and os.access(where, os.W_OK):
            out[ctrl] = where / config.base_name
    return out


def probe(config: ContainConfig) -> int:
    """20 with both a memory and a freezer hierarchy, 15 with one of them."""
    try:
        bases = _bases(config)
    except OSError as exc:
        raise Unavailable(f"cannot read the process's cgroups: {exc}") from None
    if "memory" not in bases and "freezer" not in bases:
        raise Unavailable("no writable v1 memory or freezer hierarchy is mounted")
    return 20 if {"memory", "freezer"} <= set(bases) else 15


def build(config: ContainConfig) -> CgroupV1:
    """The v1 containment of this worker (its base directories made)."""
    return CgroupV1(config, _bases(config))


class CgroupV1(Containment):
    """Job groups in the v1 hierarchies."""

    name = "cgroup1"

    def __init__(self, config: ContainConfig, bases: dict[str, Path]) -> None:
        super().__init__(config)
        self.base_dirs = bases
        for ctrl, base in bases.items():
            self._ensure(ctrl, base)

    @staticmethod
    def _ensure(ctrl: str, base: Path) -> None:
        """Make the worker's directory in a hierarchy (again, if someone removed it)."""
        if base.is_dir():
            return
        base.mkdir(exist_ok=True)
        if ctrl == "cpuset":
            _inherit_cpuset(base)

    def bases(self) -> list[Path]:
        """The worker's directory in each hierarchy."""
        return list(self.base_dirs.values())

    def describe(self) -> str:
        """The hierarchies used and where the groups go."""
        where = ", ".join(f"{c} {b}" for c, b in sorted(self.base_dirs.items()))
        mem = "by the kernel" if "memory" in self.base_dirs else "by sampling"
        stop = ("the freezer" if "freezer" in self.base_dirs and self.config.freezer
                else "SIGSTOP/SIGCONT")
        return (f"cgroup1 ({where}); memory limits {mem}, stop/resume by {stop}, kill by "
                f"{'freezing the group' if 'freezer' in self.base_dirs else 'cgroup membership'}")

    def create(self, key: str, limits: Limits) -> JobGroupV1:
        """Make the job's directory in each hierarchy and set its limits."""
        dirs = {c: b / f"{PREFIX}{key}" for c, b in self.base_dirs.items()}
        made: list[Path] = []
        try:
            for ctrl, path in dirs.items():
                self._ensure(ctrl, path.parent)
                path.mkdir(exist_ok=True)
                made.append(path)
                if ctrl == "cpuset":
                    parent = path.parent
                    cpus = format_cpulist(limits.cpus) if limits.cpus else read_text(
                        parent / "cpuset.cpus").strip()
                    write_text(path / "cpuset.cpus", cpus)
                    write_text(path / "cpuset.mems", read_text(parent / "cpuset.mems").strip())
                elif ctrl == "memory" and limits.mem is not None:
                    write_text(path / "memory.limit_in_bytes", str(limits.mem))
                    memsw = path / "memory.memsw.limit_in_bytes"
                    if memsw.exists():
                        write_text(memsw, str(limits.mem))
        except OSError as exc:
            for path in made:
                remove_dir(path)
            raise ContainmentError(f"cannot make cgroup job-{key}: {exc}") from None
        return JobGroupV1(f"{PREFIX}{key}", limits, dirs, self.config.freezer)

    def reopen(self, key: str) -> JobGroupV1 | None:
        """The job's directories, if any hierarchy still has one."""
        dirs = {c: b / f"{PREFIX}{key}" for c, b in self.base_dirs.items()}
        dirs = {c: p for c, p in dirs.items() if p.is_dir()}
        if not dirs:
            return None
        return JobGroupV1(f"{PREFIX}{key}", Limits(), dirs, self.config.freezer)

    def close(self) -> None:
        """Remove the worker's base directories if no job group is left in them."""
        for base in self.base_dirs.values():
            remove_dir(base)

    def existing(self) -> list[str]:
        """Keys of every job directory in any hierarchy."""
        keys: set[str] = set()
        for base in self.base_dirs.values():
            try:
                keys.update(p.name[len(PREFIX):] for p in base.iterdir()
                            if p.is_dir() and p.name.startswith(PREFIX))
            except FileNotFoundError:
                continue
        return sorted(keys)


def _inherit_cpuset(path: Path) -> None:
    """A new v1 cpuset starts empty: give it its parent's CPUs and memory nodes."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not read_text(path / name).strip():
            write_text(path / name, read_text(path.parent / name).strip())


class JobGroupV1(JobGroup):
    """One job's directories across the v1 hierarchies."""

    def __init__(self, name: str, limits: Limits, dirs: dict[str, Path], use_freezer: bool) -> None:
        super().__init__(name, limits)
        self.dirs = dirs
        self.kernel_mem_limit = "memory" in dirs and limits.mem is not None
        self.freezer = use_freezer and "freezer" in dirs
        self._member = next(dirs[c] for c in MEMBERSHIP_ORDER if c in dirs)

    def attach(self, pid: int) -> None:
        """Write ``pid`` into every hierarchy's ``cgroup.procs``."""
        for path in self.dirs.values():
            try:
                write_text(path / "cgroup.procs", str(pid))
            except CgroupError as exc:
                raise ContainmentError(f"cannot put pid {pid} in {path}: {exc}") from None

    def pids(self) -> list[int]:
        """The membership hierarchy's ``cgroup.procs``."""
        return read_pids(self._member / "cgroup.procs")

    def _state(self, want: str) -> None:
        path = self.dirs["freezer"] / "freezer.state"
        write_text(path, want)
        deadline = time.monotonic() + 2.0
        while read_text(path).strip() != want and time.monotonic() < deadline:
            time.sleep(0.002)  # FREEZING: the kernel is stopping the tasks

    def freeze(self) -> None:
        """``freezer.state`` FROZEN (waits until every task is stopped)."""
        self._state("FROZEN")

    def thaw(self) -> None:
        """``freezer.state`` THAWED."""
        self._state("THAWED")

    def kill(self) -> None:
        """Freeze, SIGKILL all, thaw; repeated until empty (bounded)."""
        freeze = (lambda on: self._state("FROZEN" if on else "THAWED")) if "freezer" in self.dirs else None
        kill_group(self.pids, self.wait_empty, freeze)

    def usage(self) -> Usage:
        """CPU from cpuacct, memory from the memory hierarchy (else summed over members)."""
        pids = self.pids()
        u = Usage(pids=pids)
        acct = self.dirs.get("cpuacct")
        stats = [proc_stat(p) for p in pids] if acct is None or "memory" not in self.dirs else []
        if acct is not None:
            # cpuacct.usage is the scheduler's exact total; the user/system split files are
            # tick-sampled (measured here: 2.2 s of 3.1 s for two processes on one core), so
            # they only apportion the total.
            total = (read_int(acct / "cpuacct.usage") or 0) / 1e9
            ticks = parse_flat_keyed(read_text(acct / "cpuacct.stat"))
            user, system = ticks.get("user", 0), ticks.get("system", 0)
            share = user / (user + system) if user + system else 1.0
            u.utime, u.stime = total * share, total * (1.0 - share)
        else:  # members only: the time of processes that ended is lost without cpuacct
            u.utime = sum(s.utime + s.cutime for s in stats if s is not None)
            u.stime = sum(s.stime + s.cstime for s in stats if s is not None)
        mem = self.dirs.get("memory")
        if mem is not None:
            u.mem = read_int(mem / "memory.usage_in_bytes") or 0
            u.max_mem = read_int(mem / "memory.max_usage_in_bytes") or 0
            memsw = mem / "memory.memsw.usage_in_bytes"
            if memsw.exists():
                u.swap = max(0, (read_int(memsw) or 0) - u.mem)
        else:
            u.mem = sum(s.rss for s in stats if s is not None)
            self.sample_members(u)
        return u

    def oom_killed(self) -> bool:
        """``oom_kill`` in ``memory.oom_control`` (kernel 4.13+) counted a kill."""
        mem = self.dirs.get("memory")
        if mem is None:
            return False
        try:
            return parse_flat_keyed(read_text(mem / "memory.oom_control")).get("oom_kill", 0) > 0
        except CgroupError:
            return False

    def destroy(self) -> bool:
        """rmdir every directory (the group must be empty)."""
        gone = True
        for path in self.dirs.values():
            gone = remove_dir(path) and gone
        return gone
