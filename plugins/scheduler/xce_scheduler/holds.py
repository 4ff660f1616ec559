"""Reservations held by running jobs: a job's ``rusage`` amounts stay taken off its hosts'
values while it runs, as LSF does, for ``duration`` minutes when given, decreasing linearly
to nothing over the duration with ``decay=1``.

The picker thread owns one :class:`RunningHolds` and tells it when a job with rusage starts
(leaves PEND for an active state) and when it ends. Per host and resource it keeps the sum of
the constant amounts and, for decaying ones, the two sums of the linear function
``amount(t) = a - (a / d) * (t - s)``, so the amount held on a host at any time costs a few
additions, never a walk over the jobs; holds with a duration end from a heap of their end
times. A cycle asks only for the hosts that hold something (:meth:`RunningHolds.held`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

EPSILON = 1e-9  # below this a sum left by subtractions is nothing


@dataclass(frozen=True, slots=True)
class Part:
    """One resource amount of one job on one host."""

    host: str
    name: str
    amount: float
    start: float
    duration: float | None  # seconds, None: while the job runs
    decay: bool


class _Sum:
    """Per host and resource: constant amounts, and ``base - slope * t`` of decaying ones."""

    __slots__ = ("base", "const", "parts", "slope")

    def __init__(self) -> None:
        self.const = self.base = self.slope = 0.0
        self.parts = 0

    def add(self, p: Part, sign: float) -> None:
        self.parts += 1 if sign > 0 else -1
        if p.decay and p.duration:
            rate = p.amount / p.duration
            self.base += sign * (p.amount + rate * p.start)
            self.slope += sign * rate
        else:
            self.const += sign * p.amount

    def at(self, now: float) -> float:
        value = self.const + (self.base - self.slope * now)
        return value if value > EPSILON else 0.0


class RunningHolds:
    """The rusage amounts running jobs hold, per host (one thread: the picker's)."""

    def __init__(self) -> None:
        self._jobs: dict[int, tuple[Part, ...]] = {}
        self._sums: dict[str, dict[str, _Sum]] = {}
        self._ends: list[tuple[float, int, int]] = []  # (end time, jobid, generation)
        self._gen: dict[int, int] = {}  # a holding job -> its generation (stale heap entries)
        self._next = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, jobid: object) -> bool:
        return jobid in self._jobs

    def start(self, jobid: int, holds: Iterable[tuple[str, Mapping[str, float]]], start: float,
              durations: Mapping[str, float | None], decays: Mapping[str, int | None]) -> None:
        """Job ``jobid`` runs since ``start`` holding ``holds`` (host, resource -> amount);
        ``durations`` in minutes and ``decays`` (0/1) per resource, as rusage gives them."""
        self.end(jobid)
        parts: list[Part] = []
        ends: set[float] = set()
        for host, amounts in holds:
            for name, amount in amounts.items():
                minutes = durations.get(name)
                duration = float(minutes) * 60.0 if minutes else None
                part = Part(host, name, float(amount), start, duration, bool(decays.get(name)))
                parts.append(part)
                self._sum(host, name).add(part, 1.0)
                if duration is not None:
                    ends.add(start + duration)
        if not parts:
            return
        self._jobs[jobid] = tuple(parts)
        self._next += 1
        gen = self._gen[jobid] = self._next
        for end in ends:  # the parts without a duration wait for the job's end
            heapq.heappush(self._ends, (end, jobid, gen))

    def end(self, jobid: int) -> None:
        """Job ``jobid`` no longer holds anything (it ended, or was requeued)."""
        parts = self._jobs.pop(jobid, None)
        self._gen.pop(jobid, None)
        if parts is None:
            return
        for part in parts:
            self._drop(part)

    def due(self, now: float) -> bool:
        """Whether a hold with a duration has ended by ``now`` (a cycle should look again)."""
        return bool(self._ends) and self._ends[0][0] <= now

    def held(self, now: float) -> dict[str, dict[str, float]]:
        """What is held at ``now``: host -> resource -> amount (only hosts holding some)."""
        self._expire(now)
        out: dict[str, dict[str, float]] = {}
        for host, sums in self._sums.items():
            mine = {name: value for name, s in sums.items() if (value := s.at(now)) > 0}
            if mine:
                out[host] = mine
        return out

    def _expire(self, now: float) -> None:
        """Parts whose duration has passed stop holding (from the heap: only what is due)."""
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, jobid, gen = heapq.heappop(ends)
            parts = self._jobs.get(jobid)
            if parts is None or self._gen.get(jobid) != gen:
                continue  # ended or started again since
            left = []
            for part in parts:
                if part.duration is not None and part.start + part.duration <= now:
                    self._drop(part)
                else:
                    left.append(part)
            if left:
                self._jobs[jobid] = tuple(left)
            else:
                del self._jobs[jobid]
                del self._gen[jobid]

    def _sum(self, host: str, name: str) -> _Sum:
        sums = self._sums.setdefault(host, {})
        s = sums.get(name)
        if s is None:
            s = sums[name] = _Sum()
        return s

    def _drop(self, part: Part) -> None:
        sums = self._sums.get(part.host)
        s = sums.get(part.name) if sums is not None else None
        if s is None or sums is None:
            return
        s.add(part, -1.0)
        if s.parts <= 0:
            del sums[part.name]
            if not sums:
                del self._sums[part.host]
