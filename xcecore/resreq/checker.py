"""Name resolution and type checking of a parsed requirement against a registry.

Runs after the parser has bounded the tree's depth (<= MAX_DEPTH), so its recursion is safe.
It annotates the tree in place: each :class:`Name` gets its :class:`Resource` or is marked as
a string literal (a bare word compared with a string resource).
"""

from __future__ import annotations

from typing import Final

from xcecore.resreq.errors import BAD_VALUE, TYPE_MISMATCH, UNKNOWN_RESOURCE, ResreqError
from xcecore.resreq.nodes import (
    Arith,
    Compare,
    Defined,
    Logic,
    Name,
    Node,
    Num,
    ParsedReq,
    Str,
    Unary,
)
from xcecore.resreq.registry import BOOL, NUMERIC, STRING, Resource, ResourceRegistry

__all__ = ["check"]

_WORD: Final = {BOOL: "boolean", NUMERIC: "numeric", STRING: "string"}


class _Checker:
    """Checks one parsed requirement."""

    def __init__(self, req: ParsedReq, registry: ResourceRegistry) -> None:
        self.req = req
        self.text = req.text
        self.registry = registry

    def err(self, code: str, msg: str, start: int, end: int, section: str,
            suggestion: str | None = None) -> ResreqError:
        """An error for the span ``[start, end)``."""
        return ResreqError(code, msg, text=self.text, offset=start, length=end - start,
                           section=section, suggestion=suggestion)

    def resolve(self, name: str, start: int, end: int, section: str) -> Resource:
        """The resource ``name`` names, or an UNKNOWN_RESOURCE error with a suggestion."""
        res = self.registry.get(name)
        if res is not None:
            return res
        guess = self.registry.suggest(name) if len(name) <= 64 else None
        hint = f"; did you mean '{guess}'?" if guess else ""
        raise self.err(UNKNOWN_RESOURCE, f"unknown resource {name[:64]!r}{hint}", start, end,
                       section, guess)

    # ---------------------------------------------------------------- expressions
    def expr(self, node: Node, section: str) -> str:
        """Type of ``node`` (bool/numeric/string); annotate names; raise on misuse."""
        if isinstance(node, Num):
            return NUMERIC
        if isinstance(node, Str):
            return STRING
        if isinstance(node, Name):
            node.resource = self.resolve(node.name, node.start, node.end, section)
            return node.resource.type
        if isinstance(node, Defined):
            node.resource = self.resolve(node.name, node.name_start, node.name_end, section)
            return BOOL
        if isinstance(node, Unary):
            want = BOOL if node.op == "!" else NUMERIC
            self.want(node.operand, want, f"'{node.op}'", section)
            return want
        if isinstance(node, Arith):
            for operand, op in zip(node.operands, ["", *node.ops], strict=True):
                self.want(operand, NUMERIC, f"'{op or node.ops[0]}'", section)
            return NUMERIC
        if isinstance(node, Logic):
            for operand in node.operands:
                self.want(operand, BOOL, f"'{node.op}'", section)
            return BOOL
        assert isinstance(node, Compare)
        return self.compare(node, section)

    def want(self, node: Node, want: str, user: str, section: str) -> None:
        """Require ``node`` to have type ``want`` (``user`` names who needs it)."""
        got = self.expr(node, section)
        if got != want:
            hint = ""
            if got == NUMERIC and want == BOOL:
                hint = " (compare it, e.g. x>0)"
            raise self.err(TYPE_MISMATCH, f"{user} needs a {_WORD[want]} operand, but"
                           f" {self.snip(node)} is {_WORD[got]}{hint}", node.start, node.end,
                           section)

    def snip(self, node: Node) -> str:
        """The source text of ``node``, shortened for messages."""
        s = self.text[node.start : node.end]
        return repr(s if len(s) <= 40 else s[:37] + "...")

    def string_resource(self, node: Node) -> bool:
        """Whether ``node`` is a bare word naming a string resource."""
        if not isinstance(node, Name):
            return False
        res = self.registry.get(node.name)
        return res is not None and res.type == STRING

    def compare(self, node: Compare, section: str) -> str:
        """Check a comparison; bare words facing a string resource become strings."""
        left, right = node.left, node.right
        for a, b in ((left, right), (right, left)):
            if (isinstance(b, Name) and self.string_resource(a)
                    and self.registry.get(b.name) is None):
                b.literal = True
        lt = STRING if isinstance(left, Name) and left.literal else self.expr(left, section)
        rt = STRING if isinstance(right, Name) and right.literal else self.expr(right, section)
        for side, t in ((left, lt), (right, rt)):
            if t == BOOL:
                raise self.err(TYPE_MISMATCH, f"cannot compare {self.snip(side)}: it is true or"
                               " false already (use it directly, or negate it with !)",
                               side.start, side.end, section)
        if lt != rt:
            hint = ""
            if STRING in (lt, rt):
                hint = " (quote a word to compare it as a string)"
            raise self.err(TYPE_MISMATCH, f"cannot compare {_WORD[lt]} {self.snip(left)} with"
                           f" {_WORD[rt]} {self.snip(right)}{hint}", node.start, node.end,
                           section)
        if lt == NUMERIC:
            for a, b in ((left, right), (right, left)):
                if (isinstance(a, Num) and a.unit is not None and isinstance(b, Name)
                        and b.resource is not None and b.resource.unit != "MB"):
                    raise self.err(TYPE_MISMATCH, f"unit suffix {a.unit!r} is for memory"
                                   f" resources (MB); {b.name!r} has no unit", a.start, a.end,
                                   section)
        return BOOL

    # ---------------------------------------------------------------- sections
    def check(self) -> None:
        """Check every section of the requirement."""
        req = self.req
        if req.select is not None:
            t = self.expr(req.select, "select")
            if t != BOOL:
                node = req.select
                raise self.err(TYPE_MISMATCH, f"select needs a true/false expression, but"
                               f" {self.snip(node)} is {_WORD[t]}", node.start, node.end,
                               "select")
        seen: set[str] = set()
        for key in req.order or ():
            key.resource = self.resolve(key.name, key.start, key.end, "order")
            if key.resource.type != NUMERIC:
                raise self.err(TYPE_MISMATCH, f"order needs numeric resources;"
                               f" {key.name!r} is {_WORD[key.resource.type]}", key.start,
                               key.end, "order")
            if key.resource.name in seen:
                raise self.err(BAD_VALUE, f"{key.name!r} appears twice in order[...]",
                               key.start, key.end, "order")
            seen.add(key.resource.name)
        for alternative in req.rusage or ():
            used: set[str] = set()
            for group in alternative:
                for item in group.items:
                    res = self.resolve(item.name, item.start, item.start + len(item.name),
                                       "rusage")
                    item.resource = res
                    if res.type != NUMERIC or not res.consumable:
                        raise self.err(TYPE_MISMATCH, f"{item.name!r} is not a consumable"
                                       " resource, so it cannot be reserved in rusage",
                                       item.start, item.end, "rusage")
                    if item.unit is not None and res.unit != "MB":
                        raise self.err(TYPE_MISMATCH, f"unit suffix {item.unit!r} is for memory"
                                       f" resources (MB); {item.name!r} has no unit",
                                       item.start, item.end, "rusage")
                    if res.name in used:
                        raise self.err(BAD_VALUE, f"{item.name!r} is reserved twice in one"
                                       " alternative", item.start, item.end, "rusage")
                    used.add(res.name)
        same_seen: set[str] = set()
        for name in req.same or ():
            name.resource = self.resolve(name.name, name.start, name.end, "same")
            if name.resource.name in same_seen:
                raise self.err(BAD_VALUE, f"{name.name!r} appears twice in same[...]",
                               name.start, name.end, "same")
            same_seen.add(name.resource.name)


def check(req: ParsedReq, registry: ResourceRegistry) -> ParsedReq:
    """Resolve names and check types in ``req`` (in place); return it."""
    _Checker(req, registry).check()
    return req
