"""Property tests: fuzzed input only ever yields a result or a ResreqError, and the compiled
predicate agrees with a slow, obviously-correct reference interpreter on random expressions.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from xcecore.resreq import Evaluator, ResourceRegistry, ResreqError

pytestmark = pytest.mark.timeout(120)

REG = ResourceRegistry([
    {"name": "gpu", "type": "bool"},
    {"name": "linux", "type": "bool"},
    {"name": "rack", "type": "string"},
    {"name": "ngpus", "type": "numeric", "consumable": True},
])
EV = Evaluator(REG, cache_size=64)

NUMERIC = ["mem", "ncpus", "swp", "r1m", "ut", "ngpus"]
STRINGS = ["type", "rack"]
BOOLS = ["gpu", "linux"]
WORDS = ["X86_64", "ARM", "r1", "r2", "Zz"]
FAST = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ expression trees
# Nodes are tuples; ("num", v) ("res", name) ("neg", x) ("arith", op, a, b)
# ("cmp", op, a, b) ("scmp", op, res, word, quoted, flipped) ("bres", name)
# ("defined", name) ("not", x, word) ("logic", op, a, b, word)

numbers = st.one_of(st.integers(0, 20), st.sampled_from([0.5, 1.25, 4096, 0.0, 100.75]))
num_leaf = st.one_of(st.builds(lambda v: ("num", v), numbers),
                     st.builds(lambda n: ("res", n), st.sampled_from(NUMERIC)))
num_expr = st.recursive(
    num_leaf,
    lambda sub: st.one_of(
        st.builds(lambda x: ("neg", x), sub),
        st.builds(lambda op, a, b: ("arith", op, a, b), st.sampled_from("+-*/"), sub, sub),
    ),
    max_leaves=4,
)
comparison = st.builds(lambda op, a, b: ("cmp", op, a, b),
                       st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), num_expr, num_expr)
string_cmp = st.builds(lambda op, r, w, q, f: ("scmp", op, r, w, q, f),
                       st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
                       st.sampled_from(STRINGS), st.sampled_from(WORDS), st.booleans(),
                       st.booleans())
bool_leaf = st.one_of(
    comparison,
    string_cmp,
    st.builds(lambda n: ("bres", n), st.sampled_from(BOOLS)),
    st.builds(lambda n: ("defined", n), st.sampled_from(NUMERIC + STRINGS + BOOLS)),
)
bool_expr = st.recursive(
    bool_leaf,
    lambda sub: st.one_of(
        st.builds(lambda x, w: ("not", x, w), sub, st.booleans()),
        st.builds(lambda op, a, b, w: ("logic", op, a, b, w), st.sampled_from(["&&", "||"]),
                  sub, sub, st.booleans()),
    ),
    max_leaves=8,
)

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6}


def render(node: tuple[Any, ...]) -> tuple[str, int]:
    """Text for ``node`` with only the parentheses precedence requires, and its precedence."""
    kind = node[0]

    def wrap(child: tuple[Any, ...], need: int) -> str:
        text, prec = render(child)
        return f"({text})" if prec < need else text

    if kind == "num":
        return repr(node[1]), 8
    if kind in ("res", "bres"):
        return node[1], 8
    if kind == "defined":
        return f"defined({node[1]})", 8
    if kind == "neg":
        return "-" + wrap(node[1], 7), 7
    if kind == "not":
        return ("not " if node[2] else "!") + wrap(node[1], 7), 7
    if kind == "arith":
        p = _PREC[node[1]]
        return f"{wrap(node[2], p)} {node[1]} {wrap(node[3], p + 1)}", p
    if kind == "cmp":
        return f"{wrap(node[2], 5)} {node[1]} {wrap(node[3], 5)}", _PREC[node[1]]
    if kind == "scmp":
        _, op, res, word, quoted, flipped = node
        lit = f"'{word}'" if quoted else word
        flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
        text = f"{lit} {flip[op]} {res}" if flipped else f"{res} {op} {lit}"
        return text, _PREC[op]
    assert kind == "logic"
    p = _PREC[node[1]]
    op = {"&&": " and ", "||": " or "}[node[1]] if node[4] else f" {node[1]} "
    return f"{wrap(node[2], p)}{op}{wrap(node[3], p + 1)}", p


# ------------------------------------------------------------------ reference interpreter
def ref_value(node: tuple[Any, ...], host: dict[str, Any]) -> Any:
    """Numeric value or None for unknown, straight from the definitions in RESREQ.md."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "res":
        v = host.get(node[1])
        ok = isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v))
        return v if ok else None
    if kind == "neg":
        v = ref_value(node[1], host)
        return None if v is None else -v
    _, op, a, b = node
    x, y = ref_value(a, host), ref_value(b, host)
    if x is None or y is None:
        return None
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if y == 0:
        return None  # division by zero is unknown
    return x / y


def has_bool(name: str, host: dict[str, Any]) -> bool:
    return bool(host.get(name)) or name in host.get("resources", [])


def compare(op: str, x: Any, y: Any) -> bool | None:
    if x is None or y is None:
        return None
    if (isinstance(x, float) and math.isnan(x)) or (isinstance(y, float) and math.isnan(y)):
        return None
    return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}[op]


def ref_bool(node: tuple[Any, ...], host: dict[str, Any]) -> bool | None:
    """True, False or None (unknown), with the three-valued rules of RESREQ.md."""
    kind = node[0]
    if kind == "bres":
        return has_bool(node[1], host)
    if kind == "defined":
        name = node[1]
        if name in BOOLS:
            return has_bool(name, host)
        v = host.get(name)
        return isinstance(v, str) if name in STRINGS else isinstance(v, int | float)
    if kind == "cmp":
        return compare(node[1], ref_value(node[2], host), ref_value(node[3], host))
    if kind == "scmp":
        v = host.get(node[2])
        return compare(node[1], v if isinstance(v, str) else None, node[3])
    if kind == "not":
        v = ref_bool(node[1], host)
        return None if v is None else not v
    _, op, a, b, _w = node
    x, y = ref_bool(a, host), ref_bool(b, host)
    if op == "&&":
        if x is False or y is False:
            return False
        return None if x is None or y is None else True
    if x is True or y is True:
        return True
    return None if x is None or y is None else False


host_values = {
    **{n: st.one_of(st.integers(-3, 20), st.sampled_from([0.5, 0.0, 1.25, 4096.5]), st.none(),
                    st.just("oops")) for n in NUMERIC},
    **{n: st.one_of(st.sampled_from(WORDS), st.none(), st.just(7)) for n in STRINGS},
    **{n: st.booleans() for n in BOOLS},
}
hosts = st.builds(
    lambda d, res: {**d, **({"resources": res} if res is not None else {})},
    st.fixed_dictionaries({}, optional=host_values),
    st.one_of(st.none(), st.lists(st.sampled_from(BOOLS), max_size=2)),
)


@FAST
@given(bool_expr, st.lists(hosts, min_size=1, max_size=8))
def test_differential_against_reference(tree: tuple[Any, ...], batch: list[dict[str, Any]]) -> None:
    text, _ = render(tree)
    req = EV.compile(text)
    expected = [ref_bool(tree, h) is True for h in batch]
    assert [req.predicate(h) for h in batch] == expected, text
    assert req.filter(batch) == [h for h, ok in zip(batch, expected, strict=True) if ok], text
    # And the section form, negated: !(x) must be true exactly where x is definitely false.
    neg = EV.compile(f"select[!({text})]")
    assert [neg.predicate(h) for h in batch] == [ref_bool(tree, h) is False for h in batch]


def test_reference_renderer_round_trips_precedence() -> None:
    tree = ("arith", "-", ("res", "mem"), ("arith", "-", ("num", 1), ("num", 2)))
    assert render(tree)[0] == "mem - (1 - 2)"
    tree = ("logic", "&&", ("logic", "||", ("bres", "gpu"), ("bres", "linux"), False),
            ("bres", "gpu"), False)
    assert render(tree)[0] == "(gpu || linux) && gpu"


# ------------------------------------------------------------------ fuzzing
ALPHABET = st.sampled_from([*"()[]{}<>=!&|+-*/:,'\" \t\n.0123456789",
                            "mem", "gpu", "select", "order", "rusage", "span", "same", "cu",
                            "and", "or", "not", "defined", "4G", "hosts", "ptile", "x", "1",
                            "type", "X86_64", "duration", "decay", "||", "&&", "=="])


def compile_or_error(text: str) -> None:
    try:
        req = EV.compile(text)
    except ResreqError as err:
        assert err.code and err.snippet and 0 <= err.offset <= len(text)
        assert err.column >= 1 and err.length >= 1
        return
    # Whatever compiled must evaluate without raising.
    req.match([{"hname": "a", "mem": 1, "gpu": True}, {"hname": "b", "mem": None}, {}])


@FAST
@given(st.lists(ALPHABET, max_size=40).map("".join))
def test_random_token_soup(text: str) -> None:
    compile_or_error(text)


@FAST
@given(st.text(max_size=60))
def test_random_unicode(text: str) -> None:
    compile_or_error(text)


@FAST
@given(bool_expr, st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3), ALPHABET),
                           min_size=1, max_size=4))
def test_mutated_valid_requirements(tree: tuple[Any, ...],
                                    edits: list[tuple[int, int, str]]) -> None:
    text = f"select[{render(tree)[0]}] order[mem:-r1m] rusage[mem=1G || ngpus=1]"
    for pos, action, piece in edits:
        pos %= len(text) + 1
        if action == 0:
            text = text[:pos] + text[pos + 1:]
        elif action == 1:
            text = text[:pos] + piece + text[pos:]
        elif action == 2:
            text = text[:pos] + piece + text[pos + 1:]
        else:
            text = text[:pos] + text[pos:][::-1]
    assume(text)
    compile_or_error(text)


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5000, ")" * 5000, "[" * 5000, "!" * 8000, "-" * 8000 + "1", "not " * 2000,
        "a" * 8192, "1" * 8192, "'" * 8192, "mem>1 " * 1300, "(mem>1)&&" * 900,
        "x[" * 4000, "select[" * 1000 + "]" * 1000, "order[" + "mem:" * 2000 + "mem]",
        "rusage[" + "mem=1||" * 1100 + "mem=1]", "2*{" * 2000 + "}" * 2000,
        "mem" + "+mem" * 2000 + ">1", "(" * 64 + "gpu" + ")" * 64,
        ("gpu||" * 40 + "(") * 10,
    ],
)
def test_hostile_strings_fail_fast(text: str) -> None:
    compile_or_error(text[:8192])
    compile_or_error(text + text)  # TOO_LONG when over the limit
