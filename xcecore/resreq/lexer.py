"""Tokenizer and bracket matcher for resource requirements.

Both passes are single loops over the input (no recursion), so they are safe to run on
hostile strings; the bracket pass also enforces the nesting-depth limit before the parser
sees anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from xcecore.resreq.errors import (
    BAD_VALUE,
    MAX_DEPTH,
    MAX_LENGTH,
    SYNTAX,
    TOO_DEEP,
    TOO_LONG,
    UNBALANCED,
    ResreqError,
)

__all__ = ["MEMORY_UNITS", "Token", "match_brackets", "tokenize"]

# Token kinds.
NUM: Final = "num"
STR: Final = "str"
IDENT: Final = "ident"
OP: Final = "op"
END: Final = "end"

# Unit suffix -> multiplier to megabytes (memory resources are in MB).
MEMORY_UNITS: Final = {
    "K": 1 / 1024,
    "KB": 1 / 1024,
    "M": 1.0,
    "MB": 1.0,
    "G": 1024.0,
    "GB": 1024.0,
    "T": 1024.0 * 1024.0,
    "TB": 1024.0 * 1024.0,
}

# One master pattern scanned by findall (the scan runs in C). Each match is
# (whitespace, number, unit, identifier, string, operator, stray character); positions are
# recovered by adding up lengths, which is cheaper than asking each match object.
_TOKEN_RE: Final = re.compile(
    r"""(\s*)(?:
      ((?:\d+(?:\.\d*)?|\.\d+))([A-Za-z_][A-Za-z0-9_]*)?
    | ([A-Za-z_][A-Za-z0-9_]*)
    | ("[^"\n]*"|'[^'\n]*')
    | (&&|\|\||==|!=|<=|>=|[-+*/<>!()\[\]{}:=,])
    | (\S)
    )""",
    re.VERBOSE,
)
_OPENERS: Final = {"(": ")", "[": "]", "{": "}"}
_CLOSERS: Final = {")": "(", "]": "[", "}": "{"}
# Integers beyond this are kept as floats: exact enough and never a huge bignum.
_INT_LIMIT: Final = 2**53


@dataclass(slots=True)
class Token:
    """A token: ``kind`` (num/str/ident/op/end), its source text, value and span."""

    kind: str
    text: str
    start: int
    end: int
    value: float | int | str | None = None
    unit: str | None = None


def _number(text: str, digits: str, unit: str | None, start: int) -> Token:
    """Build a number token, validating its unit suffix."""
    if "." in digits:
        value: int | float = float(digits)
    else:
        # Long digit strings stay floats (becoming inf past 1e308) so no huge ints appear.
        value = int(digits) if len(digits) <= 15 else float(digits)
    if unit is not None:
        mult = MEMORY_UNITS.get(unit.upper())
        if mult is None:
            u_start = start + len(digits)
            raise ResreqError(
                BAD_VALUE,
                f"unknown unit suffix {unit[:40]!r} (use K, M, G or T)",
                text=text,
                offset=u_start,
                length=len(unit),
            )
        value = value * mult
        if isinstance(value, float) and value.is_integer() and abs(value) < _INT_LIMIT:
            value = int(value)
    end = start + len(digits) + len(unit or "")
    return Token(NUM, text[start:end], start, end, value, unit)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with an ``end`` token.

    Raises :class:`ResreqError` (``TOO_LONG``, ``SYNTAX``, ``BAD_VALUE``) for over-long input,
    stray characters, unterminated strings and bad unit suffixes.
    """
    if len(text) > MAX_LENGTH:
        raise ResreqError(
            TOO_LONG,
            f"requirement is {len(text)} characters long; the limit is {MAX_LENGTH}",
            text=text,
            offset=MAX_LENGTH,
            length=len(text) - MAX_LENGTH,
        )
    tokens: list[Token] = []
    append = tokens.append
    pos = 0
    for ws, digits, unit, word, string, op, bad in _TOKEN_RE.findall(text):
        pos += len(ws)
        if op:
            end = pos + len(op)
            append(Token(OP, op, pos, end))
        elif word:
            end = pos + len(word)
            append(Token(IDENT, word, pos, end, word))
        elif digits:
            tok = _number(text, digits, unit or None, pos)
            end = tok.end
            append(tok)
        elif string:
            end = pos + len(string)
            append(Token(STR, string, pos, end, string[1:-1]))
        else:
            if bad in "\"'":
                raise ResreqError(SYNTAX, "unterminated string", text=text, offset=pos)
            msg = (f"unexpected {bad!r}; did you mean '{bad}{bad}'?" if bad in "&|"
                   else f"unexpected character {bad!r}")
            raise ResreqError(SYNTAX, msg, text=text, offset=pos)
        pos = end
    n = len(text)
    tokens.append(Token(END, "", n, n))
    return tokens


def match_brackets(text: str, tokens: list[Token]) -> dict[int, int]:
    """Map the index of every bracket token to the index of its partner (both ways).

    Raises ``UNBALANCED`` pointing at the unclosed opening bracket (or at a stray closing
    one), and ``TOO_DEEP`` when brackets nest deeper than the limit.
    """
    partner: dict[int, int] = {}
    stack: list[int] = []
    for i, tok in enumerate(tokens):
        if tok.kind != OP:
            continue
        t = tok.text
        if t in _OPENERS:
            stack.append(i)
            if len(stack) > MAX_DEPTH:
                raise ResreqError(
                    TOO_DEEP,
                    f"brackets nest more than {MAX_DEPTH} deep",
                    text=text,
                    offset=tok.start,
                )
        elif t in _CLOSERS:
            if not stack:
                raise ResreqError(
                    UNBALANCED, f"{t!r} has no matching {_CLOSERS[t]!r}", text=text, offset=tok.start
                )
            j = stack.pop()
            opener = tokens[j]
            if _OPENERS[opener.text] != t:
                raise ResreqError(
                    UNBALANCED,
                    f"{opener.text!r} is closed by {t!r} (column {tok.start + 1});"
                    f" expected {_OPENERS[opener.text]!r}",
                    text=text,
                    offset=opener.start,
                )
            partner[i] = j
            partner[j] = i
    if stack:
        opener = tokens[stack[-1]]
        raise ResreqError(
            UNBALANCED,
            f"{opener.text!r} is never closed",
            text=text,
            offset=opener.start,
        )
    return partner
