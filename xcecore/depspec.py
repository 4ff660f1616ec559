"""Job dependency expressions: LSF's ``-w`` and Slurm's ``--dependency``, parsed once into a
small tree, evaluated against what is known of the jobs they name.

LSF form (``bsub -w``): terms ``done(REF)``, ``exit(REF)``, ``exit(REF, OP CODE)`` (OP one of
``== != > >= < <=``), ``ended(REF)``, ``started(REF)``, or a bare ``REF`` (``done(REF)``),
combined with ``&&``, ``||``, ``!`` and parentheses (``!`` binds tightest, then ``&&``).
A REF is a job id (``12``), an array element (``12[3]``), or a job name (``"sim"`` or
``sim``, quoted when it holds anything but letters, digits, ``_ . -``).

Slurm form (``--dependency``): ``TYPE:ID[:ID...]`` items, joined by ``,`` (all must hold) or
``?`` (any may); ``afterok`` is ``done``, ``afternotok`` ``exit``, ``afterany`` ``ended``,
``after`` ``started``. :func:`parse` takes either (Slurm's when the text starts with
``after``).

Each part of an expression evaluates to (holds now, can no longer change): ``done(J)`` of an
EXIT job is false for good, ``started(J)`` of a pending one false for now, so an expression
that can never be satisfied is known as such (:func:`evaluate`: :data:`TRUE`, :data:`WAIT`
or :data:`NEVER`), and :func:`blocking` names the part that keeps it from holding. A job
that is unknown is false for good. Pure functions, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

TEXT_MAX: Final = 4096
TERMS_MAX: Final = 256
KINDS: Final = ("done", "exit", "ended", "started")
SLURM: Final = {"afterok": "done", "afternotok": "exit", "afterany": "ended", "after": "started"}
OPS: Final = ("==", "!=", ">=", "<=", ">", "<")
TRUE, WAIT, NEVER = "true", "wait", "never"


class DepError(ValueError):
    """A dependency expression is malformed; the message says where and why."""


class Ref(NamedTuple):
    """What a term names: a job id (with an array index), or a job name."""

    jobid: int | None = None
    element: int | None = None  # an array's index
    name: str | None = None

    def text(self) -> str:
        if self.name is not None:
            return f'"{self.name}"'
        return f"{self.jobid}" + (f"[{self.element}]" if self.element is not None else "")


class Term(NamedTuple):
    kind: str  # done, exit, ended, started
    ref: Ref
    op: str | None = None  # exit(ref, op code)
    code: int | None = None

    def text(self) -> str:
        extra = f", {self.op}{self.code}" if self.op is not None else ""
        return f"{self.kind}({self.ref.text()}{extra})"


class Not(NamedTuple):
    arg: Node


class All(NamedTuple):
    args: tuple[Node, ...]


class Any_(NamedTuple):
    args: tuple[Node, ...]


Node = Term | Not | All | Any_


class Facts(NamedTuple):
    """What a term needs of one job: its state and exit status."""

    state: str
    exit_status: int | None = None


_TOKEN: Final = re.compile(r"\s*(?:(&&|\|\||!=|==|>=|<=|[!()\[\],<>])|(\d+)|"
                           r'"([^"\\\x00-\x1f]{1,256})"|([A-Za-z_][A-Za-z0-9_.\-]{0,255}))')


def _tokens(text: str) -> Iterator[str]:
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            return
        m = _TOKEN.match(text, pos)
        if m is None:
            raise DepError(f"dependency {text!r:.80}: unexpected {text[pos:pos + 10].strip()!r} "
                           f"at character {pos + 1}")
        pos = m.end()
        punct, num, quoted, word = m.groups()
        yield punct or num or (f'"{quoted}' if quoted is not None else word)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = list(_tokens(text))
        self.i = 0
        self.terms = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            found = "the end" if tok is None else repr(tok)
            raise DepError(f"dependency {self.text!r:.80}: expected {want or 'more'}, found {found}")
        self.i += 1
        return tok

    def expr(self) -> Node:
        args = [self.conj()]
        while self.peek() == "||":
            self.take()
            args.append(self.conj())
        return args[0] if len(args) == 1 else Any_(tuple(args))

    def conj(self) -> Node:
        args = [self.unary()]
        while self.peek() == "&&":
            self.take()
            args.append(self.unary())
        return args[0] if len(args) == 1 else All(tuple(args))

    def unary(self) -> Node:
        if self.peek() == "!":
            self.take()
            return Not(self.unary())
        if self.peek() == "(":
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        return self.term()

    def term(self) -> Term:
        self.terms += 1
        if self.terms > TERMS_MAX:
            raise DepError(f"dependency: more than {TERMS_MAX} terms")
        tok = self.peek()
        if tok in KINDS and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == "(":
            kind = self.take()
            self.take("(")
            ref = self.ref()
            op = code = None
            if kind == "exit" and self.peek() == ",":
                self.take()
                op = self.take() if self.peek() in OPS else "=="
                code = self.number("an exit code")
            self.take(")")
            return Term(kind, ref, op, code)
        return Term("done", self.ref())  # a bare reference: done(REF), as LSF reads it

    def number(self, what: str) -> int:
        tok = self.take()
        if not tok.isdigit() or len(tok) > 18:
            raise DepError(f"dependency {self.text!r:.80}: expected {what}, found {tok!r}")
        return int(tok)

    def ref(self) -> Ref:
        tok = self.take()
        if tok.isdigit():
            jobid = self.number_of(tok)
            if self.peek() == "[":
                self.take()
                index = self.number("an array index")
                self.take("]")
                return Ref(jobid, index)
            return Ref(jobid)
        if tok.startswith('"'):
            return Ref(name=tok[1:])
        if tok[0].isalpha() or tok[0] == "_":
            return Ref(name=tok)
        raise DepError(f"dependency {self.text!r:.80}: expected a job id or name, found {tok!r}")

    def number_of(self, tok: str) -> int:
        if len(tok) > 18 or int(tok) < 1:
            raise DepError(f"dependency {self.text!r:.80}: {tok} is not a job id")
        return int(tok)


def parse(text: str) -> Node:
    """An expression's tree (LSF's form, or Slurm's when it starts with ``after``)."""
    if not isinstance(text, str) or not text.strip():
        raise DepError("dependency: empty expression (e.g. done(12) && ended(\"prep\"))")
    if len(text) > TEXT_MAX:
        raise DepError(f"dependency: longer than {TEXT_MAX} characters")
    if text.strip().startswith("after"):
        return _slurm(text.strip())
    p = _Parser(text)
    node = p.expr()
    if p.peek() is not None:
        raise DepError(f"dependency {text!r:.80}: unexpected {p.peek()!r} after a whole expression")
    return node


def _slurm(text: str) -> Node:
    if "," in text and "?" in text:
        raise DepError(f"--dependency {text!r:.80}: use ',' (all) or '?' (any), not both")
    sep = "?" if "?" in text else ","
    groups: list[Node] = []
    for item in text.split(sep):
        kind, _, ids = item.strip().partition(":")
        if kind not in SLURM:
            raise DepError(f"--dependency {text!r:.80}: {kind!r} is not one of "
                           f"{', '.join(SLURM)}")
        terms: list[Node] = []
        for part in ids.split(":"):
            jid, _, index = part.partition("_")  # Slurm's ARRAYID_INDEX
            if not jid.isdigit() or len(jid) > 18 or int(jid) < 1 or (index and not index.isdigit()):
                raise DepError(f"--dependency {text!r:.80}: {part!r} is not a job id")
            terms.append(Term(SLURM[kind], Ref(int(jid), int(index) if index else None)))
        if len(terms) > TERMS_MAX:
            raise DepError(f"--dependency: more than {TERMS_MAX} terms")
        groups.append(terms[0] if len(terms) == 1 else All(tuple(terms)))
    if len(groups) == 1:
        return groups[0]
    return All(tuple(groups)) if sep == "," else Any_(tuple(groups))


def terms(node: Node) -> Iterator[Term]:
    """Every term of an expression, left to right."""
    if isinstance(node, Term):
        yield node
    elif isinstance(node, Not):
        yield from terms(node.arg)
    else:
        for arg in node.args:
            yield from terms(arg)


def text(node: Node) -> str:
    """The canonical text of an expression (LSF's form)."""
    if isinstance(node, Term):
        return node.text()
    if isinstance(node, Not):
        inner = text(node.arg)
        return f"!{inner}" if isinstance(node.arg, Term | Not) else f"!({inner})"
    sep = " && " if isinstance(node, All) else " || "
    return sep.join(text(a) if isinstance(a, Term | Not) or type(a) is type(node) else f"({text(a)})"
                    for a in node.args)


_FINISHED: Final = frozenset({"DONE", "EXIT"})
_STARTED: Final = frozenset({"RUN", "USUSP", "SSUSP", "DONE", "EXIT"})


def _cmp(op: str, a: int, b: int) -> bool:
    return {"==": a == b, "!=": a != b, ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[op]


Value = tuple[bool, bool]
"""(holds now, can no longer change)."""


def term_value(term: Term, facts: Facts | None) -> Value:
    """One term against one job's facts (None: the job is unknown: false for good)."""
    if facts is None:
        return False, True
    st = facts.state
    finished = st in _FINISHED
    if term.kind == "started":
        now = st in _STARTED
        return now, now
    if term.kind == "ended":
        return finished, finished
    if term.kind == "done":
        return st == "DONE", finished
    if st != "EXIT":
        return False, finished
    if term.op is None or term.code is None:
        return True, True
    status = facts.exit_status if facts.exit_status is not None else -1
    return _cmp(term.op, status, term.code), True


Lookup = Callable[[Term], Facts | None]


def value(node: Node, lookup: Lookup) -> Value:
    """(holds now, final) of an expression."""
    if isinstance(node, Term):
        return term_value(node, lookup(node))
    if isinstance(node, Not):
        now, final = value(node.arg, lookup)
        return not now, final
    values = [value(a, lookup) for a in node.args]
    if isinstance(node, All):
        now = all(v[0] for v in values)
        return now, any(f and not n for n, f in values) or all(f for _, f in values)
    now = any(v[0] for v in values)
    return now, any(f and n for n, f in values) or all(f for _, f in values)


def evaluate(node: Node, lookup: Lookup) -> str:
    """TRUE (it holds), WAIT (not yet) or NEVER (it cannot come to hold any more)."""
    now, final = value(node, lookup)
    return TRUE if now else NEVER if final else WAIT


def blocking(node: Node, lookup: Lookup) -> Node | None:
    """The part of an expression that keeps it from holding (left to right; None if it
    holds): what a pending reason names."""
    now, _ = value(node, lookup)
    if now:
        return None
    if isinstance(node, Term | Not):
        return node
    if isinstance(node, All):
        for arg in node.args:
            if not value(arg, lookup)[0]:
                return blocking(arg, lookup)
    waiting = [a for a in node.args if not value(a, lookup)[1]]
    return blocking((waiting or list(node.args))[0], lookup)
