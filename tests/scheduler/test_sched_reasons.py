"""Pend reasons are sent only when they change, and again after every sync."""

from __future__ import annotations

import pytest
from xce_scheduler.reasons import PendReasons, bad_requirement

pytestmark = pytest.mark.timeout(30)


def test_change_only() -> None:
    r = PendReasons()
    assert r.changes({1: "a", 2: "b"}, {}, epoch=1) == {"1": "a", "2": "b"}
    assert r.changes({1: "a", 2: "b"}, {}, epoch=1) == {}, "requested, not yet pushed back"
    assert r.changes({1: "a", 2: "b"}, {1: "a", 2: "b"}, epoch=1) == {}
    assert r.changes({1: "c", 2: "b"}, {1: "a", 2: "b"}, epoch=1) == {"1": "c"}


def test_new_state_sends_again_and_lost_batches_are_resent() -> None:
    r = PendReasons()
    r.changes({1: "a"}, {}, epoch=1)
    assert r.changes({1: "a"}, {}, epoch=2) == {"1": "a"}, "a new primary has no reasons"
    r.forget(["1"])
    assert r.changes({1: "a"}, {}, epoch=2) == {"1": "a"}


def test_requests_are_forgotten_once_answered_or_when_the_job_leaves() -> None:
    r = PendReasons()
    assert r.changes({1: "a", 2: "b", 3: "c"}, {}, epoch=1) == {"1": "a", "2": "b", "3": "c"}
    assert len(r) == 3
    r.settle([(1, "a"), (2, "other")])  # 1's push came back; 2's says something else
    r.drop([3])  # 3 left PEND
    assert len(r) == 1
    assert r.changes({3: "c"}, {}, epoch=1) == {"3": "c"}  # dropped: asked again if wanted
    assert r.changes({2: "b"}, {2: "other"}, epoch=1) == {}  # still requested: not twice


def test_bad_requirement_text() -> None:
    assert bad_requirement("unknown resource 'gpus'\nselect[gpus]\n       ^^^^") == (
        "bad resource requirement: unknown resource 'gpus'")
