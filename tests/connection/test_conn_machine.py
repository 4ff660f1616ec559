"""The client's pure state machine and dialer, in memory: events in, effects out."""

from __future__ import annotations

from typing import Any

import pytest

from xcecore.auth.key import KeyAuth
from xcecore.candidates import Candidate
from xcecore.client.backoff import Backoff
from xcecore.client.dialer import (
    Dialed,
    Walk,
    candidate_order,
    classify_handshake,
    describe_os_error,
    failure_of,
    first_answer,
    hello_hint,
    walk,
)
from xcecore.client.errors import AuthenticationFailed, BackendUnavailable, OutcomeUnknown
from xcecore.client.machine import (
    CLOSED,
    CONNECTED,
    DEGRADED,
    NOTIFY,
    RECONNECTING,
    REJOINED,
    WAKE_BEAT,
    Budget,
    Call,
    Log,
    Machine,
    Rejoin,
    WakeRejoin,
    judge_reply,
)

A, B, C = Candidate("h1", 1), Candidate("h2", 2), Candidate("h3", 3)
NAME = "xce client w@x"


def machine(*cands: Candidate, allow_unlisted: bool = False) -> Machine:
    return Machine(cands or (A, B, C), name=NAME, allow_unlisted=allow_unlisted, connect_timeout=0.5)


def logs(effects: list[Any], level: str | None = None) -> list[str]:
    return [e.text for e in effects if type(e) is Log and (level is None or e.level == level)]


# ------------------------------------------------------------------------- states


def test_state_changes_notify_once_but_every_rejoin():
    m = machine()
    assert m.set_state(CONNECTED, A, "x") == [NOTIFY]
    assert m.set_state(CONNECTED, A, "again") == []
    assert m.set_state(REJOINED, A, "1") == [NOTIFY]
    assert m.set_state(REJOINED, A, "2") == [NOTIFY]  # each re-join is news
    assert [s for s, _, _ in m.states.take()] == [CONNECTED, REJOINED]  # coalesced
    assert m.state == REJOINED


# --------------------------------------------------------------------- the walk


def test_pass_starts_after_the_lost_candidate_and_tries_it_last():
    m = machine()
    m.reached(B)
    m.link_lost(B, "closed", current=True, closing=False, in_flight=1, now=1.0)
    assert m.lost == B and list(m.start_pass()) == [C, A, B]
    m.reached(C)
    assert m.lost is None and list(m.start_pass()) == [C, A, B]


def test_a_redirect_names_the_next_pass_start_and_forgets_the_lost():
    m = machine()
    m.reached(A)
    m.link_lost(A, "REDIRECT", current=True, closing=False, in_flight=0, redirect="h3:3",
                retrying=True, now=1.0)
    assert m.preferred == C and m.lost is None
    assert list(m.start_pass()) == [C, A, B]
    assert m.preferred is None  # used once


def test_lost_link_effects():
    m = machine()
    eff = m.link_lost(A, "closed", current=True, closing=False, in_flight=2, now=5.0)
    assert logs(eff, "WARNING") == [f"{NAME}: lost connection to h1:1 (closed); reconnecting "
                                    "(2 request(s) in flight)"]
    assert NOTIFY in eff and WAKE_BEAT in eff and m.state == RECONNECTING and m.lost_at == 5.0
    idle = machine().link_lost(A, "x", current=True, closing=False, in_flight=0, now=1.0)
    assert "will reconnect on the next call or heartbeat" in logs(idle)[0]
    retry = machine().link_lost(A, "x", current=True, closing=False, in_flight=0, retrying=True)
    assert logs(retry)[0].endswith("; reconnecting")
    assert machine().link_lost(A, "x", current=False, closing=False, in_flight=3) == []
    m = machine()
    assert m.link_lost(A, "x", current=True, closing=True, in_flight=3) == []
    assert m.lost == A  # a closing client still remembers, but tells nobody


def test_walk_follows_a_listed_redirect_once_and_logs_every_failure():
    w = Walk([A, B, C], (A, B, C), allow_unlisted=False, name=NAME)
    assert next(w) == A
    level, line = w.failed(A, Dialed("h3:3", "is a standby; primary is h3:3"))
    assert (level, line) == ("WARNING", f"{NAME}: candidate h1:1 is a standby, following redirect to h3:3")
    assert next(w) == C  # the redirect first
    level, line = w.failed(C, Dialed("h1:1", "is a standby; primary is h1:1"))
    assert "already tried in this pass; going on" in line
    assert next(w) == B and list(w) == []  # C is not tried twice
    assert str(w.last_error) == "h3:3 is a standby; primary is h1:1"


def test_walk_refuses_unlisted_and_malformed_redirects_unless_allowed():
    w = Walk([A], (A,), allow_unlisted=False, name=NAME)
    next(w)
    _, line = w.failed(A, Dialed("h9:9", "is a standby; primary is h9:9"))
    assert "not a listed candidate" in line and "allow_unlisted_redirect" in line
    assert str(w.last_error) == "h1:1 redirected to unlisted h9:9" and list(w) == []
    w = Walk([A], (A,), allow_unlisted=True, name=NAME)
    next(w)
    w.failed(A, Dialed("h9:9", "x"))
    assert list(w) == [Candidate("h9", 9)]
    w = Walk([A], (A,), allow_unlisted=True, name=NAME)
    next(w)
    _, line = w.failed(A, Dialed("nonsense", "x"))
    assert "malformed address" in line and list(w) == []


def test_walk_keeps_refusals_for_the_machine_and_reports_busy_candidates():
    w = Walk([A, B], (A, B), allow_unlisted=False, name=NAME)
    next(w)
    words = "authentication failed: credential expired"
    level, _ = w.failed(A, Dialed(None, f"refused the handshake: {words}", refused=words))
    assert level == "DEBUG" and w.refused == (A, words)  # the machine logs it, once
    next(w)
    level, line = w.failed(B, Dialed(None, "did not answer within 0.5 s", timed_out=True))
    assert level == "WARNING" and line.endswith("did not answer within 0.5 s; trying the next candidate")
    assert w.timed_out
    m = machine(A, B)
    m.pass_over(w)
    assert m.pass_timed_out and str(m.last_error) == "h2:2 did not answer within 0.5 s"
    err, effects = m.auth_refused() or (None, [])
    assert isinstance(err, AuthenticationFailed) and str(err) == f"{words} (controller {A})"
    assert [e.level for e in effects if isinstance(e, Log)] == ["ERROR"]
    assert m.state == "degraded"
    m.pass_over(w)
    _, again = m.auth_refused() or (None, [])
    assert not [e for e in again if isinstance(e, Log)]  # the same refusal is logged once
    _, _, effects = m.connected(A, 0.0)
    assert any(isinstance(e, Log) and "accepts this client's credential again" in e.text
               for e in effects)
    empty = Walk([A], (A,), allow_unlisted=False, name=NAME)
    m.pass_over(empty)
    assert m.auth_refused() is None


def test_blocking_driver_returns_the_first_link():
    lines: list[tuple[str, str]] = []
    dials: list[Candidate] = []

    def dial(c: Candidate) -> str | Dialed:
        dials.append(c)
        return "link-b" if c == B else Dialed(None, "refused")

    pass_ = Walk([A, B, C], (A, B, C), allow_unlisted=False, name=NAME)
    assert walk(pass_, dial, lambda *x: lines.append(x)) == "link-b"
    assert dials == [A, B] and len(lines) == 1
    assert walk(Walk([A], (A,), allow_unlisted=False, name=NAME), lambda c: Dialed(None, "x"),
                lambda *x: None) is None


def test_failed_pass_backs_off_degrades_once_and_spreads_when_busy():
    m = machine(A, B)
    draws: list[float] = []
    b = Backoff(0.1, 10.0, uniform=lambda lo, hi: draws.append(hi) or hi)
    delay, eff = m.pass_failed(b)
    assert delay == pytest.approx(0.1) and m.state == DEGRADED and NOTIFY in eff
    assert logs(eff, "WARNING") == [f"{NAME}: no primary among h1:1, h2:2 (None); next pass in 100 ms"]
    m.pass_timed_out = True
    delay, eff = m.pass_failed(b)
    assert delay == pytest.approx(0.5) and NOTIFY not in eff  # the connect timeout; degraded once


def test_connected_first_then_again():
    m = machine()
    first, took, eff = m.connected(A, 1.0)
    assert first and took == "" and logs(eff) == [f"{NAME}: connected to h1:1 (primary)"]
    m.lost_at = 1.0
    first, took, eff = m.connected(B, 1.25)
    assert not first and took == "250 ms" and eff == [] and m.last_good == B
    assert m.reconnected_line(B, took).text == f"{NAME}: reconnected to h2:2 after 250 ms"
    m.rejoin.ask()
    assert m.reconnected_line(B, took).text.endswith("; rejoin pending")
    assert machine().since_lost(3.0) == "an unknown time"
    detail, eff = m.heartbeat_reconnected(C, 1.5)
    assert detail == "reconnected by heartbeat after 500 ms" and m.last_good == C
    assert logs(eff) == [f"{NAME}: heartbeat reconnected to h3:3 after 500 ms"]


# ------------------------------------------------------------------------ rejoin


def test_rejoin_record():
    rj = Rejoin()
    assert not rj.pending and not rj.joined_once
    rj.ask()
    rj.ask()
    assert rj.pending and rj.asks == 2
    asked = rj.sending()
    assert asked == 2 and not rj.pending
    assert rj.done(asked) is False and rj.joined_once and rj.answered == 2
    assert rj.covered(True, 2) and not rj.covered(False, 2) and not rj.covered(True, 3)
    assert rj.covered(True, None)
    rj.ask()
    assert rj.done(rj.sending()) is True and rj.answered == 3
    assert rj.done(1) is True and rj.answered == 3  # an older join never lowers it


def test_joined_effects():
    m = machine()
    assert logs(m.joined(False, "worker", A)) == [f"{NAME}: joined as worker on h1:1"]
    eff = m.joined(True, "worker", B)
    assert logs(eff) == [f"{NAME}: re-joined as worker on h2:2"] and m.state == REJOINED


def test_heartbeat_verdicts():
    m = machine()
    assert m.beat_reconnected(False) == []  # never joined: nothing to recover
    m.rejoin.joined_once = True
    m.rejoin.beats_failing = True
    assert m.beat_reconnected(False) == [WakeRejoin("heartbeats recovered")]
    assert not m.rejoin.beats_failing
    assert m.beat_reconnected(True) == []
    assert m.beat_answered("", False, recovered=False) == []
    assert m.beat_answered("NOT_JOINED", False, recovered=False) == [WakeRejoin("heartbeats recovered")]
    assert m.beat_answered("", False, recovered=True) == [WakeRejoin("heartbeats recovered")]
    m.rejoin.beats_failing = True
    assert m.beat_answered("", False, recovered=False) == [WakeRejoin("heartbeats recovered")]
    assert m.beat_answered("", True, recovered=True) == []  # joined on this link already
    assert not m.rejoin.beats_failing


def test_push_gap_asks_for_a_rejoin():
    m = machine()
    assert m.push_arrived(A, 3, 3) == [] and not m.rejoin.pending
    eff = m.push_arrived(A, 7, 9)
    assert m.rejoin.pending and WakeRejoin("push seq gap (7 -> 9)") in eff
    assert "expected seq 7, got 9" in logs(eff, "WARNING")[0]


# ------------------------------------------------------------------ calls, verdicts


def test_budget():
    b = Budget(1)
    assert b.take(ValueError("a")) and not b.take(ValueError("b"))
    assert str(b.last_error) == "b" and b.exhausted() == "retry budget of 1 exhausted (last error: b)"
    free = Budget(None)
    assert all(free.take(None) for _ in range(100)) and free.last_error is None
    assert Budget(0).take(None) is False
    with pytest.raises(ValueError, match="retry_budget must be >= 0"):
        Budget(-1)


def test_call_gives_up_with_the_truth():
    read = Call("jobinfo", "r1", Budget(0))
    read.sent = True
    assert not read.keyed and isinstance(read.give_up("x"), BackendUnavailable)
    write = Call("jobsubmit", "r2", Budget(0))
    assert write.keyed and not write.outcome_unknown
    exc = write.give_up("never sent")
    assert type(exc) is BackendUnavailable and str(exc) == "never sent"
    write.sent = True
    write.answered()
    assert not write.outcome_unknown  # answered (a REDIRECT, say): definitely not applied
    write.sent = True
    write.link_lost()
    assert write.unanswered and not write.sent and write.outcome_unknown
    write.answered()
    assert write.outcome_unknown  # a later answer does not undo an earlier lost send
    unknown = write.give_up("deadline")
    assert isinstance(unknown, OutcomeUnknown) and (unknown.rid, unknown.op) == ("r2", "jobsubmit")
    with pytest.raises(OutcomeUnknown):
        write.spend(ConnectionError("x"))
    lost = Call("jobctrl", "r3", Budget(0))
    lost.link_lost()
    assert not lost.outcome_unknown  # lost before it was sent
    in_flight = Call("jobctrl", "r4", Budget(None))
    in_flight.sent = True
    assert in_flight.outcome_unknown  # the deadline passed while its reply was owed
    in_flight.spend(None)  # unbounded: never raises


def test_no_primary_tells_the_last_pass_that_dialed() -> None:
    """The give-up reason: what each candidate of the last pass met; a pass cut short before
    any dial failed keeps the previous pass's; reaching a primary forgets them."""
    m = machine()
    b = Budget(None)
    assert m.no_primary(b) == "no candidate answered before the deadline"
    walk = m.start_pass()
    for cand in walk:
        walk.failed(cand, Dialed(None, "refused or closed the connection (connection refused)"))
    m.pass_over(walk)
    told = m.no_primary(b)
    assert told.startswith("last pass: ") and told.count("connection refused") == len(m.candidates)
    walk = m.start_pass()  # cut short by the deadline: nothing dialed yet
    assert m.no_primary(b) == told
    first = next(walk)  # ... or after one dial: its news, the others' from the last pass
    walk.failed(first, Dialed(None, "timed out"))
    assert m.no_primary(b) == told.replace(
        f"{first} refused or closed the connection (connection refused)", f"{first} timed out")
    assert m.no_primary(b).count("connection refused") == len(m.candidates) - 1
    m.reached(m.candidates[0])
    b.take(ConnectionError("gone"))
    assert m.no_primary(b) == "last error: gone"


def test_deadline_error():
    m = machine()
    b = Budget(None)
    b.take(ConnectionError("down"))
    exc = m.deadline_error("connect", 0.3, None, b)
    assert type(exc) is BackendUnavailable and "deadline of 0.3 s (last error: down)" in str(exc)
    call = Call("jobsubmit", "k", b)
    call.sent = True
    assert isinstance(m.deadline_error("jobsubmit", 0.3, call, b), OutcomeUnknown)
    eff = m.gave_up("jobsubmit", exc)
    assert logs(eff, "WARNING")[0].startswith(f"{NAME}: giving up on jobsubmit: ") and m.state == DEGRADED


def test_judge_reply():
    assert judge_reply("x", {"ok": True, "result": 5}, False) == ("ok", 5, "", "", {})
    v = judge_reply("x", {"ok": False, "error": {"code": "REDIRECT", "message": "m", "primary": "h:1"}}, False)
    assert (v.kind, v.code, v.extra) == ("wrong_server", "REDIRECT", {"primary": "h:1"})
    assert judge_reply("x", {"ok": False, "error": {"code": "NO_PRIMARY"}}, True).kind == "wrong_server"
    nj = {"ok": False, "error": {"code": "NOT_JOINED", "message": "join"}}
    assert judge_reply("x", nj, False).kind == "not_joined"
    assert judge_reply("x", nj, True).kind == "error"  # only once
    assert judge_reply("join", nj, False).kind == "error"  # a join is never retried by joining
    err = judge_reply("x", {"ok": False, "error": {"code": "INVALID", "message": "bad"}}, False)
    assert (err.kind, err.code, err.message) == ("error", "INVALID", "bad")
    assert judge_reply("x", {"ok": 1, "result": 5}, False).kind == "error"  # ok must be true


# --------------------------------------------------------------------- handshake


def test_hello_hint_names_only_a_standby_with_a_primary():
    assert hello_hint({"proto": 1, "challenge": "c"}) is None
    assert hello_hint({"state": "primary"}) is None
    hint = hello_hint({"state": "standby", "primary": "h1:1", "server": "h2:2"})
    assert hint is not None and (hint.kind, hint.primary, hint.server) == ("redirect", "h1:1", "h2:2")


@pytest.mark.parametrize("primary", [None, "", 7, ["h1:1"]])
def test_a_standby_naming_an_empty_or_non_string_primary_knows_none(primary: Any):
    shake = classify_handshake({"ok": True, "state": "standby", "primary": primary})
    assert shake.kind == "no_primary" and shake.primary is None
    assert failure_of(shake) == "is a standby that knows no primary"


def test_classify_and_failures():
    assert classify_handshake({"ok": True, "state": "primary", "server": "h1:1"}) == ("primary", "h1:1", None, "", None)
    assert classify_handshake({"ok": True, "state": "primary", "server": 5}).server is None
    denied = classify_handshake({"ok": False, "error": {"code": "DENIED", "message": "bad mac"}})
    assert denied == ("denied", None, None, "DENIED: bad mac", None)
    assert classify_handshake({"ok": False, "error": {"code": "DENIED"}}).message == "DENIED"
    assert classify_handshake({"ok": False, "error": "x"}).message == "?"
    assert classify_handshake({"ok": "yes"}).kind == "denied"
    odd = classify_handshake({"ok": True, "state": "weird"})
    assert odd.kind == "invalid" and failure_of(odd) == "broke the handshake (unknown server state 'weird')"
    assert failure_of(denied) == "refused the handshake: DENIED: bad mac"
    assert failure_of(classify_handshake({"ok": True, "state": "standby", "primary": "h:1"})) == \
        "is a standby; primary is h:1"


def test_first_answer_skips_authentication_for_a_standby():
    shake, answer = first_answer({"state": "standby", "primary": "h1:1"}, auth=KeyAuth(b"k"), sender="w@x")
    assert shake is not None and shake.kind == "redirect" and answer is None
    shake, answer = first_answer({"proto": 1, "challenge": "c0ffee"}, auth=KeyAuth(b"k"), sender="w@x")
    assert shake is None and answer is not None and answer["from"] == "w@x" and len(answer["mac"]) == 64


def test_describe_os_error():
    assert describe_os_error(ConnectionRefusedError(111, "x")) == "connection refused"
    wrapped = OSError("all attempts failed")
    wrapped.__cause__ = ConnectionResetError(104, "reset")
    assert describe_os_error(wrapped) == "connection reset by peer"
    import socket

    assert describe_os_error(socket.gaierror(-2, "Name or service not known")) == "name or service not known"
    assert describe_os_error(ValueError("x")) is None


def test_candidate_order_edges():
    assert candidate_order((A, B, C), C, lost=A) == [C, B, A]
    assert candidate_order((A, B, C), B, lost=Candidate("gone", 9)) == [B, C, A]  # lost not listed
    assert candidate_order((A, B, C), Candidate("new", 1), lost=None) == [Candidate("new", 1), A, B, C]


# ------------------------------------------------------------ exact records and effects


def test_fresh_records_start_empty():
    rj = Rejoin()
    assert [rj.pending, rj.asks, rj.answered, rj.joins, rj.joined_once, rj.beats_failing] == [
        False, 0, 0, 0, False, False]
    assert rj.pending is False and rj.joined_once is False and rj.beats_failing is False
    rj.ask()
    assert rj.sending() == 1 and rj.pending is False
    call = Call("jobsubmit", "k", Budget(None))
    assert call.sent is False and call.unanswered is False
    call.sent = True
    call.link_lost()
    assert call.sent is False
    call.sent = True
    call.answered()
    assert call.sent is False
    m = machine()
    assert (m.state, m.candidate, m.last_good, m.preferred, m.lost, m.lost_at, m.last_error) == (
        CLOSED, None, None, None, None, None, None)
    assert m.ever_connected is False and m.pass_timed_out is False and m.allow_unlisted is False
    assert machine(allow_unlisted=True).allow_unlisted is True
    assert len(m.states) == 0 and m.states.limit == 64


def test_budget_counts_one_retry_at_a_time():
    b = Budget(2)
    assert [b.take(None), b.take(None), b.take(None)] == [True, True, False] and b.left == 0


def test_spending_and_giving_up_carry_the_last_error():
    err = ConnectionError("gone")
    call = Call("jobsubmit", "k9", Budget(0))
    with pytest.raises(BackendUnavailable) as info:
        call.spend(err)
    assert info.value.last_error is err and str(info.value) == "retry budget of 0 exhausted (last error: gone)"
    call = Call("jobsubmit", "k9", Budget(0))
    call.sent = True
    with pytest.raises(OutcomeUnknown) as unknown:
        call.spend(err)
    assert unknown.value.last_error is err
    assert str(unknown.value) == (
        "jobsubmit: outcome unknown, the reply was lost (retry budget of 0 exhausted (last error: "
        "gone)); its idempotency key k9 tells whether it was applied (outcome), and a retry with "
        "that key is applied at most once")
    m = machine()
    b = Budget(None)
    b.take(err)
    assert m.deadline_error("x", 1.0, None, b).last_error is err
    late = Call("jobsubmit", "k", b)
    late.sent = True
    exc = m.deadline_error("jobsubmit", 1.0, late, b)
    assert "no primary within the deadline of 1 s (last error: gone)" in str(exc)


def test_verdicts_carry_code_message_and_extra():
    nj = judge_reply("x", {"ok": False, "error": {"code": "NOT_JOINED", "message": "join", "z": 1}}, False)
    assert tuple(nj) == ("not_joined", None, "NOT_JOINED", "join", {"z": 1})
    ws = judge_reply("x", {"ok": False, "error": {"code": "REDIRECT", "message": "go"}}, False)
    assert tuple(ws) == ("wrong_server", None, "REDIRECT", "go", {})
    err = judge_reply("x", {"ok": False, "error": {"code": "DENIED", "message": "no", "arg": "a"}}, False)
    assert tuple(err) == ("error", None, "DENIED", "no", {"arg": "a"})


def test_liveness_boundary():
    from xcecore.client.machine import liveness_expired

    assert liveness_expired(3.0, 1.0, 0.5, 2.0)  # exactly the timeout: dead
    assert not liveness_expired(2.9, 1.0, 0.5, 2.0)


def test_state_queue_entries_carry_candidate_and_detail():
    m = machine(A, B)
    m.set_state(CONNECTED, A, "connected")
    m.pass_failed(Backoff(0.1, 1.0, uniform=lambda lo, hi: hi))
    m.link_lost(B, "reset", current=True, closing=False, in_flight=0)
    m.candidate = A
    m.gave_up("jobsubmit", ValueError("late"))
    m.joined(True, "w", B)
    assert m.states.take() == [(CONNECTED, A, "connected"), (DEGRADED, None, "no controller candidate is primary"),
                               (RECONNECTING, B, "reset"), (DEGRADED, A, "jobsubmit: late"),
                               (REJOINED, B, "re-joined as w")]
    assert m.lost_at == 0.0


def test_effects_exactly():
    m = machine(A, B)
    assert m.pass_failed(Backoff(2.0, 10.0, uniform=lambda lo, hi: hi))[0] == 2.0
    m.state = CLOSED
    eff = m.pass_failed(Backoff(2.0, 10.0, uniform=lambda lo, hi: hi))[1]
    assert eff == [NOTIFY, Log("WARNING", f"{NAME}: no primary among h1:1, h2:2 (None); next pass in 2000 ms")]
    assert m.connected(A, 0.0)[2] == [Log("INFO", f"{NAME}: connected to h1:1 (primary)")]
    m.lost_at = 0.0
    assert m.since_lost(2.0) == "2000 ms"
    assert m.reconnected_line(A, "5 ms") == Log("INFO", f"{NAME}: reconnected to h1:1 after 5 ms")
    assert m.heartbeat_reconnected(B, 2.0) == ("reconnected by heartbeat after 2000 ms",
                                               [Log("INFO", f"{NAME}: heartbeat reconnected to h2:2 after 2000 ms")])
    assert m.joined(False, "w", A) == [Log("INFO", f"{NAME}: joined as w on h1:1")]
    assert m.joined(True, "w", A)[0] == Log("INFO", f"{NAME}: re-joined as w on h1:1")
    eff = m.link_lost(A, "closed", current=True, closing=False, in_flight=0, now=1.0)
    assert eff == [Log("WARNING", f"{NAME}: lost connection to h1:1 (closed); will reconnect on the next "
                                  "call or heartbeat"), NOTIFY, WAKE_BEAT]
    assert m.gave_up("op", ValueError("v"))[0] == Log("WARNING", f"{NAME}: giving up on op: v")
    assert NOTIFY != WAKE_BEAT and repr(NOTIFY) == "NOTIFY" and repr(WAKE_BEAT) == "WAKE_BEAT"


def test_redirects_follow_the_unlisted_setting():
    m = machine(A, B, allow_unlisted=True)
    m.link_lost(A, "x", current=True, closing=False, in_flight=0, redirect="h9:9")
    assert m.preferred == Candidate("h9", 9)
    assert machine(A, B).link_lost(A, "x", current=True, closing=False, in_flight=0, redirect="h9:9") is not None
    strict = machine(A, B)
    strict.link_lost(A, "x", current=True, closing=False, in_flight=0, redirect="h9:9")
    assert strict.preferred is None


def test_a_redirected_pass_keeps_the_lost_candidate_in_its_place():
    m = machine()
    m.lost, m.preferred, m.pass_timed_out = A, C, True
    w = m.start_pass()
    assert list(w) == [C, A, B] and m.pass_timed_out is False
    assert w.allow_unlisted is False and w.name == NAME
    assert machine(allow_unlisted=True).start_pass().allow_unlisted is True


def test_walk_records_and_levels():
    w = Walk([A, B], (A, B), allow_unlisted=False, name=NAME)
    assert w.last_error is None and w.timed_out is False
    assert next(w) == A
    level, line = w.failed(A, Dialed("h9:9", "x"))
    assert level == "WARNING" and line.endswith(
        "(set cluster.allow_unlisted_redirect = true to follow such redirects)")
    w2 = Walk([A, B], (A, B), allow_unlisted=False, name=NAME)
    next(w2)
    w2.failed(A, Dialed("h2:2", "x"))
    next(w2)
    assert w2.failed(B, Dialed("h2:2", "x"))[0] == "WARNING"  # already tried


def test_async_driver_dials_in_order_and_logs_failures():
    import anyio

    lines: list[tuple[str, str]] = []
    dials: list[Candidate] = []

    async def dial(c: Candidate) -> str | Dialed:
        dials.append(c)
        return "link" if c == C else Dialed(None, f"refused {c.port}")

    from xcecore.client.dialer import walk_async

    got = anyio.run(walk_async, Walk([A, B, C], (A, B, C), allow_unlisted=False, name=NAME), dial,
                    lambda *x: lines.append(x))
    assert got == "link" and dials == [A, B, C]
    assert lines == [("WARNING", f"{NAME}: candidate h1:1 refused 1; trying the next candidate"),
                     ("WARNING", f"{NAME}: candidate h2:2 refused 2; trying the next candidate")]
    blocking: list[tuple[str, str]] = []
    walk(Walk([A], (A,), allow_unlisted=False, name=NAME), lambda c: Dialed(None, "nope"),
         lambda *x: blocking.append(x))
    assert blocking == [("WARNING", f"{NAME}: candidate h1:1 nope; trying the next candidate")]


def test_handshake_details():
    d = classify_handshake({"ok": False, "error": {"message": "m"}})
    assert d.message == "?: m"
    assert classify_handshake({"ok": False, "error": {"code": "DENIED", "message": ""}}).message == "DENIED"
    assert classify_handshake({"ok": False, "error": {}}).message == "?"
    assert classify_handshake({"ok": True, "state": "standby", "server": "s:1"}).server == "s:1"
    assert classify_handshake({"ok": True, "state": "odd", "server": "s:1"}).server == "s:1"
    from xcecore import auth
    from xcecore.auth.key import KeyAuth

    _, answer = first_answer({"proto": 1, "challenge": "c"}, auth=KeyAuth(b"k"), sender="w@x")
    assert answer == auth.client_answer(KeyAuth(b"k"), "w@x", {"proto": 1, "challenge": "c"})
    assert answer != auth.client_answer(KeyAuth(None), "w@x", {"proto": 1, "challenge": "c"})
    assert classify_handshake({"ok": False, "error": {
        "code": "AUTH", "message": "authentication failed: credential expired"}}).message == \
        "authentication failed: credential expired"


def test_describe_os_error_depth_and_gai():
    import socket

    chain = ValueError("top")
    cur: BaseException = chain
    for _ in range(2):
        nxt = ValueError("mid")
        cur.__cause__ = nxt
        cur = nxt
    cur.__cause__ = ConnectionRefusedError(111, "x")
    assert describe_os_error(chain) == "connection refused"  # the fourth error of the chain
    deeper = ValueError("top")
    deeper.__cause__ = chain
    assert describe_os_error(deeper) is None  # five: not looked for
    assert describe_os_error(socket.gaierror(-2, "")) == "[errno -2] "
    assert describe_os_error(OSError(0, "no errno")) is None


def test_backoff_bounds():
    with pytest.raises(ValueError, match="back-off base and cap must be positive, got 0.1 and 0"):
        Backoff(0.1, 0)
    with pytest.raises(ValueError, match="got 0 and 1"):
        Backoff(0, 1)
    assert Backoff(0.1, 1.0).busy_cap == 1.0
    assert Backoff(0.1, 1.0, busy_cap=5.0).busy_cap == 5.0
    assert Backoff(0.1, 1.0, busy_cap=0.5).busy_cap == 1.0
    assert Backoff(0.5, 0.1).cap == 0.5  # never below the base
    b = Backoff(0.1, 1.0)
    assert 0.0 <= b.next_delay() <= 0.1 and b.failures == 1  # random.uniform by default


# ------------------------------------------------ a standby that takes over from a hung primary


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), (580, 0.58), (600_000, 600.0),
    (600_001, None), (-1, None), (1.5, None), ("580", None), (True, None), (None, None),
])
def test_takeover_is_read_only_within_the_schema(value: Any, seconds: float | None):
    from xcecore.schema.verdict import takeover_of

    assert takeover_of({"takeover_ms": value}) == seconds
    assert takeover_of({}) is None
    shake = classify_handshake({"ok": True, "state": "standby", "primary": None, "takeover_ms": value})
    assert shake.kind == "no_primary" and shake.takeover == seconds


def test_a_standby_promising_a_takeover_names_no_primary_and_says_when():
    hint = hello_hint({"state": "standby", "primary": None, "takeover_ms": 420, "server": "h2:2"})
    assert hint is not None and (hint.kind, hint.primary, hint.takeover) == ("no_primary", None, 0.42)
    assert failure_of(hint) == "is a standby taking over from a primary that stopped beating in 420 ms"
    # A standby that names a primary is followed there whatever else it says.
    named = classify_handshake({"ok": True, "state": "standby", "primary": "h1:1", "takeover_ms": 5})
    assert named.kind == "redirect" and named.takeover is None


def test_walk_ends_at_a_takeover_promise_and_the_next_pass_waits_for_that_standby():
    # The hung primary A went last; B promises: C (another standby) and A are not dialed.
    m = machine()
    m.lost = A
    w = m.start_pass()
    assert next(w) == B
    level, line = w.failed(B, Dialed(None, "is a standby taking over ... in 420 ms", takeover=0.42))
    assert level == "DEBUG" and line.endswith("waiting for it (not dialing the hung primary)")
    assert list(w) == [] and w.takeover == (B, 0.42)
    m.pass_over(w)
    draws: list[float] = []
    b = Backoff(0.02, 2.0, uniform=lambda lo, hi: draws.append(hi) or hi)
    delay, eff = m.pass_failed(b)
    assert delay == pytest.approx(0.42) and not draws and b.failures == 0  # no back-off draw
    assert m.state == DEGRADED and NOTIFY in eff
    assert logs(eff, "WARNING") == [
        f"{NAME}: no primary: h2:2 takes over from a primary that stopped beating in 420 ms; "
        "next pass in 420 ms, starting there (not dialing the hung primary)"]
    m.pass_over(w)
    _, again = m.pass_failed(b)
    assert logs(again, "WARNING") == [] and len(logs(again, "DEBUG")) == 1  # said once
    w = m.start_pass()
    assert next(w) == B  # the promising standby first
    # It promoted meanwhile: the pass ends with its link; a pass without a promise backs off.
    m.pass_over(Walk([C], (A, B, C), allow_unlisted=False, name=NAME))
    assert m.takeover is None
    m.pass_failed(b)
    assert draws and b.failures == 1


@pytest.mark.parametrize(("promised", "waited"), [(0.0, 0.01), (0.004, 0.01), (0.3, 0.3), (9.0, 0.5), (600.0, 0.5)])
def test_a_takeover_wait_is_bounded_both_ways(promised: float, waited: float):
    from xcecore.client.dialer import takeover_wait

    assert takeover_wait(promised) == pytest.approx(waited)


def test_a_promise_and_a_redirect_in_one_pass_follow_the_redirect():
    w = Walk([B, C], (A, B, C), allow_unlisted=False, name=NAME)
    next(w)
    w.failed(B, Dialed("h3:3", "is a standby; primary is h3:3", takeover=0.2))
    assert w.takeover is None and next(w) == C


def test_heartbeats_wait_for_a_promised_takeover_too():
    m = machine()
    quick = Backoff(0.02, 0.2, uniform=lambda lo, hi: hi, busy_cap=0.5)
    assert m.beat_delay(quick, False, 0.2) == 0.2  # up: the cadence
    assert m.beat_delay(quick, True, 0.2) == pytest.approx(0.02)  # down: quick draws
    w = Walk([B], (A, B, C), allow_unlisted=False, name=NAME)
    next(w)
    w.failed(B, Dialed(None, "taking over", takeover=0.15))
    m.pass_over(w)
    assert m.beat_delay(quick, True, 0.2) == pytest.approx(0.15) and quick.failures == 1
    assert next(m.start_pass()) == B  # the heartbeat's pass starts at the promising standby
    m.pass_timed_out = True
    m.pass_over(Walk([C], (A, B, C), allow_unlisted=False, name=NAME))
    assert m.beat_delay(quick, True, 0.2) == pytest.approx(0.5)  # busy: spread as before
    assert m.beat_delay(quick, False, 0.2) == 0.2 and quick.failures == 0
