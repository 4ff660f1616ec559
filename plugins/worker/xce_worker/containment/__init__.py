"""Job containment: every process of a job in one group that is limited, accounted and killed.

A *containment* (Slurm's proctrack + task plugins in one) makes a :class:`JobGroup` per job
attempt. The process manager starts the job's wrapper gated (it waits on a pipe), puts it in
the group (:meth:`JobGroup.attach`: limits, cores, membership) and only then lets it run, so
nothing the job does escapes the group. Three built-ins, registered through the worker's
``xce_worker_containments`` hook like a third party's (:mod:`xce_worker.hookspecs`):

- ``cgroup2`` (:mod:`.cgroup2`): the unified hierarchy; kill by ``cgroup.kill``, stop by
  ``cgroup.freeze``, memory/cpuset/pids controllers where the worker may enable them;
- ``cgroup1`` (:mod:`.cgroup1`): the legacy per-controller hierarchies (``memory``,
  ``cpuacct``, ``cpuset``, ``freezer``); kill by freezing, killing every member, thawing;
- ``fallback`` (:mod:`.fallback`): a process group and session, rlimits, sampling.

``[worker] containment = "auto"`` takes the available one that can do most (each one's
``probe`` scores itself); naming one that is not available here is an error that says why.
Groups are named ``<parent>/xce-<host>-<tag>/job-<jobid>.<attempt>`` in each hierarchy,
where ``<tag>`` is a digest of the worker's state directory (:func:`instance_of`); the
worker lists its group directories in ``<state_dir>/cgroups``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MB = 1024 * 1024


class ContainmentError(RuntimeError):
    """A containment cannot be used or a group cannot be made; the message says why."""


class Unavailable(ContainmentError):
    """Raised by a probe: this containment cannot work on this host (the reason why)."""


@dataclass(frozen=True, slots=True)
class ContainConfig:
    """What a containment is built from (``[worker]`` keys)."""

    hname: str
    parent: str = ""  # cgroup path under which xce-<host> goes; "" = the worker's own cgroup
    freezer: bool = True  # stop/resume by the freezer where there is one (else SIGSTOP/CONT)
    instance: str = ""  # tells apart workers posing as the same host on one machine

    @property
    def base_name(self) -> str:
        """``xce-<host>`` or ``xce-<host>-<instance>``: the worker's own group directory."""
        from xce_worker.containment.cgroupfs import safe_name

        name = f"xce-{safe_name(self.hname)}"
        return f"{name}-{safe_name(self.instance)}" if self.instance else name


def instance_of(state_dir: Path) -> str:
    """A short tag of a worker's state directory: two workers never share job groups (and
    never clean up each other's) unless they share a state directory, i.e. are one worker."""
    import hashlib

    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class Limits:
    """What a job's group enforces: memory (bytes) and the cores it is bound to."""

    mem: int | None = None
    cpus: tuple[int, ...] = ()


@dataclass(slots=True)
class Usage:
    """A job's resource usage: CPU seconds, memory now and at its peak (bytes)."""

    utime: float = 0.0
    stime: float = 0.0
    mem: int = 0
    max_mem: int = 0
    swap: int | None = None
    pids: list[int] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """The ``usage`` object of ``update_jusage`` and of end reports (MB, seconds)."""
        out: dict[str, Any] = {
            "utime": round(self.utime, 3), "stime": round(self.stime, 3),
            "cputime": round(self.utime + self.stime, 3), "mem": round(self.mem / MB, 3),
            "max_mem": round(self.max_mem / MB, 3), "nprocs": len(self.pids),
            "pids": self.pids[:64],
        }
        if self.swap is not None:
            out["swap"] = round(self.swap / MB, 3)
        return out


class JobGroup(ABC):
    """One job attempt's group. Thread-safe enough for one owner (the process manager)."""

    name: str
    kernel_mem_limit: bool = False
    """True when the kernel enforces ``Limits.mem`` (an OOM kill in the group); otherwise the
    process manager enforces it by sampling :meth:`usage`."""
    freezer: bool = False
    """True when :meth:`freeze`/:meth:`thaw` stop the whole group (else SIGSTOP/SIGCONT)."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self._peak = 0  # sampled, for groups whose kernel keeps no peak

    @abstractmethod
    def attach(self, pid: int) -> None:
        """Put process ``pid`` (the gated wrapper, before it runs anything) in the group and
        apply the limits; raise :class:`ContainmentError` if it cannot be contained."""

    @abstractmethod
    def pids(self) -> list[int]:
        """Every process in the group now."""

    def signal(self, sig: int) -> int:
        """Send ``sig`` to every member; how many got it."""
        from xce_worker.containment.cgroupfs import kill_pids

        return kill_pids(self.pids(), sig)

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL every member, including ones forking right now (as far as this
        containment can: the cgroup ones can, the fallback cannot catch a setsid)."""

    def freeze(self) -> None:
        """Stop every member (only when :attr:`freezer`)."""
        raise NotImplementedError(f"{type(self).__name__} has no freezer")

    def thaw(self) -> None:
        """Let every member run again (only when :attr:`freezer`)."""
        raise NotImplementedError(f"{type(self).__name__} has no freezer")

    @abstractmethod
    def usage(self) -> Usage:
        """Cumulative CPU time and memory of the group, now (peak so far included)."""

    def oom_killed(self) -> bool:
        """True if the kernel killed a member because the group hit its memory limit."""
        return False

    def final_usage(self, rusage: Any | None) -> Usage:
        """The usage once the job ended (read before :meth:`destroy`); ``rusage`` is the
        wrapper's ``wait4`` rusage, which the fallback relies on."""
        return self.usage()

    def sample_members(self, u: Usage) -> None:
        """Fill ``u.max_mem`` (the members' ``VmHWM`` summed, folded into the sampled peak)
        and ``u.swap`` (their ``VmSwap``) from ``u.pids``: for groups whose kernel keeps no
        peak or swap figure of the whole group."""
        from xce_worker.containment.cgroupfs import proc_memory

        figures = [proc_memory(p) for p in u.pids]
        self._peak = max(self._peak, u.mem, sum(h for h, _ in figures))
        u.max_mem = self._peak
        u.swap = sum(s for _, s in figures)

    @abstractmethod
    def destroy(self) -> bool:
        """Remove the group once it is empty; True if it is gone."""

    def wait_empty(self, timeout: float) -> bool:
        """Wait (polling, bounded) until no process is left in the group."""
        deadline = time.monotonic() + timeout
        delay = 0.002
        while self.pids():
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True


class Containment(ABC):
    """Makes, re-opens and cleans up the job groups of one worker."""

    name: str

    def __init__(self, config: ContainConfig) -> None:
        self.config = config

    @abstractmethod
    def describe(self) -> str:
        """One line for the worker's start log: what it uses, where, what it enforces."""

    @abstractmethod
    def create(self, key: str, limits: Limits) -> JobGroup:
        """A new, empty group for job attempt ``key`` (``<jobid>.<attempt>``)."""

    @abstractmethod
    def reopen(self, key: str) -> JobGroup | None:
        """The group of a job attempt a previous run of this worker started, if it exists."""

    @abstractmethod
    def existing(self) -> list[str]:
        """The keys of every group of this worker that exists now."""

    def adopt(self, key: str, pid: int | None) -> JobGroup | None:
        """The group of a job a previous run of this worker started, whose wrapper was
        ``pid`` (None if it never ran); None if nothing of it can be found."""
        return self.reopen(key)

    def close(self) -> None:
        """The worker stops: remove what the containment made that is now empty."""
        return None  # nothing by default: the fallback makes nothing

    def cleanup_stale(self, keep: Iterable[str]) -> list[str]:
        """Kill what is left in, and remove, every group not in ``keep`` (at start: groups
        of jobs that ended while the worker was down); the keys removed."""
        keep = set(keep)
        removed: list[str] = []
        for key in self.existing():
            if key in keep:
                continue
            group = self.reopen(key)
            if group is None:
                continue
            group.kill()
            group.wait_empty(5.0)
            if group.destroy():
                removed.append(key)
        return removed

    def bases(self) -> list[Path]:
        """The directories this containment makes job groups in (none for the fallback)."""
        return []

    def cpus(self) -> list[int]:
        """The CPUs jobs may be bound to: those this worker may run on."""
        import os

        return sorted(os.sched_getaffinity(0))


class EndedGroup(JobGroup):
    """The group of a job that ended while the worker was down and left nothing behind."""

    def __init__(self, key: str) -> None:
        super().__init__(f"ended-{key}", Limits())

    def attach(self, pid: int) -> None:
        """An ended job takes no process."""
        raise ContainmentError(f"group {self.name} belongs to a job that ended")

    def pids(self) -> list[int]:
        """None."""
        return []

    def kill(self) -> None:
        """Nothing to kill."""

    def usage(self) -> Usage:
        """Nothing is known."""
        return Usage()

    def destroy(self) -> bool:
        """Nothing to remove."""
        return True


@dataclass(frozen=True, slots=True)
class ContainmentSpec:
    """A containment a plugin registers (``xce_worker_containments``).

    ``probe(config)`` returns a score (higher: does more; ``auto`` takes the best) or raises
    :class:`Unavailable` with the reason; ``factory(config)`` builds it.
    """

    name: str
    probe: Callable[[ContainConfig], int]
    factory: Callable[[ContainConfig], Containment]
    description: str = ""


def select(specs: Mapping[str, ContainmentSpec], choice: str,
           config: ContainConfig) -> Containment:
    """The containment ``choice`` names (or the best available one for ``auto``)."""
    if choice != "auto":
        spec = specs.get(choice)
        if spec is None:
            raise ContainmentError(f"worker.containment {choice!r} is not registered; choose "
                                   f"one of: auto, {', '.join(sorted(specs))}")
        try:
            spec.probe(config)
        except Unavailable as exc:
            raise ContainmentError(f"worker.containment {choice!r} is not available on "
                                   f"{config.hname}: {exc}") from None
        return spec.factory(config)
    best: tuple[int, ContainmentSpec] | None = None
    why: list[str] = []
    for spec in specs.values():
        try:
            score = spec.probe(config)
        except Unavailable as exc:
            why.append(f"{spec.name}: {exc}")
            continue
        if best is None or score > best[0]:
            best = (score, spec)
    if best is None:
        raise ContainmentError("no job containment is available: " + "; ".join(why))
    return best[1].factory(config)


def builtin_specs() -> list[ContainmentSpec]:
    """The built-in containments (their modules load only when probed)."""
    def probe(module: str) -> Callable[[ContainConfig], int]:
        def run(config: ContainConfig) -> int:
            import importlib

            return int(importlib.import_module(module).probe(config))
        return run

    def factory(module: str) -> Callable[[ContainConfig], Containment]:
        def run(config: ContainConfig) -> Containment:
            import importlib

            made: Containment = importlib.import_module(module).build(config)
            return made
        return run

    return [
        ContainmentSpec("cgroup2", probe("xce_worker.containment.cgroup2"),
                        factory("xce_worker.containment.cgroup2"), "cgroup v2 (unified)"),
        ContainmentSpec("cgroup1", probe("xce_worker.containment.cgroup1"),
                        factory("xce_worker.containment.cgroup1"),
                        "cgroup v1 (memory, cpuacct, cpuset, freezer, pids hierarchies)"),
        ContainmentSpec("fallback", probe("xce_worker.containment.fallback"),
                        factory("xce_worker.containment.fallback"),
                        "process group and session, rlimits, sampled limits"),
    ]


def remove_groups(base: Path) -> bool:
    """Kill every process in, and remove, the job groups under ``base`` and ``base`` itself
    (a worker's directory of one hierarchy); True if it is gone. For tests and operators
    cleaning up after a worker that cannot (SIGKILLed with jobs running)."""
    import signal as _signal

    from xce_worker.containment.cgroupfs import kill_pids, read_pids, remove_dir

    if not base.is_dir():
        return True
    for group in [p for p in base.iterdir() if p.is_dir()]:
        deadline = time.monotonic() + 5.0
        while (pids := read_pids(group / "cgroup.procs")) and time.monotonic() < deadline:
            state = group / "freezer.state"
            if state.exists():
                state.write_text("THAWED")
            kill_pids(pids, _signal.SIGKILL)
            time.sleep(0.01)
        remove_dir(group)
    return remove_dir(base)


def remove_listed(root: Path, depth: int = 4) -> int:
    """Remove the job groups of every worker whose state directory is ``root`` or lies up to
    ``depth`` levels below it (each worker lists its group directories in
    ``<state_dir>/cgroups``), killing what is still in them; how many directories were listed.
    For tests, benchmarks and ``xce up`` cleaning up after workers that were SIGKILLed."""
    import contextlib

    listed = 0
    for pattern in ["/".join(["*"] * n + ["cgroups"]) for n in range(depth + 1)]:
        for record in root.glob(pattern):
            with contextlib.suppress(OSError):
                for line in record.read_text().splitlines():
                    if line.strip():
                        listed += 1
                        with contextlib.suppress(OSError):
                            remove_groups(Path(line.strip()))
    return listed
