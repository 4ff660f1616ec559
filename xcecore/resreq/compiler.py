"""Code generation: a checked select tree -> a fast host filter; order/rusage -> closures.

The select expression becomes one Python list comprehension generated from the validated
tree. Resource names reach the source only through ``repr`` of registry names, literals not
at all (they are passed in as namespace constants ``_k0``, ``_k1``...), and the code runs with
an empty ``__builtins__``. Because literals stay out of the source, requirements differing
only in their numbers share one compiled code object (cached by source text).

Three-valued logic costs nothing at run time: for each boolean node we emit either
"definitely true" or "definitely false" Python code, so ``!x`` is F(x), ``a && b`` is
``T(a) and T(b)``, ``F(a && b)`` is ``F(a) or F(b)``; "unknown" is simply neither.

The order key and the rusage fit are small enough that pre-written closures are as fast as
generated code and cost no ``compile()`` time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from types import CodeType
from typing import Any, Final, cast

from xcecore.resreq.nodes import Arith, Compare, Defined, Logic, Name, Node, Num, Str, Unary
from xcecore.resreq.registry import BOOL, NUMERIC, STRING, Resource

__all__ = [
    "UNKNOWN_STRING",
    "HostFilter",
    "build_fit",
    "build_key",
    "build_sorter",
    "compile_select",
    "const_value",
    "fuse",
    "generate_select",
    "is_compiled",
]

HostFilter = Callable[[Sequence[Mapping[str, Any]]], list[Mapping[str, Any]]]
_NUM: Final = (int, float)
_UNK: Final = (1, 0)  # key part of an unknown value: sorts after every known (0, v)
_ORDERING: Final = frozenset({"<", "<=", ">", ">="})
_INVERSE: Final = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_FLIP: Final = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_CODE_CACHE_SIZE: Final = 512


class _Unknown:
    """Stand-in for an unreported string: every ordering comparison with it is false."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self) -> str:
        return "<unknown>"


def const_value(node: Node) -> int | float | str | None:
    """The value of a literal node (number, string, bare-word string, negated number)."""
    if isinstance(node, Num | Str):
        return node.value
    if isinstance(node, Name) and node.literal:
        return node.name
    if isinstance(node, Unary) and node.op == "-" and isinstance(node.operand, Num):
        return -node.operand.value
    return None


def _resource(node: Node) -> Resource | None:
    """The numeric/string resource a bare-word node names, if it is one."""
    if isinstance(node, Name) and not node.literal and node.resource is not None:
        return node.resource if node.resource.type != BOOL else None
    return None


def _is_string(node: Node) -> bool:
    """Whether a (checked) value node is a string."""
    if isinstance(node, Str):
        return True
    if isinstance(node, Name):
        return node.literal or (node.resource is not None and node.resource.type == STRING)
    return False


class _Gen:
    """Emits Python source for one select tree."""

    def __init__(self) -> None:
        self.nvars = 0
        self.consts: dict[str, Any] = {}

    def var(self) -> str:
        """A fresh local name (never derived from user text)."""
        self.nvars += 1
        return f"_{self.nvars}"

    def lit(self, value: int | float | str) -> str:
        """A namespace constant holding ``value``; user literals never enter the source."""
        name = f"_k{len(self.consts)}"
        self.consts[name] = value
        return name

    @staticmethod
    def has_bool(res: Resource) -> str:
        """Source for "host has boolean resource ``res``" (key or ``resources`` list)."""
        n = repr(res.name)
        return f"(h.get({n}) or {n} in (h.get('resources') or ()))"

    # ---------------------------------------------------------------- boolean nodes
    def truth(self, node: Node, want: bool) -> str:
        """Source true exactly when ``node`` is definitely ``want`` (True or False)."""
        if isinstance(node, Logic):
            # && is definitely true when all parts are, definitely false when any part is.
            joiner = " and " if (node.op == "&&") == want else " or "
            return "(" + joiner.join(self.truth(c, want) for c in node.operands) + ")"
        if isinstance(node, Unary):
            return self.truth(node.operand, not want)
        if isinstance(node, Compare):
            return self.compare(node, want)
        if isinstance(node, Defined):
            res = node.resource
            assert res is not None
            if res.type == BOOL:
                code = self.has_bool(res)
            else:
                code = f"_inst(h.get({res.name!r}), {'_NUM' if res.type == NUMERIC else '_STR'})"
        else:
            assert isinstance(node, Name) and node.resource is not None
            code = self.has_bool(node.resource)
        # Booleans and defined() are never unknown, so "definitely false" is plain negation.
        return code if want else f"(not {code})"

    def compare(self, node: Compare, want: bool) -> str:
        """Source for a comparison being definitely ``want``."""
        left, right, op = node.left, node.right, node.op
        if const_value(left) is not None and _resource(right) is not None:
            left, right, op = right, left, _FLIP[op]
        res = _resource(left)
        const = const_value(right)
        if res is not None and const is not None:
            return self.compare_const(res, op, self.lit(const), want)
        guards: list[str] = []
        lhs = self.value(left, guards)
        rhs = self.value(right, guards)
        if op in _ORDERING:
            # NaN (e.g. inf-inf) fails both op and its inverse, so it stays unknown.
            test = f"{lhs} {op if want else _INVERSE[op]} {rhs}"
        elif (op == "==") == want:
            test = f"{lhs} == {rhs}"
        elif _is_string(left):
            test = f"{lhs} != {rhs}"
        else:
            test = f"({lhs} < {rhs} or {lhs} > {rhs})"  # "not equal" that keeps NaN unknown
        return "(" + " and ".join([*guards, test]) + ")"

    def compare_const(self, res: Resource, op: str, lit: str, want: bool) -> str:
        """``resource op literal``: the common case, emitted without separate guards."""
        name = repr(res.name)
        numeric = res.type == NUMERIC
        if op in _ORDERING:
            # An unreported value defaults to NaN (numbers) or a sentinel (strings) failing
            # every ordering test, so op and its inverse are both false: unknown. None and
            # wrong-typed values raise TypeError; the caller retries those hosts sanitized.
            missing = "_NAN" if numeric else "_UNKNOWN"
            return f"(h.get({name}, {missing}) {op if want else _INVERSE[op]} {lit})"
        if (op == "==") == want:
            # None, NaN or a value of the wrong type never equals the literal: no guard.
            return f"(h.get({name}) == {lit})"
        v = self.var()
        if numeric:
            # Ordering tests reject NaN (false) and None/wrong types (TypeError) for free.
            return f"(({v} := h.get({name}, _NAN)) < {lit} or {v} > {lit})"
        return f"(_inst({v} := h.get({name}), _STR) and {v} != {lit})"

    # ---------------------------------------------------------------- value nodes
    def value(self, node: Node, guards: list[str]) -> str:
        """Source for a numeric/string value, appending its known-ness tests to ``guards``.

        Guards are appended in post-order, so a divisor's own loads precede its non-zero
        test, and every guard runs before the comparison uses the values.
        """
        const = const_value(node)
        if const is not None:
            return self.lit(const)
        if isinstance(node, Name):
            res = node.resource
            assert res is not None
            v = self.var()
            kind = "_NUM" if res.type == NUMERIC else "_STR"
            guards.append(f"_inst({v} := h.get({res.name!r}), {kind})")
            return v
        if isinstance(node, Unary):
            return f"(-{self.value(node.operand, guards)})"
        assert isinstance(node, Arith)
        parts = [self.value(node.operands[0], guards)]
        for op, operand in zip(node.ops, node.operands[1:], strict=True):
            code = self.value(operand, guards)
            if op == "/":
                # Division by zero is unknown: the comparison needs a non-zero divisor.
                guards.append(f"{code} != 0")
            parts.append(f"{op} {code}")
        return "(" + " ".join(parts) + ")"


# Source text -> code object. The source holds no user literals, so this is keyed by the
# requirement's shape; bounded, and guarded because evaluators run on many threads.
_code_cache: dict[str, CodeType] = {}
_code_lock = threading.Lock()


def _code_for(source: str) -> CodeType:
    """The compiled code object for ``source`` (generated by :class:`_Gen`)."""
    code = _code_cache.get(source)
    if code is None:
        code = compile(source, "<resreq>", "exec")
        with _code_lock:
            if len(_code_cache) >= _CODE_CACHE_SIZE:
                _code_cache.clear()
            _code_cache[source] = code
    return code


def _keep_all(hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The filter of a requirement without a select section."""
    return list(hosts)


UNKNOWN_STRING: Final = _Unknown()
"""The default of an unreported string resource in ordering tests (always false)."""


def generate_select(node: Node) -> tuple[str, dict[str, Any]]:
    """Python source of the filter for a checked select tree, and its literal constants."""
    gen = _Gen()
    expr = gen.truth(node, True)
    return f"def _filter(hosts):\n    return [h for h in hosts if {expr}]\n", gen.consts


def is_compiled(source: str) -> bool:
    """Whether ``source`` (from :func:`generate_select`) already has a cached code object."""
    return source in _code_cache


def fuse(source: str, consts: Mapping[str, Any]) -> HostFilter:
    """The filter function of generated ``source`` (compile() unless its shape is cached)."""
    namespace: dict[str, Any] = {
        "__builtins__": {},
        "_inst": isinstance,
        "_NUM": _NUM,
        "_STR": str,
        "_NAN": math.nan,
        "_UNKNOWN": UNKNOWN_STRING,
        **consts,
    }
    # Safe: the source is generated from the checked tree, never pasted from user text.
    exec(_code_for(source), namespace)
    func: HostFilter = namespace["_filter"]
    return func


def compile_select(node: Node | None) -> tuple[HostFilter, str]:
    """Compile a checked select tree to ``(filter(hosts) -> qualifying hosts, source)``.

    The filter may raise (TypeError...) for hosts carrying None or wrong-typed values;
    callers then retry those hosts with such values removed.
    """
    if node is None:
        return _keep_all, ""
    source, consts = generate_select(node)
    return fuse(source, consts), source


KeyFunc = Callable[[Mapping[str, Any]], tuple[Any, ...]]




def build_key(keys: Sequence[tuple[str, bool]]) -> KeyFunc:
    """The sort key for ``order``: ``keys`` are ``(resource, larger_is_better)`` pairs.

    A key is the flat tuple ``(unavailable, unknown1, value1, ..., hostname)``: ``unknownN``
    is 0 for a known value (``valueN`` negated when larger is better) and 1 for an unknown
    one (``valueN`` then 0), so unknowns sort last. Flat tuples sort faster than nested ones.
    """
    inst, num = isinstance, _NUM
    if not keys:
        def key0(h: Mapping[str, Any]) -> tuple[Any, ...]:
            n = h.get("hname")
            return (h.get("status", "ok") != "ok", n if inst(n, str) else "")

        return key0
    if len(keys) == 1:
        # The common cases get specialised closures: no loop per host.
        ((n1, big1),) = keys
        s1 = -1 if big1 else 1

        def key1(h: Mapping[str, Any]) -> tuple[Any, ...]:
            v: Any = h.get(n1)
            n = h.get("hname")
            name = n if inst(n, str) else ""
            if inst(v, num) and v == v:
                return (h.get("status", "ok") != "ok", 0, s1 * v, name)
            return (h.get("status", "ok") != "ok", 1, 0, name)

        return key1
    if len(keys) == 2:
        (n1, big1), (n2, big2) = keys
        s1, s2 = (-1 if big1 else 1), (-1 if big2 else 1)

        def key2(h: Mapping[str, Any]) -> tuple[Any, ...]:
            v: Any = h.get(n1)
            w: Any = h.get(n2)
            n = h.get("hname")
            k1 = (0, s1 * v) if inst(v, num) and v == v else _UNK
            k2 = (0, s2 * w) if inst(w, num) and w == w else _UNK
            return (h.get("status", "ok") != "ok", *k1, *k2, n if inst(n, str) else "")

        return key2
    signs = tuple((name, -1 if big else 1) for name, big in keys)

    def keyn(h: Mapping[str, Any]) -> tuple[Any, ...]:
        out: list[Any] = [h.get("status", "ok") != "ok"]
        for name, sign in signs:
            v: Any = h.get(name)
            out += (0, sign * v) if inst(v, num) and v == v else _UNK
        n = h.get("hname")
        out.append(n if inst(n, str) else "")
        return tuple(out)

    return keyn


SortFunc = Callable[[Sequence[Mapping[str, Any]]], list[Mapping[str, Any]]]


def _getter(values: list[Any]) -> Callable[[int], Any]:
    """``values[i]`` as a key function that runs in C (no Python frame per element)."""
    return cast(Callable[[int], Any], values.__getitem__)


def build_sorter(keys: Sequence[tuple[str, bool]]) -> SortFunc:
    """``sort(hosts)``: a new list in exactly the order ``sorted(hosts, key=build_key(keys))``.

    Instead of one sort on composite tuple keys (every comparison walks tuples through
    generic rich comparisons), this runs stable sorts from the least significant key up:
    host name, then each order key from last to first, then availability. Each pass sorts
    indices by a flat list of strings or numbers, so CPython's type-specialised comparisons
    apply, and input already in name order (the usual case) costs one linear pass. Unknown
    values (and unavailable hosts) are moved behind the rest with order-preserving
    partitions, which is what the tuple key's unknown flag (and leading status) does.
    """
    num = _NUM
    signs = tuple((name, big) for name, big in reversed(keys))

    def sort_hosts(hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        names: list[Any] = [n if isinstance(n := h.get("hname"), str) else "" for h in hosts]
        order = sorted(range(len(hosts)), key=_getter(names))
        for name, big in signs:
            # None marks unknown; larger-is-better values are negated, as in build_key.
            vals: list[Any]
            if big:
                vals = [-v if isinstance(v := h.get(name), num) and v == v else None for h in hosts]
            else:
                vals = [v if isinstance(v := h.get(name), num) and v == v else None for h in hosts]
            if None in vals:
                known = [i for i in order if vals[i] is not None]
                known.sort(key=_getter(vals))
                order = known + [i for i in order if vals[i] is None]
            else:
                order.sort(key=_getter(vals))
        down = [h.get("status", "ok") != "ok" for h in hosts]
        if True in down:
            order = [i for i in order if not down[i]] + [i for i in order if down[i]]
        return [hosts[i] for i in order]

    return sort_hosts


FitFunc = Callable[[Mapping[str, Any]], "int | None"]


def build_fit(alternatives: Sequence[Mapping[str, float]]) -> FitFunc:
    """``fit(host)``: index of the first alternative whose amounts the host has available."""
    inst, num = isinstance, _NUM
    if not alternatives:
        return lambda h: 0
    if len(alternatives) == 1 and len(alternatives[0]) == 1:
        ((name, amount),) = alternatives[0].items()

        def fit1(h: Mapping[str, Any]) -> int | None:
            v: Any = h.get(name)
            return 0 if inst(v, num) and v >= amount else None

        return fit1
    table = tuple(tuple(alt.items()) for alt in alternatives)

    def fitn(h: Mapping[str, Any]) -> int | None:
        for index, items in enumerate(table):
            for name, amount in items:
                v: Any = h.get(name)
                if not (inst(v, num) and v >= amount):
                    break
            else:
                return index
        return None

    return fitn
