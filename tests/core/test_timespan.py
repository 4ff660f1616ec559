"""The one reader of time spans (xcecore.timespan): what it takes and what it refuses."""

from __future__ import annotations

import pytest

from xcecore.timespan import span_seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("45s", 45.0), ("90m", 5400.0), ("12h", 43200.0), ("7d", 604800.0), ("2w", 1209600.0),
    ("1.5h", 5400.0), (" 30d ", 2592000.0), ("0s", 0.0), ("007m", 420.0),
])
def test_spans_people_write(text: str, seconds: float) -> None:
    assert span_seconds(text) == seconds


@pytest.mark.parametrize("text", [
    "", "s", "10", "10x", "1.h", ".5h", "1..5h", "1.5.2h", "-3d", "+3d", "3 d", "3D", "1e3s",
    "٣d", "²h", "3dd", "nan s", "infh",
])
def test_anything_else_is_not_a_span(text: str) -> None:
    assert span_seconds(text) is None
