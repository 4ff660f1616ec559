"""Table-driven semantics of the resource-requirement language (RESREQ.md)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from xcecore.resreq import CompiledReq, Evaluator, HostMatch, ResourceRegistry, ResreqError

pytestmark = pytest.mark.timeout(60)

SITE = [
    {"name": "gpu", "type": "bool"},
    {"name": "linux", "type": "bool"},
    {"name": "rack", "type": "string"},
    {"name": "ngpus", "type": "numeric", "consumable": True, "increasing": True},
    {"name": "licenses", "type": "numeric", "consumable": True},
]
REG = ResourceRegistry(SITE)
EV = Evaluator(REG)


def qualifies(text: str, host: dict[str, Any]) -> bool:
    """Both evaluation paths (single-host predicate and bulk filter) must agree."""
    req = EV.compile(text)
    single = req.predicate(host)
    bulk = [h for h in req.filter([host])]
    assert single == (len(bulk) == 1), (text, host)
    return single


# ------------------------------------------------------------------ three-valued logic
# "mem" known below/above, and unknown (missing); expectations per RESREQ.md "Semantics".
LOW, HIGH, UNK = {"mem": 100}, {"mem": 9000}, {}

TRUTH = [
    ("mem<4096", LOW, True),
    ("mem<4096", HIGH, False),
    ("mem<4096", UNK, False),
    ("!(mem<4096)", LOW, False),
    ("!(mem<4096)", HIGH, True),
    ("!(mem<4096)", UNK, False),  # !unknown is unknown
    ("not (mem<4096)", UNK, False),
    ("!!(mem<4096)", UNK, False),
    ("mem<4096 && gpu", {"mem": 1, "gpu": True}, True),
    ("!(mem<4096 && gpu)", {}, True),  # false && unknown = false, so ! is true
    ("!(gpu && mem<4096)", {}, True),
    ("!(mem<4096 || gpu)", {}, False),  # unknown || false = unknown
    ("mem<4096 || gpu", {"gpu": True}, True),  # unknown || true = true
    ("!(mem<4096 || !gpu)", {}, False),  # unknown || true = true -> !true = false
    ("!(mem+1 > 5)", {}, False),  # arithmetic on unknown is unknown
    ("!(mem*2 > 5)", {"mem": 1}, True),
    ("mem/ncpus > 1", {"mem": 10, "ncpus": 0}, False),  # division by zero is unknown
    ("!(mem/ncpus > 1)", {"mem": 10, "ncpus": 0}, False),
    ("mem/ncpus > 1 || gpu", {"mem": 10, "ncpus": 0, "gpu": 1}, True),
    ("!(mem/ncpus > 1)", {"mem": 1, "ncpus": 2}, True),
    ("mem/(ncpus-2) >= 1", {"mem": 4, "ncpus": 2}, False),
    ("!(mem/(ncpus-2) >= 1)", {"mem": 4, "ncpus": 2}, False),
    ("mem == 100", LOW, True),
    ("mem != 100", LOW, False),
    ("mem != 100", UNK, False),
    ("!(mem == 100)", UNK, False),
    ("!(mem != 100)", UNK, False),
    ("mem == mem", LOW, True),
    ("!(mem != mem)", UNK, False),
    ("mem == swp", {"mem": 3, "swp": 3}, True),
    ("mem != swp", {"mem": 3, "swp": 4}, True),
    ("mem != swp", {"mem": 3}, False),
    ("!(mem == swp)", {"mem": 3}, False),
    ("-mem < 0", LOW, True),
    ("!(-mem < 0)", UNK, False),
    ("- - mem > 0", LOW, True),
    ("mem - 50 - 25 == 25", LOW, True),  # left-associative
    ("mem / 10 / 5 == 2", LOW, True),
    ("mem - 2 * 25 == 50", LOW, True),  # * binds tighter than -
    ("(mem - 2) * 25 == 2450", LOW, True),
    ("1 < 2", {}, True),
    ("!(1 > 2)", {}, True),
    ("1/0 > 1 || 1/0 <= 1", {}, False),
    # booleans: absent is false, present may be a key or in "resources"
    ("gpu", {}, False),
    ("!gpu", {}, True),
    ("gpu", {"gpu": True}, True),
    ("gpu", {"gpu": False}, False),
    ("gpu", {"resources": ["linux", "gpu"]}, True),
    ("!gpu", {"resources": ["gpu"]}, False),
    ("gpu && linux", {"gpu": True, "resources": ["linux"]}, True),
    ("server", {"server": True}, True),
    # keywords
    ("gpu and linux", {"gpu": 1, "linux": 1}, True),
    ("gpu or linux", {"linux": 1}, True),
    ("not gpu", {}, True),
    ("gpu and not linux", {"gpu": 1}, True),
    # precedence: && binds tighter than ||
    ("gpu || linux && mem>1", {"gpu": 1}, True),
    ("(gpu || linux) && mem>1", {"gpu": 1}, False),
    # == binds looser than <: (a<b) == ... is a type error, tested elsewhere
    # strings
    ("type==X86_64", {"type": "X86_64"}, True),
    ("type==X86_64", {"type": "ARM"}, False),
    ("type!=X86_64", {"type": "ARM"}, True),
    ("type!=X86_64", {}, False),
    ("!(type==X86_64)", {}, False),
    ("!(type!=X86_64)", {}, False),
    ("X86_64==type", {"type": "X86_64"}, True),
    ("type=='X86_64'", {"type": "X86_64"}, True),
    ('type=="X86_64"', {"type": "X86_64"}, True),
    ("type==\"has space\"", {"type": "has space"}, True),
    ("rack==r1", {"rack": "r1"}, True),
    ("rack < r2", {"rack": "r1"}, True),
    ("!(rack < r2)", {}, False),
    ("rack >= r2", {"rack": "r1"}, False),
    ("hname == model", {"hname": "a", "model": "a"}, True),
    ("hname != model", {"hname": "a"}, False),
    # defined()
    ("defined(mem)", LOW, True),
    ("defined(mem)", UNK, False),
    ("!defined(mem)", UNK, True),
    ("defined(gpu)", {"resources": ["gpu"]}, True),
    ("defined(rack)", {"rack": "x"}, True),
    ("defined(rack)", {"rack": 5}, False),  # wrong type = not reported
    ("defined(swap)", {"swp": 1}, True),  # aliases
    # aliases: swap=swp idle=it login=ls cpu=r1m
    ("swap > 10", {"swp": 11}, True),
    ("idle > 10", {"it": 11}, True),
    ("login < 1", {"ls": 0}, True),
    ("cpu < 0.5", {"r1m": 0.2}, True),
    # units: memory resources are in MB
    ("mem >= 4G", {"mem": 4096}, True),
    ("mem >= 4G", {"mem": 4095}, False),
    ("mem == 512M", {"mem": 512}, True),
    ("mem == 1T", {"mem": 1024 * 1024}, True),
    ("mem == 2048K", {"mem": 2}, True),
    ("mem > 1.5G", {"mem": 1537}, True),
    ("mem > 4gb", {"mem": 4097}, True),
    ("maxmem > 4G", {"maxmem": 8192}, True),
    # numbers
    ("ut < .5", {"ut": 0.25}, True),
    ("ncpus >= 8", {"ncpus": 8}, True),
    ("ncpus >= 8", {"ncpus": 8.0}, True),
    ("mem > -1", {"mem": 0}, True),
    ("-1 < mem", {"mem": 0}, True),
    ("4096 < mem", HIGH, True),
    ("!(4096 < mem)", UNK, False),
    # wrong-typed and None values count as unknown
    ("mem > 1", {"mem": "lots"}, False),
    ("!(mem > 1)", {"mem": "lots"}, False),
    ("!(mem > 1)", {"mem": None}, False),
    ("mem > 1 || gpu", {"mem": "lots", "gpu": True}, True),
    ("!(mem == 1)", {"mem": "1"}, False),
    ("!(mem != 1)", {"mem": "1"}, False),
    ("mem + 1 > 1", {"mem": "1"}, False),
    ("!(mem * 2 == 2)", {"mem": "1"}, False),
    ("!(type == X86_64)", {"type": 5}, False),
    ("!(type < X86_64)", {"type": 5}, False),
    ("!(type < X86_64)", {"type": None}, False),
    ("gpu", {"resources": 17}, False),
    # NaN is unknown for ordering and equality
    ("!(mem > 1)", {"mem": float("nan")}, False),
    ("!(mem == 1)", {"mem": float("nan")}, False),
    ("mem > 1", {"mem": float("inf")}, True),
    # empty requirement selects everything
    ("", {}, True),
    ("   ", {}, True),
    ("order[mem]", {}, True),
]


@pytest.mark.parametrize(("text", "host", "expected"), TRUTH)
def test_truth_table(text: str, host: dict[str, Any], expected: bool) -> None:
    assert qualifies(text, host) is expected


def test_explicit_sections_equal_bare() -> None:
    host = {"mem": 5000, "type": "X86_64"}
    assert qualifies("select[mem>4G && type==X86_64]", host)
    assert qualifies("mem>4G && type==X86_64 order[mem]", host)
    assert qualifies("order[mem] select[mem>4G]", host)
    assert not qualifies("select[mem>8G] order[mem]", host)


# ------------------------------------------------------------------ order
def names(matches: list[HostMatch]) -> list[str]:
    return [m.name for m in matches]


ORDER_HOSTS = [
    {"hname": "a", "mem": 100, "r1m": 0.9},
    {"hname": "b", "mem": 300, "r1m": 0.1},
    {"hname": "c", "mem": 200},
    {"hname": "d", "r1m": 0.5},
    {"hname": "e", "mem": 300, "r1m": 0.2, "status": "unavail"},
    {"hname": "f", "mem": 300, "r1m": 0.3},
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("order[mem]", ["b", "f", "c", "a", "d", "e"]),  # larger mem first; tie by name
        ("order[-mem]", ["a", "c", "b", "f", "d", "e"]),  # reversed; unknown still last
        ("order[r1m]", ["b", "f", "d", "a", "c", "e"]),  # smaller load first
        ("order[-r1m]", ["a", "d", "f", "b", "c", "e"]),
        ("order[cpu]", ["b", "f", "d", "a", "c", "e"]),  # alias
        ("order[mem:r1m]", ["b", "f", "c", "a", "d", "e"]),
        ("order[mem:-r1m]", ["f", "b", "c", "a", "d", "e"]),
        ("", ["a", "b", "c", "d", "f", "e"]),  # no order: name, unavailable last
        ("mem>150 order[mem]", ["b", "f", "c", "e"]),
    ],
)
def test_order(text: str, expected: list[str]) -> None:
    assert names(EV.select(text, ORDER_HOSTS)) == expected
    # input order never matters
    assert names(EV.select(text, list(reversed(ORDER_HOSTS)))) == expected


def test_order_limit_and_sort_key() -> None:
    assert names(EV.select("order[mem]", ORDER_HOSTS, limit=2)) == ["b", "f"]
    assert names(EV.select("order[mem]", ORDER_HOSTS * 20, limit=1)) == ["b"]
    assert EV.select("order[mem]", ORDER_HOSTS, limit=0) == []
    req = EV.compile("order[mem]")
    assert sorted(ORDER_HOSTS, key=req.sort_key)[0]["hname"] == "b"
    with pytest.raises(ValueError):
        EV.select("order[mem]", ORDER_HOSTS, limit=-1)
    with pytest.raises(ValueError):
        EV.select("order[mem]", ORDER_HOSTS, ntasks=0)


def test_order_smaller_is_better_directions() -> None:
    for name in ("r15s", "r1m", "r15m", "ut", "pg", "io", "ls"):
        assert REG.get(name).increasing is False  # type: ignore[union-attr]
    for name in ("mem", "swp", "tmp", "ncpus", "cpuf", "slots", "it", "maxmem", "ngpus"):
        assert REG.get(name).increasing is True  # type: ignore[union-attr]


# ------------------------------------------------------------------ rusage
RUSAGE_HOSTS = [
    {"hname": "a", "mem": 1000, "swp": 5000},
    {"hname": "b", "mem": 3000, "swp": 100},
    {"hname": "c", "ngpus": 2},
    {"hname": "d"},
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rusage[mem=2048]", [("b", 0)]),
        ("rusage[mem=2G]", [("b", 0)]),
        ("rusage[mem=2048 || swap=1000]", [("a", 1), ("b", 0)]),
        ("rusage[swp=1000 || mem=2048]", [("a", 0), ("b", 1)]),
        ("rusage[mem=500:swp=500]", [("a", 0)]),
        ("rusage[mem=500:duration=10:decay=1]", [("a", 0), ("b", 0)]),
        ("rusage[mem=500, swp=500:duration=5]", [("a", 0)]),
        ("rusage[ngpus=1]", [("c", 0)]),
        ("rusage[ngpus=3]", []),
        ("", [("a", None), ("b", None), ("c", None), ("d", None)]),
    ],
)
def test_rusage(text: str, expected: list[tuple[str, int | None]]) -> None:
    got = [(m.name, m.alternative) for m in EV.select(text, RUSAGE_HOSTS)]
    assert got == expected


def test_rusage_structure() -> None:
    req = EV.compile("rusage[mem=2G:swap=10:duration=10:decay=1 || tmp=5]")
    assert len(req.rusage) == 2
    first, second = req.rusage
    assert dict(first) == {"mem": 2048, "swp": 10}
    assert first.duration == 10 and first.decay == 1
    assert dict(second) == {"tmp": 5} and second.duration is None
    assert req.fit({"mem": 4096, "swp": 20}) == 0
    assert req.fit({"tmp": 6}) == 1
    assert req.fit({}) is None
    assert EV.compile("mem>1").fit({}) == 0
    mixed = EV.compile("rusage[mem=1:duration=5, swp=2:duration=9]").rusage[0]
    assert mixed.duration is None and mixed.durations == {"mem": 5, "swp": 9}
    assert req.to_dict()["rusage"][0] == {"amounts": {"mem": 2048, "swp": 10}, "duration": 10,
                                          "decay": 1}


# ------------------------------------------------------------------ span, same, ntasks
SPAN_HOSTS = [
    {"hname": "a", "ncpus": 4, "rack": "r1", "mem": 10},
    {"hname": "b", "ncpus": 8, "rack": "r2", "mem": 20},
    {"hname": "c", "slots": 2, "ncpus": 64, "rack": "r1", "mem": 30},
    {"hname": "d", "rack": "r2", "mem": 40},  # capacity 1 (no slots, no ncpus)
    {"hname": "e", "ncpus": 16, "mem": 50},  # rack unknown
    {"hname": "f", "ncpus": 32, "rack": "r3", "mem": 60, "status": "closed"},
]


def placement(text: str, ntasks: int) -> list[tuple[str, int]]:
    return [(m.name, m.tasks) for m in EV.select(text, SPAN_HOSTS, ntasks=ntasks)]


@pytest.mark.parametrize(
    ("text", "ntasks", "expected"),
    [
        ("order[mem]", 1, [("e", 1), ("d", 0), ("c", 0), ("b", 0), ("a", 0), ("f", 0)]),
        ("order[-mem]", 7, [("a", 4), ("b", 3), ("c", 0), ("d", 0), ("e", 0), ("f", 0)]),
        ("order[-mem]", 31, [("a", 4), ("b", 8), ("c", 2), ("d", 1), ("e", 16), ("f", 0)]),
        ("order[-mem]", 32, []),  # unavailable hosts take no tasks
        ("order[-mem] span[hosts=1]", 8, [("b", 8), ("e", 0)]),
        ("order[mem] span[hosts=1]", 8, [("e", 8), ("b", 0)]),
        ("span[hosts=1]", 17, []),
        ("order[-mem] span[ptile=2]", 5, [("a", 2), ("b", 2), ("c", 1), ("d", 0), ("e", 0),
                                          ("f", 0)]),
        ("order[-mem] span[ptile=2]", 8, [("a", 2), ("b", 2), ("c", 2), ("d", 1), ("e", 1),
                                          ("f", 0)]),
        ("order[-mem] span[ptile=2]", 10, []),  # 2+2+2+1+2 = 9 < 10
        ("order[-mem] same[rack]", 4, [("a", 4), ("c", 0)]),
        ("order[-mem] same[rack]", 5, [("a", 4), ("c", 1)]),
        ("order[-mem] same[rack]", 7, [("b", 7), ("d", 0)]),
        ("order[-mem] same[rack]", 10, []),
        ("order[mem] same[rack]", 1, [("d", 1), ("b", 0)]),
        ("order[-mem] same[rack] span[hosts=1]", 6, [("b", 6)]),
        ("order[-mem] same[gpu]", 3, [("a", 3), ("b", 0), ("c", 0), ("d", 0), ("e", 0),
                                      ("f", 0)]),
    ],
)
def test_span_same(text: str, ntasks: int, expected: list[tuple[str, int]]) -> None:
    assert placement(text, ntasks) == expected


def test_span_same_attributes() -> None:
    assert EV.compile("span[hosts=1]").span == {"hosts": 1}
    assert EV.compile("span[ptile=4]").span == {"ptile": 4}
    assert EV.compile("mem>1").span is None
    assert EV.compile("same[type:swap]").same == ("type", "swp")
    assert EV.compile("mem>1").same == ()


# ------------------------------------------------------------------ registry & caching
def test_registry() -> None:
    assert REG.get("swap") is REG.get("swp")
    assert REG.get("nope") is None
    assert "gpu" in REG.names() and "swap" not in REG.names()
    assert REG.get("mem").unit == "MB" and REG.get("mem").consumable  # type: ignore[union-attr]
    assert not REG.get("ncpus").consumable  # type: ignore[union-attr]
    assert REG.get("ngpus").consumable  # type: ignore[union-attr]
    assert REG.suggest("gpus") == "gpu"
    assert REG.suggest("MEM") == "mem"
    assert REG.suggest("zzzzzzzz") is None
    assert ResourceRegistry(SITE).version == REG.version
    assert ResourceRegistry().version != REG.version
    assert ResourceRegistry(SITE) == REG and hash(ResourceRegistry(SITE)) == hash(REG)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"name": "gpu"}, "'type'"),
        ({"name": "gpu", "type": "float"}, "'type'"),
        ({"name": "9gpu", "type": "bool"}, "identifier"),
        ({"name": "and", "type": "bool"}, "reserved"),
        ({"name": "mem", "type": "numeric"}, "built-in"),
        ({"name": "swap", "type": "numeric"}, "built-in"),
        ({"name": "x", "type": "bool", "consumable": True}, "numeric"),
        ({"name": "x", "type": "numeric", "consumable": "yes"}, "true or false"),
        ({"name": "x", "type": "numeric", "colour": 1}, "'colour'"),
        ({"name": "x", "type": "numeric", "unit": "GB"}, "unit"),
        ("gpu", "mapping"),
    ],
)
def test_registry_bad_site_entries(entry: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match="site resource #0") as info:
        ResourceRegistry([entry])
    assert fragment in str(info.value)


def test_registry_duplicate_site_entry() -> None:
    with pytest.raises(ValueError, match="twice"):
        ResourceRegistry([{"name": "x", "type": "bool"}, {"name": "x", "type": "bool"}])


def test_cache_hits_and_registry_versions() -> None:
    ev = Evaluator(REG, cache_size=2)
    a = ev.compile("mem>1")
    assert ev.compile("mem>1") is a
    assert ev.cache_info()["hits"] == 1
    ev.compile("mem>2")
    ev.compile("mem>3")  # evicts "mem>1"
    assert ev.cache_info()["size"] == 2
    assert ev.compile("mem>1") is not a
    # errors are cached too, and re-raised as fresh objects
    with pytest.raises(ResreqError) as e1:
        ev.compile("gpus")
    with pytest.raises(ResreqError) as e2:
        ev.compile("gpus")
    assert e1.value is not e2.value and e1.value.to_dict() == e2.value.to_dict()
    # a different registry does not see "gpu"
    with pytest.raises(ResreqError):
        Evaluator(ResourceRegistry()).compile("gpu")
    ev.clear_cache()
    assert ev.cache_info()["size"] == 0


def test_compiled_requirement_api() -> None:
    req = EV.compile("select[mem>4G] order[-r1m] rusage[mem=1G] span[ptile=2] same[rack]")
    assert isinstance(req, CompiledReq)
    assert req.text.startswith("select[")
    assert req.order == (("r1m", True),)
    d = req.to_dict()
    assert d["order"] == ["-r1m"] and d["span"] == {"ptile": 2} and d["same"] == ["rack"]
    assert "_k0" in req.select_source and "4096" not in req.select_source
    assert EV.compile("mem > 4096").predicate({"mem": 5000})


def test_numeric_literals_never_reach_generated_source() -> None:
    req = EV.compile("type == \"x'); import os #\" || mem > 1")
    assert "import" not in req.select_source
    assert req.predicate({"type": "x'); import os #"})


def test_non_mapping_host_is_a_type_error() -> None:
    req = EV.compile("mem > 1")
    with pytest.raises(TypeError):
        req.predicate(42)  # type: ignore[arg-type]


def test_error_pickles() -> None:
    with pytest.raises(ResreqError) as info:
        EV.compile("select[gpus]")
    again = pickle.loads(pickle.dumps(info.value))
    assert again.to_dict() == info.value.to_dict()
