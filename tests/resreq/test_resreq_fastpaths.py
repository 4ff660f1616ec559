"""The fast paths of matching agree with the straightforward definitions they replace.

``build_sorter`` (stable passes over flat keys) must order hosts exactly as sorting by the
composite ``build_key`` tuple does, and ``CompiledReq.match`` (lazy placement, HostMatch
objects built only up to ``limit``) must return what a plain sort-then-place-every-host
reference returns, for random hosts with unknown, wrong-typed, NaN, boolean and
unavailable values, with and without ``limit``, ``ntasks``, ``span`` and ``same``.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xcecore.resreq import Evaluator, ResourceRegistry
from xcecore.resreq.compiler import build_key, build_sorter

pytestmark = pytest.mark.timeout(120)

REG = ResourceRegistry([{"name": "gpu", "type": "bool"}, {"name": "rack", "type": "string"}])
EV = Evaluator(REG, cache_size=64)
FAST = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

values = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([0.5, -0.0, 0.0, 2.5, math.nan,
                   math.inf, -math.inf, True, False, "x"]))
hosts_st = st.lists(st.fixed_dictionaries({
    "hname": st.one_of(st.sampled_from(["a", "b", "c", "d", "e", "f"]), st.none(), st.just(3)),
    "status": st.sampled_from(["ok", "ok", "ok", "unavail", "closed"]),
    "mem": values, "r1m": values, "ut": values, "swp": values,
    "slots": st.one_of(st.none(), st.integers(0, 4)),
    "ncpus": st.one_of(st.none(), st.integers(0, 8)),
    "rack": st.sampled_from(["r1", "r2"]),
    "gpu": st.booleans(),
}), max_size=30)
order_keys = st.lists(st.tuples(st.sampled_from(["mem", "r1m", "ut"]), st.booleans()),
                      max_size=3)


@FAST
@given(hosts_st, order_keys)
def test_sorter_orders_exactly_like_the_tuple_key(hosts: list[dict[str, Any]],
                                                  keys: list[tuple[str, bool]]) -> None:
    expected = sorted(hosts, key=build_key(keys))
    got = build_sorter(keys)(hosts)
    assert [id(h) for h in got] == [id(h) for h in expected]


def _reference_match(req: Any, hosts: list[dict[str, Any]], limit: int | None,
                     ntasks: int) -> list[tuple[str, int | None, int]]:
    """The plain definition: filter, fit, sort by the key, place on every host, cut."""
    chosen = [h for h in hosts if req.predicate(h)]
    alts = {id(h): req.fit(h) for h in chosen}
    if req.rusage:
        chosen = [h for h in chosen if alts[id(h)] is not None]
    simple = not req.same and req.span is None and ntasks == 1
    if simple and limit is not None and limit < len(chosen) // 8:
        chosen = heapq.nsmallest(limit, chosen, key=req.sort_key)
    else:
        chosen = sorted(chosen, key=req.sort_key)

    def place(ordered: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]] | None:
        span = req.span or {}
        if "hosts" in span:
            able = [h for h in ordered if req.capacity(h) >= ntasks]
            return [(h, ntasks if i == 0 else 0) for i, h in enumerate(able)] or None
        remaining, out = ntasks, []
        for h in ordered:
            take = min(req.capacity(h), remaining, span.get("ptile", remaining))
            remaining -= take
            out.append((h, take))
        return None if remaining else out

    placed = None
    if not req.same:
        placed = place(chosen)
    else:
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for h in chosen:
            key = tuple(h.get(n) for n in req.same)
            if None not in key:
                groups.setdefault(key, []).append(h)
        for members in groups.values():
            placed = place(members)
            if placed is not None:
                break
    if placed is None:
        return []
    if limit is not None:
        placed = placed[:limit]
    return [(h.get("hname") if isinstance(h.get("hname"), str) else "",
             alts[id(h)] if req.rusage else None, t) for h, t in placed]


REQS = [
    "select[status==ok] order[r1m:-mem]",
    "mem>0 || !gpu",
    "order[ut] rusage[mem=1]",
    "select[gpu] order[-mem:r1m:ut] span[ptile=2]",
    "order[mem] span[hosts=1]",
    "order[r1m] same[rack]",
    "rusage[mem=1 || swp=0.5]",
]


@FAST
@given(hosts_st, st.sampled_from(REQS), st.one_of(st.none(), st.integers(0, 12)),
       st.integers(1, 6))
def test_match_agrees_with_the_reference(hosts: list[dict[str, Any]], text: str,
                                         limit: int | None, ntasks: int) -> None:
    req = EV.compile(text)
    got = [(m.name, m.alternative, m.tasks) for m in req.match(hosts, limit=limit, ntasks=ntasks)]
    assert got == _reference_match(req, hosts, limit, ntasks)


def test_match_of_many_hosts_places_one_task_on_the_best_able_host() -> None:
    hosts = [{"hname": f"n{i:04d}", "status": "ok", "slots": 0 if i < 3 else 2, "mem": i}
             for i in range(2000)]
    req = EV.compile("order[-mem]")  # smallest mem first: the three full hosts lead
    got = req.match(hosts)
    assert [m.name for m in got[:5]] == ["n0000", "n0001", "n0002", "n0003", "n0004"]
    assert [m.tasks for m in got[:5]] == [0, 0, 0, 1, 0]
    assert sum(m.tasks for m in got) == 1 and len(got) == 2000
    assert req.match([h | {"slots": 0} for h in hosts]) == []


# ------------------------------------------------------------------ chain filters
LEAVES = ["mem>4", "mem>=0.5", "4<mem", "r1m<=2.5", "ut<1", "mem==2", "mem!=2", "ut!=0",
          "rack==r1", "rack!=r2", "rack<r2", "r2>=rack", "gpu", "!gpu", "!(mem>4)",
          "!(rack==r1)", "not gpu", "!!gpu"]
conjunctions = st.lists(st.sampled_from(LEAVES), min_size=1, max_size=5).map(" && ".join)
negated_or = st.lists(st.sampled_from(LEAVES), min_size=2, max_size=3).map(
    lambda parts: "!(" + " || ".join(parts) + ")")


def _outcome(fn: Any, hosts: list[dict[str, Any]]) -> Any:
    try:
        return [id(h) for h in fn(hosts)]
    except Exception as exc:  # the evaluator retries such hosts sanitized; types must agree
        return type(exc)


@FAST
@given(hosts_st, st.one_of(conjunctions, negated_or))
def test_chain_filters_select_what_the_generated_code_selects(hosts: list[dict[str, Any]],
                                                              text: str) -> None:
    from xcecore.resreq.chain import conjunction_filter
    from xcecore.resreq.checker import check
    from xcecore.resreq.compiler import fuse, generate_select
    from xcecore.resreq.parser import parse

    node = check(parse(text), REG).select
    assert node is not None
    chain = conjunction_filter(node)
    assert chain is not None, text
    fused = fuse(*generate_select(node))
    assert _outcome(chain, hosts) == _outcome(fused, hosts)


def test_only_conjunctions_of_simple_tests_become_chains() -> None:
    from xcecore.resreq.chain import conjunction_filter
    from xcecore.resreq.checker import check
    from xcecore.resreq.parser import parse

    for text in ("mem>4 || gpu", "mem/2>1", "defined(mem)", "mem>ut", "-mem<0 && gpu"):
        node = check(parse(text), REG).select
        assert node is not None and conjunction_filter(node) is None, text


def test_a_chained_requirement_switches_to_generated_code_with_the_same_answers() -> None:
    from xcecore.resreq import compiler
    from xcecore.resreq.evaluator import FUSE_AFTER_HOSTS

    compiler._code_cache.clear()
    req = Evaluator(REG).compile("select[rack==r1 && mem>1 && !gpu] order[mem]")
    hosts = [{"hname": f"h{i}", "rack": f"r{i % 2}", "mem": i % 5, "gpu": i % 3 == 0}
             for i in range(600)]
    before = req.filter(hosts)
    assert req._pending is not None  # still the chain: 600 hosts filtered so far
    for _ in range(FUSE_AFTER_HOSTS // 600 + 1):
        assert req.filter(hosts) == before
    assert req._pending is None and req.filter(hosts) == before
    assert [m.name for m in req.match(hosts)] == [h["hname"] for h in sorted(before, key=req.sort_key)]
    # The shape is now compiled: a new requirement of that shape starts with generated code.
    assert Evaluator(REG).compile("select[rack==r2 && mem>3 && !gpu]")._pending is None
