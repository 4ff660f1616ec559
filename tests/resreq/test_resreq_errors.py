"""Every error code, with its position, section and caret snippet."""

from __future__ import annotations

import json

import pytest

from xcecore.resreq import MAX_DEPTH, MAX_LENGTH, Evaluator, ResourceRegistry, ResreqError

pytestmark = pytest.mark.timeout(60)

EV = Evaluator(ResourceRegistry([{"name": "gpu", "type": "bool"},
                                 {"name": "rack", "type": "string"}]))


def error(text: str) -> ResreqError:
    with pytest.raises(ResreqError) as info:
        EV.compile(text)
    return info.value


# (text, code, section, marked substring or offset, length) -- the caret must sit exactly
# under the marked part of the original string.
CASES: list[tuple[str, str, str | None, str | int, int]] = [
    ("select[mem>4G && ncpus>8 && gpus]", "UNKNOWN_RESOURCE", "select", "gpus", 4),
    ("mem>1 && (ncpus>2", "UNBALANCED", None, "(", 1),
    ("select[mem>1 && (ncpus>2]", "UNBALANCED", None, "(", 1),
    ("select[mem>1", "UNBALANCED", None, "[", 1),
    ("mem>1)", "UNBALANCED", None, ")", 1),
    ("select[(mem>1]", "UNBALANCED", None, "(", 1),
    ("select[mem > 1 ==]", "SYNTAX", "select", "==", 2),
    ("mem > > 1", "SYNTAX", "select", 6, 1),
    ("mem 1", "SYNTAX", "select", "1", 1),
    ("mem = 1", "SYNTAX", "select", "=", 1),
    ("mem > 1 & gpu", "SYNTAX", None, "&", 1),
    ("type == 'abc", "SYNTAX", None, "'", 1),
    ("mem > 1 # x", "SYNTAX", None, "#", 1),
    ("select[]", "SYNTAX", "select", "select[]", 8),
    ("defined mem", "SYNTAX", "select", "defined", 7),
    ("mem>1 foo", "SYNTAX", "select", "foo", 3),
    ("order[mem] foo", "SYNTAX", None, "foo", 3),
    ("order[mem::r1m]", "SYNTAX", "order", 10, 1),
    ("rusage[mem]", "SYNTAX", "rusage", "]", 1),
    ("select[a<b<c]", "CHAINED_COMPARISON", "select", 10, 1),  # syntax is checked first
    ("mem<ncpus<swp", "CHAINED_COMPARISON", "select", 9, 1),
    ("mem==ncpus==swp", "CHAINED_COMPARISON", "select", 10, 2),
    ("mem == ncpus < swp", "CHAINED_COMPARISON", "select", "==", 2),
    ("select[mem>1] order[mem] select[ncpus>1]", "DUPLICATE_SECTION", "select", 25, 6),
    ("mem>1 select[ncpus>1]", "DUPLICATE_SECTION", "select", "select", 6),
    ("order[mem] order[r1m]", "DUPLICATE_SECTION", "order", 11, 5),
    ("mem>1 cu[type=enclosure]", "UNSUPPORTED_SECTION", "cu", "cu[type=enclosure]", 18),
    ("affinity[core(1)]", "UNSUPPORTED_SECTION", "affinity", "affinity[core(1)]", 17),
    ("2*{select[mem>1]} + 4*{select[gpu]}", "UNSUPPORTED_SECTION", "compound", 0, 17),
    ("{select[mem>1]} || {select[gpu]}", "UNSUPPORTED_SECTION", "compound", 0, 15),
    ("slect[mem>1]", "UNKNOWN_SECTION", None, "slect", 5),
    ("type == 1", "TYPE_MISMATCH", "select", "type == 1", 9),
    ("mem == 'x'", "TYPE_MISMATCH", "select", "mem == 'x'", 10),
    ("type == ncpus", "TYPE_MISMATCH", "select", "type == ncpus", 13),
    ("gpu == 1", "TYPE_MISMATCH", "select", "gpu", 3),
    ("(mem > 1) == (swp > 1)", "TYPE_MISMATCH", "select", "(mem > 1)", 9),
    ("mem && gpu", "TYPE_MISMATCH", "select", "mem", 3),
    ("!mem", "TYPE_MISMATCH", "select", "mem", 3),
    ("-gpu", "TYPE_MISMATCH", "select", "gpu", 3),
    ("gpu + 1 > 2", "TYPE_MISMATCH", "select", "gpu", 3),
    ("ncpus", "TYPE_MISMATCH", "select", "ncpus", 5),
    ("ncpus > 4G", "TYPE_MISMATCH", "select", "4G", 2),
    ("order[type]", "TYPE_MISMATCH", "order", "type", 4),
    ("order[gpu]", "TYPE_MISMATCH", "order", "gpu", 3),
    ("rusage[ncpus=1]", "TYPE_MISMATCH", "rusage", "ncpus=1", 7),
    ("rusage[slots=1G]", "TYPE_MISMATCH", "rusage", "slots=1G", 8),
    ("rusage[mem=1:decay=2]", "BAD_VALUE", "rusage", "2", 1),
    ("rusage[mem=1:duration=1G]", "BAD_VALUE", "rusage", "1G", 2),
    ("rusage[mem=-1]", "BAD_VALUE", "rusage", "-", 1),
    ("rusage[mem=1:swap=2:swp=3]", "BAD_VALUE", "rusage", "swp=3", 5),
    ("span[hosts=2]", "BAD_VALUE", "span", "2", 1),
    ("span[ptile=0]", "BAD_VALUE", "span", "0", 1),
    ("span[ptile=1.5]", "BAD_VALUE", "span", "1.5", 3),
    ("span[block=2]", "BAD_VALUE", "span", "block", 5),
    ("order[mem:mem]", "BAD_VALUE", "order", 10, 3),
    ("same[rack:rack]", "BAD_VALUE", "same", 10, 4),
    ("mem > 4X", "BAD_VALUE", None, "X", 1),
    ("order[memx]", "UNKNOWN_RESOURCE", "order", "memx", 4),
    ("rusage[ngpus=1]", "UNKNOWN_RESOURCE", "rusage", "ngpus", 5),
    ("same[rak]", "UNKNOWN_RESOURCE", "same", "rak", 3),
    ("defined(gpuz)", "UNKNOWN_RESOURCE", "select", "gpuz", 4),
]


@pytest.mark.parametrize(("text", "code", "section", "mark", "length"), CASES)
def test_error_position(text: str, code: str, section: str | None, mark: str | int,
                        length: int) -> None:
    err = error(text)
    offset = mark if isinstance(mark, int) else text.index(mark)
    assert (err.code, err.section, err.offset, err.length) == (code, section, offset, length), \
        str(err)
    assert err.column == offset + 1
    line, caret = err.snippet.split("\n")
    assert line == text
    assert caret == " " * offset + "^" * length
    assert str(err) == f"{err.message}\n{err.snippet}"
    d = err.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert {"code", "message", "section", "offset", "column", "length", "text",
            "snippet"} <= d.keys()
    assert isinstance(err, ValueError)


def test_spec_example_message() -> None:
    err = error("select[mem>4G && ncpus>8 && gpus]")
    assert str(err) == ("unknown resource 'gpus'; did you mean 'gpu'?\n"
                        "select[mem>4G && ncpus>8 && gpus]\n"
                        "                            ^^^^")
    assert err.suggestion == "gpu"


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [("memm > 1", "mem"), ("ncpu > 1", "ncpus"), ("MEM > 1", "mem"), ("swapp > 1", "swap"),
     ("r1 < 1", "r1m"), ("rak == a", "rack"), ("zzzzzzz > 1", None)],
)
def test_suggestions(text: str, suggestion: str | None) -> None:
    err = error(text)
    assert err.code == "UNKNOWN_RESOURCE"
    assert err.suggestion == suggestion
    assert ("did you mean" in err.message) is (suggestion is not None)


def test_unknown_section_suggests() -> None:
    assert "did you mean 'rusage'" in error("rusge[mem=1]").message


def test_limits() -> None:
    long = "mem>1 && " * 1000 + "gpu"
    err = error(long)
    assert err.code == "TOO_LONG" and err.offset == MAX_LENGTH
    assert len(err.snippet) < 300  # long lines are windowed
    assert error("(" * (MAX_DEPTH + 1) + "gpu" + ")" * (MAX_DEPTH + 1)).code == "TOO_DEEP"
    assert error("!" * (MAX_DEPTH + 1) + "gpu").code == "TOO_DEEP"
    assert error("not " * (MAX_DEPTH + 1) + "gpu").code == "TOO_DEEP"
    assert error("-" * (MAX_DEPTH + 1) + "mem > 1").code == "TOO_DEEP"
    # deep trees built without brackets: alternating precedence levels inside parentheses
    nested = "mem > 1"
    for _ in range(40):
        nested = f"gpu || (gpu && ({nested}))"
    assert error(nested).code == "TOO_DEEP"
    assert error("mem" + "+mem" * 1200 + " > 1").code == "TOO_MANY_NODES"
    assert error("order[" + ":".join(["mem"] * 1500) + "]").code == "TOO_MANY_NODES"
    # just inside the limits is fine
    EV.compile("(" * 30 + "gpu" + ")" * 30)
    EV.compile("!" * 60 + "gpu")
    EV.compile(" && ".join(["mem > 1"] * 200))


def test_multiline_column_is_per_line() -> None:
    err = error("mem > 1 &&\n  gpus")
    assert err.offset == 13 and err.column == 3
    assert err.snippet == "  gpus\n  ^^^^"


def test_non_string_input() -> None:
    with pytest.raises(TypeError):
        EV.compile(42)  # type: ignore[arg-type]
