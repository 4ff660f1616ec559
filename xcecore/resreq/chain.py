"""Select filters from pre-written closures: usable at once, with no compile() call.

CPython's ``compile()`` of the generated filter costs ~50 us, about half of a cold compile.
The usual select section is a conjunction of simple tests (``type==X86_64 && mem>4G &&
gpu``), and for that shape a chain of one-test list comprehensions, applied one after the
other, selects exactly what the generated comprehension does: ``A and B`` short-circuits,
so B only ever sees (and can only raise for) hosts that passed A, as in a chain. The chain
runs ~30% slower per host, so :class:`~xcecore.resreq.evaluator.CompiledReq` swaps in the
generated code once it has evaluated enough hosts for compile() to pay for itself.

Each test here is written exactly as :class:`~xcecore.resreq.compiler._Gen` emits it;
``tests/resreq/test_resreq_fastpaths.py`` checks the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from xcecore.resreq.compiler import (
    _FLIP,
    _INVERSE,
    _ORDERING,
    UNKNOWN_STRING,
    HostFilter,
    _resource,
    const_value,
)
from xcecore.resreq.nodes import Compare, Logic, Name, Node, Unary
from xcecore.resreq.registry import BOOL, NUMERIC

__all__ = ["conjunction_filter"]

Hosts = Sequence[Mapping[str, Any]]
_NAN: Final = math.nan
_NUM: Final = (int, float)


# One factory per emitted test shape; ``n`` is a resource name, ``d`` the default of an
# unreported value, ``k`` the literal.
def _lt(n: str, d: Any, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if h.get(n, d) < k]


def _le(n: str, d: Any, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if h.get(n, d) <= k]


def _gt(n: str, d: Any, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if h.get(n, d) > k]


def _ge(n: str, d: Any, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if h.get(n, d) >= k]


def _eq(n: str, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if h.get(n) == k]


def _num_ne(n: str, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if ((v := h.get(n, _NAN)) < k or v > k)]


def _str_ne(n: str, k: Any) -> HostFilter:
    return lambda hosts: [h for h in hosts if (isinstance(v := h.get(n), str) and v != k)]


def _has(n: str) -> HostFilter:
    return lambda hosts: [h for h in hosts if (h.get(n) or n in (h.get("resources") or ()))]


def _has_not(n: str) -> HostFilter:
    return lambda hosts: [h for h in hosts
                          if (not (h.get(n) or n in (h.get("resources") or ())))]


_ORDER_TESTS: Final[dict[str, Callable[[str, Any, Any], HostFilter]]] = {
    "<": _lt, "<=": _le, ">": _gt, ">=": _ge,
}


def _test(node: Node, want: bool) -> HostFilter | None:
    """The one-test filter for a leaf being definitely ``want``; None if not a simple test."""
    if isinstance(node, Name):
        res = node.resource
        if node.literal or res is None or res.type != BOOL:
            return None
        return _has(res.name) if want else _has_not(res.name)
    if not isinstance(node, Compare):
        return None
    left, right, op = node.left, node.right, node.op
    if const_value(left) is not None and _resource(right) is not None:
        left, right, op = right, left, _FLIP[op]
    res = _resource(left)
    k = const_value(right)
    if res is None or k is None:
        return None
    numeric = res.type == NUMERIC
    if op in _ORDERING:
        return _ORDER_TESTS[op if want else _INVERSE[op]](
            res.name, _NAN if numeric else UNKNOWN_STRING, k)
    if (op == "==") == want:
        return _eq(res.name, k)
    return _num_ne(res.name, k) if numeric else _str_ne(res.name, k)


def _conjuncts(node: Node, want: bool, out: list[HostFilter]) -> bool:
    """Append the tests whose conjunction is ``node`` being definitely ``want``."""
    if isinstance(node, Logic):
        if (node.op == "&&") != want:
            return False  # a disjunction: not a chain
        return all(_conjuncts(c, want, out) for c in node.operands)
    if isinstance(node, Unary):
        return node.op == "!" and _conjuncts(node.operand, not want, out)
    test = _test(node, want)
    if test is None:
        return False
    out.append(test)
    return True


def conjunction_filter(node: Node) -> HostFilter | None:
    """A filter equal to the generated one for a checked select tree that is a conjunction
    of simple tests (resource vs. literal, boolean resource, negations); None otherwise."""
    tests: list[HostFilter] = []
    if not _conjuncts(node, True, tests):
        return None
    if len(tests) == 1:
        return tests[0]
    chain = tuple(tests)

    def conjunction(hosts: Hosts) -> list[Mapping[str, Any]]:
        out = chain[0](hosts)
        for test in chain[1:]:
            if not out:
                break
            out = test(out)
        return out

    return conjunction
