"""Job-array index expressions and the pending runs (xcecore.arrayspec): pure functions."""

from __future__ import annotations

import pytest

from xcecore.arrayspec import ELEMENTS_MAX, ArrayError, Ranges, parse_array, split_name


@pytest.mark.parametrize(("text", "runs", "size", "limit"), [
    ("1-10", [[1, 10, 1]], 10, None),
    ("1-1000:2%50", [[1, 999, 2]], 500, 50),
    ("7", [[7, 7, 1]], 1, None),
    ("20,1-3, 5-9:2", [[1, 3, 1], [5, 9, 2], [20, 20, 1]], 7, None),
    ("0-10:20", [[0, 0, 1]], 1, None),
    ("1-100000%1", [[1, 100000, 1]], 100000, 1),
])
def test_parse(text: str, runs: list[list[int]], size: int, limit: int | None) -> None:
    spec = parse_array(text)
    assert (spec.runs, spec.size, spec.limit) == (runs, size, limit)
    assert len(Ranges([list(r) for r in spec.runs])) == size


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty"), ("1-", "is not N"), ("5-3", "ends before"), ("1-10,5", "overlap"),
    ("x", "is not N"), ("1-10%0", "limit"), ("1-10%", "limit"), ("1-10:0", "step"),
    (f"1-{ELEMENTS_MAX + 1}", "more than"), ("1-99999999999", "is not N"),
    (",".join(str(i) for i in range(1002)), "more than 1000 items"),
])
def test_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(ArrayError, match=why):
        parse_array(text)


def test_lsf_name_form() -> None:
    name, spec = split_name("sim[1-1000:2]%50")
    assert name == "sim" and spec is not None and (spec.size, spec.limit) == (500, 50)
    assert split_name("plain") == ("plain", None)
    with pytest.raises(ArrayError, match="NAME"):
        split_name("bad[1-2")


def test_ranges_take_remove_contains() -> None:
    r = Ranges([[1, 9, 2], [20, 20, 1]])
    assert r.lowest() == 1 and 5 in r and 4 not in r and 20 in r and "5" not in r
    assert r.remove(5) and not r.remove(5)
    assert r.runs == [[1, 3, 2], [7, 9, 2], [20, 20, 1]]
    assert [r.take() for _ in range(5)] == [1, 3, 7, 9, 20]
    assert r.runs == [] and r.lowest() is None
    with pytest.raises(IndexError):
        r.take()
    r = Ranges([[1, 3, 1]])
    assert r.remove(1) and r.runs == [[2, 3, 1]] and r.remove(3) and r.runs == [[2, 2, 1]]
    assert r.clear() == 1 and len(r) == 0
