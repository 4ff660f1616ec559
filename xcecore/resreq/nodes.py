"""Syntax tree of a resource requirement; every node keeps its span in the original string.

Associative chains (``a && b && c``, ``a + b - c``) are flattened into one n-ary node, so the
tree's depth reflects real nesting rather than the length of a requirement. The checker fills
in the ``resource``/``literal`` fields of names once they are resolved against a registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xcecore.resreq.registry import Resource

__all__ = [
    "Arith",
    "Compare",
    "Defined",
    "Logic",
    "Name",
    "Node",
    "Num",
    "OrderKey",
    "ParsedReq",
    "RusageGroup",
    "RusageItem",
    "SameName",
    "SpanSpec",
    "Str",
    "Unary",
]


@dataclass(slots=True, eq=False, kw_only=True)
class Node:
    """Base of expression nodes: span ``[start, end)``, tree depth, parenthesized flag."""

    start: int
    end: int
    depth: int = 1
    paren: bool = False


@dataclass(slots=True, eq=False, kw_only=True)
class Num(Node):
    """A number literal; ``value`` is already scaled to MB when it had a unit suffix."""

    value: int | float
    unit: str | None = None


@dataclass(slots=True, eq=False, kw_only=True)
class Str(Node):
    """A quoted string literal (or, after checking, nothing: bare words stay :class:`Name`)."""

    value: str


@dataclass(slots=True, eq=False, kw_only=True)
class Name(Node):
    """A bare word: a resource, or a string when compared with a string resource."""

    name: str
    resource: Resource | None = None
    literal: bool = False


@dataclass(slots=True, eq=False, kw_only=True)
class Defined(Node):
    """``defined(name)``: whether the host reports the resource."""

    name: str
    name_start: int
    name_end: int
    resource: Resource | None = None


@dataclass(slots=True, eq=False, kw_only=True)
class Unary(Node):
    """``!x`` (also spelled ``not``) or ``-x``."""

    op: str
    operand: Node


@dataclass(slots=True, eq=False, kw_only=True)
class Arith(Node):
    """A flattened chain of ``+``/``-`` or of ``*``/``/``: ``ops[i]`` joins operands i and i+1."""

    ops: list[str]
    op_starts: list[int]
    operands: list[Node]


@dataclass(slots=True, eq=False, kw_only=True)
class Compare(Node):
    """One comparison ``left op right`` (chains are rejected by the parser)."""

    op: str
    op_start: int
    left: Node
    right: Node


@dataclass(slots=True, eq=False, kw_only=True)
class Logic(Node):
    """A flattened chain of ``&&`` (or of ``||``)."""

    op: str
    operands: list[Node]


@dataclass(slots=True, eq=False)
class OrderKey:
    """One ``order[...]`` key: resource name (and its span), whether ``-`` reversed it."""

    name: str
    reverse: bool
    start: int
    end: int
    resource: Resource | None = None


@dataclass(slots=True, eq=False)
class RusageItem:
    """One ``res=value`` of an rusage group (value scaled to MB when it had a unit)."""

    name: str
    value: int | float
    unit: str | None
    start: int
    end: int
    resource: Resource | None = None


@dataclass(slots=True, eq=False)
class RusageGroup:
    """Comma-separated part of one rusage alternative, sharing ``duration``/``decay``."""

    items: list[RusageItem]
    duration: int | float | None
    decay: int | None


@dataclass(slots=True, eq=False)
class SpanSpec:
    """``span[hosts=1]`` or ``span[ptile=N]``."""

    key: str
    value: int
    start: int
    end: int


@dataclass(slots=True, eq=False)
class SameName:
    """One resource name of ``same[...]``."""

    name: str
    start: int
    end: int
    resource: Resource | None = None


@dataclass(slots=True, eq=False)
class ParsedReq:
    """A parsed requirement: each section's content (None when the section is absent)."""

    text: str
    select: Node | None = None
    order: list[OrderKey] | None = None
    rusage: list[list[RusageGroup]] | None = None
    span: SpanSpec | None = None
    same: list[SameName] | None = None
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
