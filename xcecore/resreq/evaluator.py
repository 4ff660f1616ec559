"""Compiled requirements and the default evaluator (with its bounded compile cache).

Hosts are mappings of resource name -> value; a missing key (or ``None``) is unknown, an
absent boolean is false, and booleans may also be listed in ``host["resources"]``. A value of
the wrong type (a string where a number is expected) is treated as unknown.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from xcecore.resreq.chain import conjunction_filter
from xcecore.resreq.checker import check
from xcecore.resreq.compiler import (
    HostFilter,
    _keep_all,
    build_fit,
    build_key,
    build_sorter,
    fuse,
    generate_select,
    is_compiled,
)
from xcecore.resreq.errors import ResreqError
from xcecore.resreq.nodes import ParsedReq
from xcecore.resreq.parser import parse
from xcecore.resreq.registry import BOOL, NUMERIC, STRING, ResourceRegistry

__all__ = ["CompiledReq", "Evaluator", "HostMatch", "ResreqEvaluator", "RusageAlternative"]

Host = Mapping[str, Any]
_FLOAT_MAX_INT: Final = 2**1023  # ints beyond this overflow when mixed with floats
_COLLECTIONS: Final = (list, tuple, set, frozenset, dict)


@dataclass(slots=True)
class HostMatch:
    """One selected host: the mapping, its name, the rusage alternative that fits, tasks placed."""

    host: Host
    name: str
    alternative: int | None
    tasks: int


FUSE_AFTER_HOSTS: Final = 2048
"""Hosts a chain-filtered requirement evaluates before its generated code is compiled: a
chain costs ~0.03 us more per host, so past ~2,000 hosts compile() (~50 us) pays for itself."""


_Placement = tuple[list[Host], list[int]]
"""Placed hosts in order, and the tasks of the first ``len(tasks)`` of them (0 after)."""


class RusageAlternative(Mapping[str, float]):
    """One rusage alternative: a mapping resource -> amount, plus ``duration``/``decay``.

    ``duration``/``decay`` are the alternative's values when all its resources share them
    (None when unset or when comma-separated parts differ); ``durations``/``decays`` give
    them per resource.
    """

    __slots__ = ("_amounts", "decay", "decays", "duration", "durations")

    def __init__(self, amounts: Mapping[str, float], durations: Mapping[str, float | None],
                 decays: Mapping[str, int | None]) -> None:
        """Build from per-resource amounts, durations (minutes) and decays (0/1)."""
        self._amounts = dict(amounts)
        self.durations = dict(durations)
        self.decays = dict(decays)
        self.duration = _common(self.durations.values())
        self.decay = _common(self.decays.values())

    def __getitem__(self, key: str) -> float:
        return self._amounts[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __repr__(self) -> str:
        return (f"RusageAlternative({self._amounts!r}, duration={self.duration!r},"
                f" decay={self.decay!r})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: amounts plus duration/decay (and per-resource ones if they differ)."""
        out: dict[str, Any] = {"amounts": dict(self._amounts), "duration": self.duration,
                               "decay": self.decay}
        if len(set(self.durations.values())) > 1 or len(set(self.decays.values())) > 1:
            out["durations"] = dict(self.durations)
            out["decays"] = dict(self.decays)
        return out


def _common(values: Any) -> Any:
    """The single value shared by all of ``values``, else None."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _make_sanitizer(registry: ResourceRegistry) -> Callable[[Host], dict[str, Any]]:
    """A function copying a host without values of the wrong type (they become unknown)."""
    types = {r.name: r.type for r in registry.resources()}

    def sanitize(host: Host) -> dict[str, Any]:
        if not isinstance(host, Mapping):
            raise TypeError(f"a host must be a mapping, not {type(host).__name__}")
        out: dict[str, Any] = {}
        for k, v in host.items():
            t = types.get(k)
            if t == NUMERIC:
                if not isinstance(v, int | float) or (isinstance(v, int)
                                                      and abs(v) >= _FLOAT_MAX_INT):
                    continue
            elif t == STRING:
                if not isinstance(v, str):
                    continue
            elif k == "resources" and not isinstance(v, _COLLECTIONS):
                continue
            out[k] = v
        return out

    return sanitize


class CompiledReq:
    """A compiled requirement: evaluate it against many hosts, many times.

    Safe to share between threads. Its observable behaviour never changes after
    construction; internally, a select section of a shape not compiled before starts as a
    chain of pre-written filters (see :mod:`xcecore.resreq.chain`) and switches to the
    generated code (one CPython compile()) once it has filtered :data:`FUSE_AFTER_HOSTS`
    hosts, so requirements that are only validated, or matched against few hosts, never pay
    for compile().
    """

    __slots__ = ("_filter", "_fit", "_key", "_pending", "_registry", "_same_bool",
                 "_sanitize", "_sort", "_unfused_budget", "order", "registry_version", "rusage",
                 "same", "select_source", "span", "text")

    text: str
    registry_version: str
    select_source: str
    order: tuple[tuple[str, bool], ...]
    rusage: list[RusageAlternative]
    span: dict[str, int] | None
    same: tuple[str, ...]

    def __init__(self, parsed: ParsedReq, registry: ResourceRegistry,
                 sanitize: Callable[[Host], dict[str, Any]] | None = None) -> None:
        """Build from a parsed *and checked* requirement (``sanitize``: shared per registry)."""
        self.text = parsed.text
        self.registry_version = registry.version
        self._filter: HostFilter = _keep_all
        self._pending: tuple[str, dict[str, Any]] | None = None
        self._unfused_budget = FUSE_AFTER_HOSTS
        self.select_source = ""
        if parsed.select is not None:
            self.select_source, consts = generate_select(parsed.select)
            chain = None if is_compiled(self.select_source) else conjunction_filter(parsed.select)
            if chain is None:
                self._filter = fuse(self.select_source, consts)
            else:
                self._filter, self._pending = chain, (self.select_source, consts)
        keys = parsed.order or []
        self.order = tuple((k.resource.name, k.reverse) for k in keys if k.resource)
        directions = [(k.resource.name, k.resource.increasing != k.reverse)
                      for k in keys if k.resource]
        self._key = build_key(directions)
        self._sort = build_sorter(directions)  # same order as sorting by _key, faster
        self.rusage = []
        for groups in parsed.rusage or ():
            amounts: dict[str, float] = {}
            durations: dict[str, float | None] = {}
            decays: dict[str, int | None] = {}
            for group in groups:
                for item in group.items:
                    assert item.resource is not None
                    amounts[item.resource.name] = item.value
                    durations[item.resource.name] = group.duration
                    decays[item.resource.name] = group.decay
            self.rusage.append(RusageAlternative(amounts, durations, decays))
        self._fit = build_fit(self.rusage)
        self.span = {parsed.span.key: parsed.span.value} if parsed.span else None
        self.same = tuple(n.resource.name for n in parsed.same or () if n.resource)
        self._same_bool = tuple(n.resource.type == BOOL for n in parsed.same or ()
                                if n.resource)
        self._registry = registry
        self._sanitize = sanitize  # built on first need when not shared by an Evaluator

    def __repr__(self) -> str:
        return f"CompiledReq({self.text!r})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description of the compiled sections."""
        return {
            "text": self.text,
            "order": [("-" if rev else "") + name for name, rev in self.order],
            "rusage": [alt.to_dict() for alt in self.rusage],
            "span": self.span,
            "same": list(self.same),
        }

    # ---------------------------------------------------------------- per-host pieces
    def predicate(self, host: Host) -> bool:
        """Whether ``host`` satisfies the select section (True only when definitely true)."""
        if self._pending is not None:
            self._unfused_budget -= 1
            if self._unfused_budget <= 0:
                self._fuse()
        try:
            return bool(self._filter((host,)))
        except Exception:
            return self._retry(host)

    def _retry(self, host: Host) -> bool:
        """Evaluate again with wrong-typed values removed (they count as unknown)."""
        if self._sanitize is None:
            self._sanitize = _make_sanitizer(self._registry)
        clean = self._sanitize(host)
        try:
            return bool(self._filter((clean,)))
        except ArithmeticError:
            # Only absurd magnitudes get here (e.g. an integer quotient beyond float range);
            # not qualifying is the safe answer.
            return False

    def filter(self, hosts: Sequence[Host]) -> list[Host]:
        """The hosts satisfying the select section, in input order."""
        if self._pending is not None:
            try:
                self._unfused_budget -= len(hosts)
            except TypeError:  # no len(): assume it is large
                self._unfused_budget = 0
            if self._unfused_budget <= 0:
                self._fuse()
        try:
            return self._filter(hosts)
        except Exception:
            return [h for h in hosts if self.predicate(h)]

    def _fuse(self) -> None:
        """Switch the select filter to the generated code (racing threads just compile twice;
        both results are equal)."""
        pending = self._pending
        if pending is not None:
            self._filter = fuse(*pending)
            self._pending = None

    def sort_key(self, host: Host) -> tuple[Any, ...]:
        """Sort key: unavailable last, then each order key (unknown last), then host name."""
        return self._key(host)

    def fit(self, host: Host) -> int | None:
        """Index of the first rusage alternative the host can satisfy (0 without rusage)."""
        return self._fit(host)

    @staticmethod
    def capacity(host: Host) -> int:
        """Tasks the host can take: its ``slots``, else ``ncpus``, else 1 (0 if unavailable)."""
        if host.get("status", "ok") != "ok":
            return 0
        for name in ("slots", "ncpus"):
            v = host.get(name)
            if isinstance(v, int | float) and v == v:
                return max(0, int(v)) if abs(v) < _FLOAT_MAX_INT else 0
        return 1

    # ---------------------------------------------------------------- matching
    def match(self, hosts: Sequence[Host], *, limit: int | None = None,
              ntasks: int = 1) -> list[HostMatch]:
        """Qualifying hosts, best first, with the tasks a placement of ``ntasks`` puts on each.

        Applies select, rusage fit and order. With ``same[...]`` only the best group of hosts
        sharing those values that can take ``ntasks`` is returned; with ``span[hosts=1]`` only
        hosts able to take all ``ntasks``. Returns ``[]`` when the tasks cannot be placed.
        ``limit`` caps the number of hosts returned.
        """
        if isinstance(ntasks, bool) or not isinstance(ntasks, int) or ntasks < 1:
            raise ValueError("ntasks must be a positive integer")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise ValueError("limit must be a non-negative integer or None")
        chosen = self.filter(hosts)
        alts: dict[int, int | None] | None = None
        if self.rusage:
            fit = self._fit
            alts = {}
            kept = []
            for h in chosen:
                a = fit(h)
                if a is not None:
                    alts[id(h)] = a
                    kept.append(h)
            chosen = kept
        simple = not self.same and self.span is None and ntasks == 1
        if simple and limit is not None and limit < len(chosen) // 8:
            # A few best hosts out of many: a heap beats a full sort.
            chosen = heapq.nsmallest(limit, chosen, key=self._key)
        else:
            chosen = self._sort(chosen)
        placed = self._place_groups(chosen, ntasks)
        if placed is None:
            return []
        ordered, tasks = placed
        if limit is not None:
            ordered = ordered[:limit]
        # Only the first len(tasks) hosts take tasks: a placement is a short prefix, so the
        # rest are built without looking anything up per host.
        if alts is None:
            out = [HostMatch(h, n if isinstance(n := h.get("hname"), str) else "", None, 0)
                   for h in ordered]
        else:
            out = [HostMatch(h, n if isinstance(n := h.get("hname"), str) else "",
                             alts[id(h)], 0) for h in ordered]
        for i, t in enumerate(tasks[:len(out)]):
            out[i].tasks = t
        return out

    def _place_groups(self, ordered: list[Host], ntasks: int) -> _Placement | None:
        """Placement over the best feasible ``same`` group (or over all hosts)."""
        if not self.same:
            return self._place(ordered, ntasks)
        groups: dict[tuple[Any, ...], list[Host]] = {}
        for h in ordered:
            values = []
            for name, is_bool in zip(self.same, self._same_bool, strict=True):
                if is_bool:
                    res = h.get("resources") or ()
                    v: Any = bool(h.get(name) or (isinstance(res, _COLLECTIONS) and name in res))
                else:
                    v = h.get(name)
                    if v is None:
                        break  # unknown: cannot be shown to share the value
                values.append(v)
            else:
                try:
                    groups.setdefault(tuple(values), []).append(h)
                except TypeError:
                    continue  # unhashable value: treat as unknown
        # dicts keep insertion order, i.e. groups ordered by their best host.
        for members in groups.values():
            placed = self._place(members, ntasks)
            if placed is not None:
                return placed
        return None

    def _place(self, ordered: list[Host], ntasks: int) -> _Placement | None:
        """Greedy placement of ``ntasks`` in order; None when it does not fit.

        Returns the hosts (all of ``ordered``, or with ``span[hosts=1]`` those able to take
        every task) and the tasks of the first few of them: the scan stops once every task
        is placed, and the hosts after that take none.
        """
        ptile = self.span.get("ptile") if self.span else None
        capacity = self.capacity
        if self.span and "hosts" in self.span:
            able = [h for h in ordered if capacity(h) >= ntasks]
            if not able:
                return None
            return able, [ntasks]
        remaining = ntasks
        tasks: list[int] = []
        for h in ordered:
            take = min(capacity(h), remaining)
            if ptile is not None:
                take = min(take, ptile)
            remaining -= take
            tasks.append(take)
            if not remaining:
                return ordered, tasks
        return None


class ResreqEvaluator(Protocol):
    """What the ``xce_resreq_evaluator`` hook returns (implemented by :class:`Evaluator`)."""

    def compile(self, text: str) -> CompiledReq:
        """Compile (or fetch from cache) a requirement."""
        ...

    def select(self, text: str, hosts: Sequence[Host], *, limit: int | None = None,
               ntasks: int = 1) -> list[HostMatch]:
        """Hosts matching ``text``, best first."""
        ...


class Evaluator:
    """The default resource-requirement evaluator for one registry; thread-safe.

    Compiled requirements (and compile errors, so a repeated bad string costs nothing) are
    kept in a bounded LRU cache keyed by ``(text, registry.version)``.
    """

    def __init__(self, registry: ResourceRegistry | None = None, *,
                 cache_size: int = 1024) -> None:
        """Evaluator for ``registry`` (built-ins only when None)."""
        self.registry = registry if registry is not None else ResourceRegistry()
        self._cache: OrderedDict[tuple[str, str], CompiledReq | ResreqError] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self._lock = threading.Lock()
        self._sanitize = _make_sanitizer(self.registry)
        self._hits = 0
        self._misses = 0

    def compile(self, text: str) -> CompiledReq:
        """Compile ``text`` (cached); raise :class:`ResreqError` if it is invalid."""
        key = (text, self.registry.version)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                self._hits += 1
        if got is None:
            try:
                got = CompiledReq(check(parse(text), self.registry), self.registry,
                                  self._sanitize)
            except ResreqError as exc:
                got = exc
            with self._lock:
                self._misses += 1
                self._cache[key] = got
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        if isinstance(got, ResreqError):
            # A fresh copy each time: one shared exception object would pile up tracebacks.
            raise ResreqError(got.code, got.message, text=got.text, offset=got.offset,
                              length=got.length, section=got.section,
                              suggestion=got.suggestion) from None
        return got

    def select(self, text: str, hosts: Sequence[Host], *, limit: int | None = None,
               ntasks: int = 1) -> list[HostMatch]:
        """Hosts matching requirement ``text``, best first (see :meth:`CompiledReq.match`)."""
        return self.compile(text).match(hosts, limit=limit, ntasks=ntasks)

    def cache_info(self) -> dict[str, int]:
        """Cache statistics: hits, misses, current size and maximum size."""
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "size": len(self._cache),
                    "maxsize": self._cache_size}

    def clear_cache(self) -> None:
        """Forget every cached compilation."""
        with self._lock:
            self._cache.clear()
