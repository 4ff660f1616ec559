"""cgroup v2 (the unified hierarchy): one directory per job under ``<parent>/xce-<host>``.

- membership and kill: ``cgroup.procs``; ``cgroup.kill`` (kernel 5.14+) SIGKILLs every
  member at once, forks in flight included; on older kernels: freeze, SIGKILL, thaw;
- stop/resume: ``cgroup.freeze`` (kernel 5.2+), waiting for ``cgroup.events`` to say
  ``frozen 1``;
- CPU time: ``cpu.stat`` ``user_usec``/``system_usec`` (present without the cpu controller);
- memory (when the ``memory`` controller can be enabled for the worker's groups):
  ``memory.max``, ``memory.swap.max`` 0, ``memory.oom.group`` 1 (an OOM kills the whole
  job, as a job is one unit), ``memory.peak`` (5.19+) and ``memory.events`` ``oom_kill``;
- cores: ``cpuset.cpus`` when the ``cpuset`` controller can be enabled.

Controllers are enabled in ``cgroup.subtree_control`` of the parent and of ``xce-<host>``.
v2 lets no process sit in a cgroup whose children have controllers ("no internal
processes"), so when the parent is the worker's own cgroup and the worker is alone in it, the
worker moves itself into ``<parent>/xce-<host>-daemon`` first (what a systemd unit with
``Delegate=yes`` is expected to do). When controllers cannot be enabled the groups still
track, kill, freeze and account CPU, and memory limits fall back to sampling; the worker's
start line says which.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from loguru import logger

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

WANTED = ("memory", "cpuset", "pids")
PREFIX = "job-"


def _where(config: ContainConfig) -> tuple[Path, bool]:
    """The parent directory for ``xce-<host>``, and whether it is the worker's own cgroup."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = [m for m in parse_mountinfo(fh.read()) if m.version == 2]
    if not mounts:
        raise Unavailable("no cgroup2 file system is mounted")
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        own = parse_proc_cgroup(fh.read()).get("")
    if own is None and not config.parent:
        raise Unavailable("this process is in no v2 cgroup")
    parent = group_path(mounts[0], config.parent or own or "/")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise Unavailable(f"{parent} is not a writable cgroup directory")
    return parent, not config.parent


def probe(config: ContainConfig) -> int:
    """30 when the memory controller is available to the worker's groups, else 10."""
    parent, _ = _where(config)
    try:
        controllers = read_text(parent / "cgroup.controllers").split()
    except CgroupError as exc:
        raise Unavailable(str(exc)) from None
    return 30 if "memory" in controllers else 10


def build(config: ContainConfig) -> CgroupV2:
    """The v2 containment of this worker (base directory made, controllers enabled)."""
    parent, own = _where(config)
    return CgroupV2(config, parent, own)


class CgroupV2(Containment):
    """Job groups in the unified hierarchy."""

    name = "cgroup2"

    def __init__(self, config: ContainConfig, parent: Path, parent_is_own: bool) -> None:
        super().__init__(config)
        self.base = parent / config.base_name
        self.base.mkdir(exist_ok=True)
        available = read_text(parent / "cgroup.controllers").split()
        want = [c for c in WANTED if c in available]
        self.controllers: list[str] = []
        self.problem = ""
        if want:
            self.controllers, self.problem = self._enable(parent, parent_is_own, want)

    def _enable(self, parent: Path, parent_is_own: bool, want: list[str]) -> tuple[list[str], str]:
        """Enable ``want`` for the job groups; what got enabled and, if not all, why."""
        line = " ".join(f"+{c}" for c in want)
        try:
            write_text(parent / "cgroup.subtree_control", line)
        except CgroupError as exc:
            others = [p for p in read_pids(parent / "cgroup.procs") if p != os.getpid()]
            if not parent_is_own or others:
                return [], (f"cannot enable {', '.join(want)} in {parent} ({exc.strerror}); "
                            "give the worker a delegated cgroup of its own (systemd: "
                            "Delegate=yes)")
            daemon = parent / f"{self.base.name}-daemon"
            daemon.mkdir(exist_ok=True)
            write_text(daemon / "cgroup.procs", str(os.getpid()))
            logger.info("worker {}: moved itself into {} so that its job cgroups may have "
                        "controllers", self.config.hname, daemon)
            try:
                write_text(parent / "cgroup.subtree_control", line)
            except CgroupError as exc2:
                return [], f"cannot enable {', '.join(want)} in {parent}: {exc2.strerror}"
        try:
            write_text(self.base / "cgroup.subtree_control", line)
        except CgroupError as exc:
            return [], f"cannot enable {', '.join(want)} in {self.base}: {exc.strerror}"
        return want, ""

    def describe(self) -> str:
        """Where the groups go and which controllers they have."""
        ctl = ", ".join(self.controllers) or "no controllers"
        mem = "by the kernel" if "memory" in self.controllers else "by sampling"
        note = f" ({self.problem})" if self.problem else ""
        kill = "cgroup.kill" if (self.base / "cgroup.kill").exists() else "freezing the group"
        stop = "cgroup.freeze" if self.config.freezer else "SIGSTOP/SIGCONT"
        return (f"cgroup2 at {self.base} ({ctl}){note}; memory limits {mem}, stop/resume by "
                f"{stop}, kill by {kill}")

    def bases(self) -> list[Path]:
        """``xce-<host>-<tag>``."""
        return [self.base]

    def create(self, key: str, limits: Limits) -> JobGroupV2:
        """Make ``job-<key>`` and set its limits."""
        path = self.base / f"{PREFIX}{key}"
        try:
            if not self.base.is_dir():  # removed behind the worker's back: make it again
                self.base.mkdir(exist_ok=True)
                if self.controllers:
                    write_text(self.base / "cgroup.subtree_control",
                               " ".join(f"+{c}" for c in self.controllers))
            path.mkdir(exist_ok=True)
            if "memory" in self.controllers and limits.mem is not None:
                write_text(path / "memory.max", str(limits.mem))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (path / name).exists():
                        write_text(path / name, value)
            if "cpuset" in self.controllers and limits.cpus:
                write_text(path / "cpuset.cpus", format_cpulist(limits.cpus))
        except OSError as exc:
            remove_dir(path)
            raise ContainmentError(f"cannot make cgroup {path}: {exc}") from None
        return JobGroupV2(path.name, limits, path, "memory" in self.controllers,
                          self.config.freezer)

    def reopen(self, key: str) -> JobGroupV2 | None:
        """The job's directory, if it still exists."""
        path = self.base / f"{PREFIX}{key}"
        if not path.is_dir():
            return None
        return JobGroupV2(path.name, Limits(), path, "memory" in self.controllers,
                          self.config.freezer)

    def close(self) -> None:
        """Remove ``xce-<host>`` if no job group is left in it."""
        remove_dir(self.base)

    def existing(self) -> list[str]:
        """Keys of every ``job-*`` directory."""
        try:
            return sorted(p.name[len(PREFIX):] for p in self.base.iterdir()
                          if p.is_dir() and p.name.startswith(PREFIX))
        except FileNotFoundError:
            return []


class JobGroupV2(JobGroup):
    """One job's v2 cgroup."""

    def __init__(self, name: str, limits: Limits, path: Path, memory: bool,
                 use_freezer: bool) -> None:
        super().__init__(name, limits)
        self.path = path
        self.memory = memory
        self.kernel_mem_limit = memory and limits.mem is not None
        self.freezer = use_freezer and (path / "cgroup.freeze").exists()

    def attach(self, pid: int) -> None:
        """Write ``pid`` into ``cgroup.procs``."""
        try:
            write_text(self.path / "cgroup.procs", str(pid))
        except CgroupError as exc:
            raise ContainmentError(f"cannot put pid {pid} in {self.path}: {exc}") from None

    def pids(self) -> list[int]:
        """``cgroup.procs``."""
        return read_pids(self.path / "cgroup.procs")

    def _freeze(self, value: str) -> None:
        write_text(self.path / "cgroup.freeze", value)
        deadline = time.monotonic() + 2.0
        want = int(value)
        while time.monotonic() < deadline:
            events = parse_flat_keyed(read_text(self.path / "cgroup.events"))
            if events.get("frozen", 0) == want or not events.get("populated", 0):
                return
            time.sleep(0.002)

    def freeze(self) -> None:
        """``cgroup.freeze`` 1, until ``cgroup.events`` says frozen."""
        self._freeze("1")

    def thaw(self) -> None:
        """``cgroup.freeze`` 0."""
        self._freeze("0")

    def kill(self) -> None:
        """``cgroup.kill``, or freeze + SIGKILL + thaw where the kernel has no cgroup.kill."""
        if (self.path / "cgroup.kill").exists():
            write_text(self.path / "cgroup.kill", "1")
            return
        freeze = (lambda on: self._freeze("1" if on else "0")) if (self.path / "cgroup.freeze").exists() else None
        kill_group(self.pids, self.wait_empty, freeze)

    def usage(self) -> Usage:
        """``cpu.stat``; ``memory.current``/``memory.peak`` (else summed and sampled)."""
        pids = self.pids()
        u = Usage(pids=pids)
        cpu = parse_flat_keyed(read_text(self.path / "cpu.stat"))
        u.utime, u.stime = cpu.get("user_usec", 0) / 1e6, cpu.get("system_usec", 0) / 1e6
        if self.memory:
            u.mem = read_int(self.path / "memory.current") or 0
            peak = self.path / "memory.peak"
            if peak.exists():
                u.max_mem = read_int(peak) or 0
            else:  # before 5.19: the peak of the samples
                self._peak = max(self._peak, u.mem)
                u.max_mem = self._peak
            swap = self.path / "memory.swap.current"
            if swap.exists():
                u.swap = read_int(swap) or 0
        else:
            stats = [proc_stat(p) for p in pids]
            u.mem = sum(s.rss for s in stats if s is not None)
            self.sample_members(u)
        return u

    def oom_killed(self) -> bool:
        """``memory.events`` counted an OOM kill in the group."""
        if not self.memory:
            return False
        try:
            events = parse_flat_keyed(read_text(self.path / "memory.events"))
        except CgroupError:
            return False
        return events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0

    def destroy(self) -> bool:
        """rmdir (the group must be empty)."""
        return remove_dir(self.path)
