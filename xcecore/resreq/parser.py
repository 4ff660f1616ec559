"""Parser: tokens -> :class:`ParsedReq` (sections plus expression trees with positions).

The expression parser is an operator-precedence (shunting-yard) loop with explicit stacks,
so no Python recursion happens while parsing; depth and node-count limits are enforced as
nodes are built, before anything recursive (checker, compiler) walks the tree.
"""

from __future__ import annotations

import difflib
from typing import Final

from xcecore.resreq.errors import (
    BAD_VALUE,
    CHAINED_COMPARISON,
    DUPLICATE_SECTION,
    MAX_DEPTH,
    MAX_NODES,
    SYNTAX,
    TOO_DEEP,
    TOO_MANY_NODES,
    UNBALANCED,
    UNKNOWN_SECTION,
    UNSUPPORTED_SECTION,
    ResreqError,
)
from xcecore.resreq.lexer import END, IDENT, NUM, OP, STR, Token, match_brackets, tokenize
from xcecore.resreq.nodes import (
    Arith,
    Compare,
    Defined,
    Logic,
    Name,
    Node,
    Num,
    OrderKey,
    ParsedReq,
    RusageGroup,
    RusageItem,
    SameName,
    SpanSpec,
    Str,
    Unary,
)

__all__ = ["SECTIONS", "parse"]

SECTIONS: Final = ("select", "order", "rusage", "span", "same")
_UNSUPPORTED: Final = ("cu", "affinity")

# Binary operator -> precedence (higher binds tighter). Unary operators bind tightest (7).
_BINARY: Final = {
    "||": 1, "or": 1,
    "&&": 2, "and": 2,
    "==": 3, "!=": 3,
    "<": 4, "<=": 4, ">": 4, ">=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6,
}  # fmt: skip
_CANON: Final = {"or": "||", "and": "&&"}
_UNARY_PREC: Final = 7
_PAREN: Final = 0  # stack marker precedence for "("


class _Parser:
    """Parses one requirement string; holds the tokens and the shared node budget."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.partner = match_brackets(text, self.tokens)
        self.nodes = 0

    # ---------------------------------------------------------------- helpers
    def err(self, code: str, msg: str, start: int, end: int, section: str | None) -> ResreqError:
        """An error for the span ``[start, end)``."""
        return ResreqError(code, msg, text=self.text, offset=start, length=end - start,
                           section=section)

    def count(self, tok: Token | Node, section: str | None) -> None:
        """Charge one node against the node budget."""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.err(TOO_MANY_NODES, f"requirement has more than {MAX_NODES} elements",
                           tok.start, tok.end, section)

    def built(self, node: Node, section: str) -> Node:
        """Charge a new expression node and enforce the depth limit."""
        self.count(node, section)
        if node.depth > MAX_DEPTH:
            raise self.err(TOO_DEEP, f"expression nests more than {MAX_DEPTH} levels deep",
                           node.start, node.end, section)
        return node

    def is_section_start(self, i: int) -> bool:
        """Whether tokens ``i, i+1`` are ``word [``."""
        t = self.tokens
        return t[i].kind == IDENT and t[i + 1].kind == OP and t[i + 1].text == "["

    @staticmethod
    def describe(tok: Token) -> str:
        """How to name a token in a message."""
        return "end of input" if tok.kind == END else repr(tok.text[:40])

    # ---------------------------------------------------------------- top level
    def parse(self) -> ParsedReq:
        """Parse the whole requirement."""
        toks = self.tokens
        req = ParsedReq(self.text)
        for j, tok in enumerate(toks):
            if tok.kind == OP and tok.text == "{":
                start = tok.start
                if j >= 2 and toks[j - 1].text == "*" and toks[j - 2].kind == NUM:
                    start = toks[j - 2].start
                raise self.err(UNSUPPORTED_SECTION,
                               "compound requirements (N*{...}) are not supported",
                               start, toks[self.partner[j]].end, "compound")
        i = 0
        if toks[0].kind != END and not self.is_section_start(0):
            node, i = self.expression(0, len(toks) - 1, "select", bare=True)
            req.select = node
            req.sections["select"] = (node.start, node.end)
            if toks[i].kind != END and not self.is_section_start(i):
                raise self.err(SYNTAX, f"expected an operator or a section such as order[...],"
                               f" found {self.describe(toks[i])}", toks[i].start, toks[i].end,
                               "select")
        while toks[i].kind != END:
            if not self.is_section_start(i):
                raise self.err(SYNTAX, f"expected a section such as order[...], found"
                               f" {self.describe(toks[i])}", toks[i].start, toks[i].end, None)
            i = self.section(req, i)
        return req

    def section(self, req: ParsedReq, i: int) -> int:
        """Parse the section starting at token ``i``; return the index after it."""
        tok = self.tokens[i]
        name = tok.text
        close = self.partner[i + 1]
        end = self.tokens[close].end
        if name in _UNSUPPORTED:
            raise self.err(UNSUPPORTED_SECTION, f"the {name}[...] section is not supported",
                           tok.start, end, name)
        if name not in SECTIONS:
            close_names = difflib.get_close_matches(name[:40], SECTIONS, n=1)
            hint = f"; did you mean '{close_names[0]}'?" if close_names else ""
            raise self.err(UNKNOWN_SECTION, f"unknown section {name[:40]!r}{hint}"
                           f" (sections: {', '.join(SECTIONS)})", tok.start, tok.end, None)
        if name in req.sections:
            first = req.sections[name][0]
            raise self.err(DUPLICATE_SECTION, f"the {name} section appears twice"
                           f" (first at offset {first})", tok.start, tok.end, name)
        req.sections[name] = (tok.start, end)
        lo, hi = i + 2, close
        if lo == hi:
            raise self.err(SYNTAX, f"empty {name} section", tok.start, end, name)
        if name == "select":
            req.select, _ = self.expression(lo, hi, "select", bare=False)
        elif name == "order":
            req.order = self.order(lo, hi)
        elif name == "rusage":
            req.rusage = self.rusage(lo, hi)
        elif name == "span":
            req.span = self.span(lo, hi)
        else:
            req.same = self.same(lo, hi)
        return close + 1

    # ---------------------------------------------------------------- simple sections
    def split(self, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
        """Split token range ``[lo, hi)`` on ``sep`` operators."""
        parts: list[tuple[int, int]] = []
        start = lo
        for k in range(lo, hi):
            tok = self.tokens[k]
            if tok.kind == OP and tok.text == sep:
                parts.append((start, k))
                start = k + 1
        parts.append((start, hi))
        return parts

    def empty_part(self, a: int, section: str, what: str) -> ResreqError:
        """Error for an empty element (e.g. ``order[mem::ut]``)."""
        tok = self.tokens[a] if a < len(self.tokens) else self.tokens[-1]
        return self.err(SYNTAX, f"expected {what}, found {self.describe(tok)}",
                        tok.start, tok.end, section)

    def ident(self, k: int, section: str, what: str) -> Token:
        """The identifier token at ``k`` (or a syntax error)."""
        tok = self.tokens[k]
        if tok.kind != IDENT:
            raise self.err(SYNTAX, f"expected {what}, found {self.describe(tok)}",
                           tok.start, tok.end, section)
        return tok

    def expect_end(self, k: int, hi: int, section: str) -> None:
        """Nothing may follow position ``k`` in the part ending at ``hi``."""
        if k < hi:
            tok = self.tokens[k]
            raise self.err(SYNTAX, f"unexpected {self.describe(tok)} in {section}[...]",
                           tok.start, tok.end, section)

    def order(self, lo: int, hi: int) -> list[OrderKey]:
        """``order[key:key...]`` where a key is ``res`` or ``-res``."""
        keys: list[OrderKey] = []
        for a, b in self.split(lo, hi, ":"):
            if a == b:
                raise self.empty_part(a, "order", "a resource name")
            first = self.tokens[a]
            reverse = first.kind == OP and first.text == "-"
            tok = self.ident(a + 1 if reverse else a, "order", "a resource name")
            self.expect_end((a + 2) if reverse else (a + 1), b, "order")
            self.count(tok, "order")
            keys.append(OrderKey(tok.text, reverse, tok.start, tok.end))
        return keys

    def same(self, lo: int, hi: int) -> list[SameName]:
        """``same[res:res...]``."""
        names: list[SameName] = []
        for a, b in self.split(lo, hi, ":"):
            if a == b:
                raise self.empty_part(a, "same", "a resource name")
            tok = self.ident(a, "same", "a resource name")
            self.expect_end(a + 1, b, "same")
            self.count(tok, "same")
            names.append(SameName(tok.text, tok.start, tok.end))
        return names

    def assignment(self, a: int, b: int, section: str) -> tuple[Token, Token]:
        """``name = number`` filling exactly tokens ``[a, b)``."""
        if a == b:
            raise self.empty_part(a, section, "name=value")
        name = self.ident(a, section, "a resource name")
        eq = self.tokens[a + 1] if a + 1 < b else self.tokens[b]
        if eq.kind != OP or eq.text != "=" or a + 1 >= b:
            raise self.err(SYNTAX, f"expected '=' after {name.text[:40]!r}", eq.start,
                           max(eq.end, eq.start + 1), section)
        val = self.tokens[a + 2] if a + 2 < b else self.tokens[b]
        if val.kind != NUM or a + 2 >= b:
            raise self.err(BAD_VALUE, f"{name.text[:40]} needs a non-negative number",
                           val.start, max(val.end, val.start + 1), section)
        self.expect_end(a + 3, b, section)
        self.count(name, section)
        return name, val

    def span(self, lo: int, hi: int) -> SpanSpec:
        """``span[hosts=1]`` or ``span[ptile=N]``."""
        name, val = self.assignment(lo, hi, "span")
        if name.text not in ("hosts", "ptile"):
            raise self.err(BAD_VALUE, f"span supports hosts=1 or ptile=N, not {name.text[:40]!r}",
                           name.start, name.end, "span")
        value = val.value
        if name.text == "hosts" and value != 1:
            raise self.err(BAD_VALUE, "only span[hosts=1] is supported", val.start, val.end, "span")
        if not isinstance(value, int) or value < 1 or val.unit is not None:
            raise self.err(BAD_VALUE, "ptile must be a positive whole number", val.start,
                           val.end, "span")
        return SpanSpec(name.text, value, name.start, val.end)

    def rusage(self, lo: int, hi: int) -> list[list[RusageGroup]]:
        """``rusage[res=val:...:duration=N:decay=0/1, ... || ...]``."""
        alternatives: list[list[RusageGroup]] = []
        for alo, ahi in self.split(lo, hi, "||"):
            if alo == ahi:
                raise self.empty_part(alo, "rusage", "an rusage alternative")
            groups: list[RusageGroup] = []
            for glo, ghi in self.split(alo, ahi, ","):
                items: list[RusageItem] = []
                duration: int | float | None = None
                decay: int | None = None
                for a, b in self.split(glo, ghi, ":"):
                    name, val = self.assignment(a, b, "rusage")
                    value = val.value
                    assert isinstance(value, int | float)
                    if name.text == "duration":
                        if val.unit is not None:
                            raise self.err(BAD_VALUE, "duration is in minutes; no unit suffix",
                                           val.start, val.end, "rusage")
                        duration = value
                    elif name.text == "decay":
                        if value not in (0, 1):
                            raise self.err(BAD_VALUE, "decay must be 0 or 1", val.start,
                                           val.end, "rusage")
                        decay = int(value)
                    else:
                        items.append(RusageItem(name.text, value, val.unit, name.start, val.end))
                if not items:
                    tok = self.tokens[glo]
                    raise self.err(SYNTAX, "rusage part names no resource", tok.start,
                                   self.tokens[ghi - 1].end, "rusage")
                groups.append(RusageGroup(items, duration, decay))
            alternatives.append(groups)
        return alternatives

    # ---------------------------------------------------------------- expressions
    def expression(self, lo: int, hi: int, section: str, *, bare: bool) -> tuple[Node, int]:
        """Parse an expression from token ``lo``; return it and the index where it ended.

        Inside ``select[...]`` the expression must fill ``[lo, hi)``; a bare leading
        expression stops at the first token that cannot continue it.
        """
        toks = self.tokens
        operands: list[Node] = []
        # Operator stack entries: (precedence, operator, token); "(" has precedence 0.
        ops: list[tuple[int, str, Token]] = []
        want_operand = True
        open_parens = 0
        run = 0  # consecutive unary operators, bounded so a "!!!!..." string fails fast
        i = lo
        while i < hi:
            tok = toks[i]
            kind, t = tok.kind, tok.text
            if not (want_operand and ((kind == OP and t in ("!", "-")) or t == "not")):
                run = 0
            if want_operand:
                if kind == NUM:
                    assert isinstance(tok.value, int | float)
                    self.count(tok, section)  # leaves have depth 1: only the count matters
                    operands.append(Num(start=tok.start, end=tok.end, value=tok.value,
                                        unit=tok.unit))
                    want_operand = False
                elif kind == STR:
                    assert isinstance(tok.value, str)
                    self.count(tok, section)
                    operands.append(Str(start=tok.start, end=tok.end, value=tok.value))
                    want_operand = False
                elif (kind == IDENT and t == "not") or (kind == OP and t in ("!", "-")):
                    run += 1
                    if run > MAX_DEPTH:
                        raise self.err(TOO_DEEP, f"more than {MAX_DEPTH} unary operators in a"
                                       " row", tok.start, tok.end, section)
                    ops.append((_UNARY_PREC, "!" if t == "not" else t, tok))
                elif kind == OP and t == "(":
                    open_parens += 1
                    ops.append((_PAREN, "(", tok))
                elif kind == IDENT and t == "defined":
                    operands.append(self.defined(i, hi, section))
                    i += 3
                    want_operand = False
                elif kind == IDENT and t not in _BINARY and toks[i + 1].text != "[":
                    self.count(tok, section)
                    operands.append(Name(start=tok.start, end=tok.end, name=t))
                    want_operand = False
                else:
                    raise self.err(SYNTAX, f"expected a value, found {self.describe(tok)}",
                                   tok.start, max(tok.end, tok.start + 1), section)
            else:
                if kind in (OP, IDENT) and t in _BINARY:
                    prec = _BINARY[t]
                    while ops and ops[-1][0] >= prec:
                        self.reduce(operands, ops, section)
                    ops.append((prec, _CANON.get(t, t), tok))
                    want_operand = True
                elif kind == OP and t == ")":
                    if not open_parens:
                        raise self.err(SYNTAX, "')' closes nothing in this expression",
                                       tok.start, tok.end, section)
                    while ops[-1][1] != "(":
                        self.reduce(operands, ops, section)
                    open_parens -= 1
                    open_tok = ops.pop()[2]
                    top = operands[-1]
                    top.paren = True
                    top.start, top.end = open_tok.start, tok.end
                elif kind == OP and t == "=":
                    raise self.err(SYNTAX, "unexpected '='; did you mean '=='?", tok.start,
                                   tok.end, section)
                elif bare:
                    break
                else:
                    raise self.err(SYNTAX, f"expected an operator, found {self.describe(tok)}",
                                   tok.start, max(tok.end, tok.start + 1), section)
            i += 1
        if want_operand:
            if i == lo:
                tok = toks[i]
                raise self.err(SYNTAX, f"expected an expression, found {self.describe(tok)}",
                               tok.start, max(tok.end, tok.start + 1), section)
            tok = toks[i - 1]
            raise self.err(SYNTAX, f"expression ends unexpectedly after {self.describe(tok)}",
                           tok.start, tok.end, section)
        for _prec, op, tok in ops:
            if op == "(":
                raise self.err(UNBALANCED, "'(' is not closed before the next section",
                               tok.start, tok.end, section)
        while ops:
            self.reduce(operands, ops, section)
        return operands[0], i

    def defined(self, i: int, hi: int, section: str) -> Node:
        """``defined(name)`` starting at token ``i``."""
        toks = self.tokens
        kw = toks[i]
        if (i + 3 < hi and toks[i + 1].text == "(" and toks[i + 1].kind == OP
                and toks[i + 2].kind == IDENT and toks[i + 3].kind == OP
                and toks[i + 3].text == ")"):
            name = toks[i + 2]
            return self.built(Defined(start=kw.start, end=toks[i + 3].end, name=name.text,
                                      name_start=name.start, name_end=name.end), section)
        raise self.err(SYNTAX, "defined takes one resource name: defined(name)", kw.start,
                       kw.end, section)

    def reduce(self, operands: list[Node], ops: list[tuple[int, str, Token]],
               section: str) -> None:
        """Pop one operator and combine its operand(s) into a node."""
        prec, op, tok = ops.pop()
        if prec == _UNARY_PREC:
            arg = operands.pop()
            operands.append(self.built(Unary(start=tok.start, end=arg.end, depth=arg.depth + 1,
                                             op=op, operand=arg), section))
            return
        rhs = operands.pop()
        lhs = operands.pop()
        depth = max(lhs.depth, rhs.depth) + 1
        node: Node
        if prec <= 2:
            if isinstance(lhs, Logic) and lhs.op == op and not lhs.paren:
                lhs.operands.append(rhs)
                lhs.end, lhs.depth = rhs.end, max(lhs.depth, rhs.depth + 1)
                node = lhs
            else:
                node = Logic(start=lhs.start, end=rhs.end, depth=depth, op=op,
                             operands=[lhs, rhs])
        elif prec <= 4:
            for side in (lhs, rhs):
                if isinstance(side, Compare) and not side.paren:
                    raise self.err(CHAINED_COMPARISON, f"chained comparison at {op!r}; combine"
                                   " comparisons with && (e.g. a<b && b<c)", tok.start,
                                   tok.end, section)
            node = Compare(start=lhs.start, end=rhs.end, depth=depth, op=op,
                           op_start=tok.start, left=lhs, right=rhs)
        else:
            group = ("+", "-") if prec == 5 else ("*", "/")
            if isinstance(lhs, Arith) and lhs.ops[0] in group and not lhs.paren:
                lhs.ops.append(op)
                lhs.op_starts.append(tok.start)
                lhs.operands.append(rhs)
                lhs.end, lhs.depth = rhs.end, max(lhs.depth, rhs.depth + 1)
                node = lhs
            else:
                node = Arith(start=lhs.start, end=rhs.end, depth=depth, ops=[op],
                             op_starts=[tok.start], operands=[lhs, rhs])
        if node is lhs:
            self.count(tok, section)
            if node.depth > MAX_DEPTH:
                raise self.err(TOO_DEEP, f"expression nests more than {MAX_DEPTH} levels deep",
                               node.start, node.end, section)
        else:
            self.built(node, section)
        operands.append(node)


def parse(text: str) -> ParsedReq:
    """Parse ``text`` into sections and syntax trees (no resource names checked yet)."""
    if not isinstance(text, str):
        raise TypeError(f"a requirement must be a str, not {type(text).__name__}")
    return _Parser(text).parse()
