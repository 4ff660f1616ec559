"""Dependency expressions (xcecore.depspec): LSF -w and Slurm --dependency, parsed once and
evaluated three ways (holds, not yet, never)."""

from __future__ import annotations

import pytest

from xcecore.depspec import (
    NEVER,
    TRUE,
    WAIT,
    All,
    Any_,
    DepError,
    Facts,
    Not,
    Ref,
    Term,
    blocking,
    evaluate,
    parse,
    text,
)


@pytest.mark.parametrize(("src", "canonical"), [
    ("done(12)", "done(12)"),
    ("12", "done(12)"),
    ("exit(7, >2) || ended(\"prep job\")", 'exit(7, >2) || ended("prep job")'),
    ("exit(7,3)", "exit(7, ==3)"),
    ("started(5[3]) && !done(sim)", 'started(5[3]) && !done("sim")'),
    ("(done(1) || done(2)) && ended(3)", "(done(1) || done(2)) && ended(3)"),
    ("!(done(1) && done(2))", "!(done(1) && done(2))"),
    ("afterok:10:11,afterany:12", "done(10) && done(11) && ended(12)"),
    ("afternotok:10?after:12_4", "exit(10) || started(12[4])"),
])
def test_parse_and_canonical_text(src: str, canonical: str) -> None:
    assert text(parse(src)) == canonical
    assert text(parse(canonical)) == canonical  # the canonical text parses to itself


def test_precedence() -> None:
    node = parse("done(1) || done(2) && !done(3)")
    assert node == Any_((Term("done", Ref(1)), All((Term("done", Ref(2)), Not(Term("done", Ref(3)))))))


@pytest.mark.parametrize(("src", "why"), [
    ("", "empty"), ("done(", "expected"), ("done(1", r"expected \)"), ("done(1))", "after a whole"),
    ("done(0)", "not a job id"), ("exit(1, >x)", "an exit code"), ("done(1) & done(2)", "unexpected"),
    ("afterwards:1", "not one of"), ("afterok:x", "not a job id"), ("afterok:1,afterany:2?after:3", "not both"),
    ("done(1) && " * 300 + "done(1)", "more than 256 terms"), ("x" * 5000, "longer than"),
])
def test_refused_with_a_reason(src: str, why: str) -> None:
    with pytest.raises(DepError, match=why):
        parse(src)


def facts(**by_id: Facts) -> object:
    def lookup(term: Term) -> Facts | None:
        return by_id.get(f"j{term.ref.jobid}")
    return lookup


def test_three_values() -> None:
    run, done, failed = Facts("RUN"), Facts("DONE", 0), Facts("EXIT", 3)
    pend = Facts("PEND")
    cases = [
        ("done(1)", {"j1": pend}, WAIT), ("done(1)", {"j1": done}, TRUE), ("done(1)", {"j1": failed}, NEVER),
        ("done(1)", {}, NEVER),  # an unknown job
        ("exit(1)", {"j1": failed}, TRUE), ("exit(1)", {"j1": done}, NEVER), ("exit(1)", {"j1": run}, WAIT),
        ("exit(1, >2)", {"j1": failed}, TRUE), ("exit(1, <3)", {"j1": failed}, NEVER),
        ("ended(1)", {"j1": failed}, TRUE), ("ended(1)", {"j1": run}, WAIT),
        ("started(1)", {"j1": pend}, WAIT), ("started(1)", {"j1": run}, TRUE),
        ("!started(1)", {"j1": pend}, TRUE), ("!done(1)", {"j1": failed}, TRUE),
        ("!done(1)", {"j1": done}, NEVER),
        ("done(1) && done(2)", {"j1": done, "j2": run}, WAIT),
        ("done(1) && done(2)", {"j1": failed, "j2": run}, NEVER),
        ("done(1) || done(2)", {"j1": failed, "j2": run}, WAIT),
        ("done(1) || done(2)", {"j1": failed, "j2": failed}, NEVER),
        ("done(1) || done(2)", {"j1": failed, "j2": done}, TRUE),
        ("afterok:1:2", {"j1": done, "j2": done}, TRUE),
    ]
    for src, known, want in cases:
        assert evaluate(parse(src), facts(**known)) == want, (src, known)  # type: ignore[arg-type]


def test_blocking_names_the_part_that_holds_it_up() -> None:
    node = parse("done(1) && (ended(2) || exit(3)) && !started(4)")
    known = {"j1": Facts("DONE"), "j2": Facts("RUN"), "j3": Facts("DONE"), "j4": Facts("PEND")}
    lookup = facts(**known)
    assert text(blocking(node, lookup)) == "ended(2)"  # type: ignore[arg-type]
    known["j2"] = Facts("EXIT", 1)
    assert blocking(node, facts(**known)) is None  # type: ignore[arg-type]
    known["j4"] = Facts("RUN")
    assert text(blocking(node, facts(**known))) == "!started(4)"  # type: ignore[arg-type, arg-type]
