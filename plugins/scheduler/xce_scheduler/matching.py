"""Resource-requirement matching for the picker: host mappings, compiled requirements, placement.

Requirements are compiled through the ``xce_resreq_evaluator`` hook, for a registry built from
the site resources in the pushed cluster configuration; the evaluator is asked again only when
that registry's version changes. A picker cycle evaluates each distinct requirement once over
the usable hosts (select, rusage and order, by the evaluator), then places each job's tasks on
that ordered list with its own running count of free slots, so 10,000 jobs with a handful of
requirements cost a handful of evaluations, not 10,000.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loguru import logger

from xce_scheduler.view import free_slots
from xcecore.resreq import ResourceRegistry

HostMap = dict[str, Any]


def host_map(host: Mapping[str, Any], free: int | None = None) -> HostMap:
    """The evaluator's mapping of a pushed host record (see docs/protocol-ops.md "Host").

    ``hname`` is the host name; ``status`` is ``ok`` only for an open, available host (else
    the record's state, ``closed`` or ``unavail``); the attributes (ncpus, maxmem, type,
    model...) and monitor values (r1m, mem...) are copied; each listed boolean resource is
    True; ``slots`` is the free slots (``free`` when given), ``maxslots`` the host's slots.
    """
    attrs = host.get("attrs") or {}
    out: HostMap = {**attrs, **(host.get("resvals") or {})}
    resources = attrs.get("resources")
    if isinstance(resources, list | tuple):
        for name in resources:
            if isinstance(name, str):
                out[name] = True
    state = host.get("state", "ok")
    out["hname"] = host.get("name", "")
    out["status"] = "ok" if state == "ok" else str(state)
    out["slots"] = free_slots(host) if free is None else free
    out["maxslots"] = host.get("max_slots", 0)
    return out


class Requirements:
    """Compiled requirements for the current site resources, through the evaluator hook.

    ``evaluator_for(registry)`` is the hook call (``ctx.pm.resreq_evaluator``); it is made
    once per registry version. Not thread-safe: the picker thread owns it.
    """

    def __init__(self, evaluator_for: Callable[[ResourceRegistry], Any]) -> None:
        self._evaluator_for = evaluator_for
        self._resources: tuple[Any, ...] | None = None
        self._version: str | None = None
        self.evaluator: Any = None

    def use_resources(self, resources: Sequence[Any]) -> None:
        """Switch to the site resources ``resources`` (cheap when they did not change)."""
        key = tuple(resources)
        if key == self._resources and self.evaluator is not None:
            return
        self._resources = key
        try:
            registry = ResourceRegistry(key)
        except (ValueError, TypeError) as exc:
            logger.error("scheduler: bad site resources in the cluster configuration ({}); "
                         "evaluating requirements with the built-in resources only", exc)
            registry = ResourceRegistry()
        if registry.version != self._version or self.evaluator is None:
            self._version = registry.version
            self.evaluator = self._evaluator_for(registry)
            logger.info("scheduler: resource registry version {} ({} site resource(s))",
                        registry.version, len(key))

    def compile(self, text: str) -> Any:
        """The compiled requirement for ``text``; raises the evaluator's error if invalid."""
        if self.evaluator is None:
            self.use_resources(())
        return self.evaluator.compile(text)


def fast_placement(compiled: Any) -> bool:
    """Whether the picker may place tasks itself on the requirement's ordered hosts.

    True for the built-in evaluator's requirements without ``same[...]`` (``span`` is read
    from the compiled requirement). Others (``same``, or a site evaluator without these
    attributes) are matched by the evaluator per job, with the current free slots.
    """
    span = getattr(compiled, "span", None)
    same = getattr(compiled, "same", None)
    return isinstance(same, tuple) and not same and (span is None or isinstance(span, dict))


class Reservations:
    """Consumable amounts (``rusage``) held on hosts by proposals not yet seen running.

    A job's rusage alternative is reserved once on each host it is placed on; while the
    picker has it in flight (and for the rest of the cycle that placed it), later jobs see
    the host's value minus what is held, so two jobs never count on the same memory.
    """

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: dict[str, dict[str, float]] = {}

    def add(self, host: str, amounts: Mapping[str, float]) -> None:
        """Hold ``amounts`` (resource -> amount) on ``host``."""
        if not amounts:
            return
        mine = self.held.setdefault(host, {})
        for name, amount in amounts.items():
            mine[name] = mine.get(name, 0.0) + float(amount)

    def adjusted(self, host_map: HostMap) -> HostMap:
        """``host_map`` with the held amounts taken off its values (itself if none held)."""
        mine = self.held.get(host_map.get("hname", ""))
        if not mine:
            return host_map
        out = dict(host_map)
        for name, amount in mine.items():
            value = out.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[name] = value - amount
        return out


def rusage_amounts(compiled: Any, alternative: int | None) -> Mapping[str, float]:
    """The amounts of rusage alternative ``alternative`` (empty without rusage)."""
    alts = getattr(compiled, "rusage", None)
    if not alts or alternative is None or not 0 <= alternative < len(alts):
        return {}
    return dict(alts[alternative])


class OrderedCandidates:
    """One requirement's qualifying hosts, best first, and the free slots placement uses.

    ``free`` is shared by every requirement of the cycle: placing a job decrements it, so no
    host is proposed more slots than it has. Free slots only go down within a cycle, so each
    scan starts at a cursor past the hosts that were already too full.
    """

    __slots__ = ("_cursors", "compiled", "free", "names", "qualifies", "span")

    def __init__(self, names: list[str], free: dict[str, int], span: Mapping[str, int] | None,
                 compiled: Any = None, qualifies: Callable[[str], bool] | None = None) -> None:
        self.names = names
        self.free = free
        self.span = span
        self.compiled = compiled
        self.qualifies = qualifies  # a per-host re-check (rusage against held amounts)
        self._cursors: dict[int, int] = {}

    def _advance(self, need: int) -> int:
        """Index of the first host with at least ``need`` free slots (cursor kept per need)."""
        i = self._cursors.get(need, 0)
        names, free = self.names, self.free
        while i < len(names) and free[names[i]] < need:
            i += 1
        self._cursors[need] = i
        return i

    def place(self, ntasks: int) -> list[dict[str, Any]] | None:
        """An allocation of ``ntasks`` (``[{"host", "ntasks"}]``), or None if it does not fit."""
        free, names, ok = self.free, self.names, self.qualifies
        if self.span and "hosts" in self.span:
            for i in range(self._advance(ntasks), len(names)):
                if free[names[i]] >= ntasks and (ok is None or ok(names[i])):
                    return [{"host": names[i], "ntasks": ntasks}]
            return None
        ptile = self.span.get("ptile") if self.span else None
        remaining = ntasks
        alloc: list[dict[str, Any]] = []
        for i in range(self._advance(1), len(names)):
            take = min(free[names[i]], remaining)
            if ptile is not None:
                take = min(take, ptile)
            if take > 0 and (ok is None or ok(names[i])):
                alloc.append({"host": names[i], "ntasks": take})
                remaining -= take
                if not remaining:
                    return alloc
        return None
