"""Pend reasons are sent only when they change, and again after a full state."""

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


def test_finished_jobs_are_forgotten() -> None:
    r = PendReasons()
    r.changes({1: "a"}, {}, epoch=1, pending=[1])
    r.changes({}, {}, epoch=1, pending=[])
    assert r.changes({1: "a"}, {}, epoch=1, pending=[1]) == {"1": "a"}


def test_bad_requirement_text() -> None:
    assert bad_requirement("unknown resource 'gpus'\nselect[gpus]\n       ^^^^") == (
        "bad resource requirement: unknown resource 'gpus'")
