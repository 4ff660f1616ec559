"""The pure parts of the connection manager: back-off and connstate decisions (no sockets)."""

from __future__ import annotations

import pytest

from xcecore.candidates import Candidate
from xcecore.client.backoff import Backoff
from xcecore.client.dialer import candidate_order, classify_handshake, hello_hint, resolve_redirect
from xcecore.client.machine import StateQueue, liveness_expired, reply_error, seq_gap

A, B, C = Candidate("h1", 1), Candidate("h2", 2), Candidate("h3", 3)


def test_backoff_full_jitter_doubles_and_caps():
    draws: list[tuple[float, float]] = []
    b = Backoff(0.02, 0.1, uniform=lambda lo, hi: draws.append((lo, hi)) or hi)
    delays = [b.next_delay() for _ in range(5)]
    assert delays == pytest.approx([0.02, 0.04, 0.08, 0.1, 0.1])
    assert all(lo == 0.0 for lo, _ in draws)
    b.reset()
    assert b.next_delay() == pytest.approx(0.02)
    big = Backoff(1.0, 5.0)
    big.failures = 10_000
    assert 0 <= big.next_delay() <= 5.0
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_candidate_order_rotates_from_last_good():
    assert candidate_order((A, B, C), None) == [A, B, C]
    assert candidate_order((A, B, C), B) == [B, C, A]
    assert candidate_order((A, B), C) == [C, A, B]


def test_candidate_order_tries_the_lost_candidate_last():
    # The primary B died: start with the next one, try B again only at the end of the pass.
    assert candidate_order((A, B, C), B, lost=B) == [C, A, B]
    assert candidate_order((A, B, C), A, lost=B) == [A, C, B]
    assert candidate_order((A, B, C), None, lost=A) == [B, C, A]
    assert candidate_order((A,), A, lost=A) == [A]  # a single candidate is still tried
    assert candidate_order((A, B), C, lost=C) == [A, B, C]  # an unlisted one, too


def test_hello_hint_of_a_standby():
    assert hello_hint({"proto": 1, "challenge": "ab"}) is None  # a primary: authenticate
    hint = hello_hint({"proto": 1, "challenge": "ab", "server": "h2:2", "state": "standby",
                       "primary": "h1:1"})
    assert hint is not None and hint.kind == "redirect" and hint.primary == "h1:1"
    lone = hello_hint({"proto": 1, "challenge": "ab", "state": "standby", "primary": None})
    assert lone is not None and lone.kind == "no_primary"


def test_classify_handshake():
    assert classify_handshake({"ok": True, "state": "primary", "server": "h1:1"}).kind == \
        "primary"
    r = classify_handshake({"ok": True, "state": "standby", "primary": "h2:2"})
    assert (r.kind, r.primary) == ("redirect", "h2:2")
    assert classify_handshake({"ok": True, "state": "standby", "primary": None}).kind == \
        "no_primary"
    d = classify_handshake({"ok": False, "error": {"code": "DENIED", "message": "bad mac"}})
    assert (d.kind, d.message) == ("denied", "DENIED: bad mac")
    assert classify_handshake({"ok": True, "state": "weird"}).kind == "invalid"
    assert classify_handshake({}).kind == "denied"


def test_resolve_redirect():
    assert resolve_redirect("h2:2", (A, B), False) == (B, "")
    target, why = resolve_redirect("h9:9", (A, B), False)
    assert target is None and "allow_unlisted_redirect" in why
    assert resolve_redirect("h9:9", (A, B), True) == (Candidate("h9", 9), "")
    target, why = resolve_redirect("nonsense", (A,), True)
    assert target is None and "malformed" in why


def test_reply_error_tolerates_sloppy_peers():
    assert reply_error({"error": {"code": "REDIRECT", "message": "m", "primary": "h:1"}}) == (
        "REDIRECT", "m", {"primary": "h:1"})
    assert reply_error({"error": "x"})[0] == "INTERNAL"
    assert reply_error({"error": {"code": 5}}) == ("INTERNAL", "", {})


def test_seq_gap_and_liveness():
    assert seq_gap(3, 3) == 0 and seq_gap(3, 5) == 2 and seq_gap(3, 2) == -1
    assert not liveness_expired(10.0, 0.0, None, 2.0)  # nothing owed
    assert not liveness_expired(10.0, 0.0, 9.0, 2.0)  # owed only for 1 s
    assert liveness_expired(10.0, 7.0, 7.5, 2.0)
    assert not liveness_expired(10.0, 9.5, 5.0, 2.0)  # a frame arrived recently


def test_state_queue_coalesces_and_bounds():
    q = StateQueue(limit=3)
    q.put("reconnecting", A, "x")
    q.put("reconnecting", B, "y")
    assert q.take() == [("reconnecting", B, "y")]
    for i, s in enumerate(["a", "b", "c", "d", "e"]):
        q.put(s, None, str(i))
    assert len(q) == 3 and q.dropped == 2
    assert [s for s, _, _ in q.take()] == ["c", "d", "e"]
