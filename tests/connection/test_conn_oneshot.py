"""The one-shot client (blocking, one plain socket): the same walk, redirects, retries and
verdicts as the event-loop client, against fake controllers on real loopback sockets."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
from clientkit import make_config
from fakectl import SharedStore, nowhere

from xcecore import wire
from xcecore.candidates import parse_address
from xcecore.client import AuthenticationFailed, BackendUnavailable, OneShotClient, OutcomeUnknown

pytestmark = [pytest.mark.timeout(30)]


class Lines:
    """The one-shot client's log lines, as ``(level, text)``."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, text: str) -> None:
        self.lines.append((level, text))

    def find(self, text: str, level: str | None = None) -> list[str]:
        return [t for lv, t in self.lines if text in t and (level is None or lv == level)]


def oneshot(*addresses: str, **overrides: Any) -> tuple[OneShotClient, Lines]:
    log = Lines()
    return OneShotClient(make_config(*addresses, **overrides), role="cli", log=log), log


def test_connects_calls_and_closes(thread_fakes):
    a = thread_fakes("a")
    c, log = oneshot(a.address)
    with c:
        assert c.call("hello", {"x": 1}) == {"server": "a"}
        assert c.candidate == parse_address(a.address)
    assert c.candidate is None
    assert log.find(f"connected to {a.address} (primary)", "INFO")


def test_standby_first_is_followed_to_the_primary_without_back_off(thread_fakes):
    store = SharedStore()
    p = thread_fakes("p", store=store)
    s = thread_fakes("s", mode="standby", store=store, primary=p.address)
    c, log = oneshot(s.address, p.address, backoff_base=5.0, backoff_cap=5.0)
    with c:
        started = time.monotonic()
        assert c.call("jobsubmit", {"x": 1})["applied_by"] == "p"
        assert time.monotonic() - started < 2.0  # no back-off sleep (0..5 s)
    assert log.find(f"candidate {s.address} is a standby, following redirect to {p.address}", "WARNING")
    assert s.requests == []  # left at its hello: it never authenticated nor got the request


def test_a_standby_promising_a_takeover_is_waited_for_and_the_hung_primary_never_dialed(thread_fakes):
    store = SharedStore()
    s = thread_fakes("s", mode="standby", store=store)
    s.takeover_ms, s.promote_at = 150, 2
    hung = thread_fakes("h", mode="hang", store=store)
    c, log = oneshot(s.address, hung.address, backoff_base=5.0, backoff_cap=5.0)
    with c:
        started = time.monotonic()
        assert c.call("jobsubmit", {"x": 1})["applied_by"] == "s"
        assert time.monotonic() - started < 2.0  # the promise's wait, no back-off draw (0..5 s)
    assert hung.connections == 0 and s.connections == 2
    assert log.find(f"no primary: {s.address} takes over from a primary that stopped beating in "
                    "150 ms; next pass in 150 ms, starting there", "WARNING")


def test_refused_candidate_is_skipped_and_unlisted_redirect_refused(thread_fakes):
    p = thread_fakes("p")
    dead = nowhere()
    c, log = oneshot(dead, p.address)
    with c:
        assert c.call("hello") == {"server": "p"}
    assert log.find(f"candidate {dead} refused or closed the connection (connection refused); "
                    "trying the next candidate", "WARNING")
    s = thread_fakes("s", mode="standby", primary=p.address)
    c, log = oneshot(s.address)  # p is not listed
    with c, pytest.raises(BackendUnavailable, match="retry budget of 0 exhausted"):
        c.call("hello", retry_budget=0)
    assert log.find("not a listed candidate", "WARNING")
    assert p.connections == 1


def test_giving_up_when_every_candidate_refuses_says_what_each_refused() -> None:
    """Every connection refused (nothing listens): the give-up message names each
    candidate and what it met, for a connect (``whoami``) as for a call -- not "last error:
    None"."""
    dead = [nowhere(), nowhere()]
    for attempt in ("whoami", "call"):
        c, _ = oneshot(*dead)
        go = functools.partial(c.whoami) if attempt == "whoami" else functools.partial(c.call, "hello")
        with c, pytest.raises(BackendUnavailable) as err:
            go(deadline=0.5)
        text = str(err.value)
        assert "None" not in text, text
        assert "no primary within the deadline of 0.5 s (last pass: " + "; ".join(
            f"{d} refused or closed the connection (connection refused)" for d in dead) + ")" \
            in text, text


def test_a_write_whose_primary_dies_is_retried_elsewhere_with_its_key(thread_fakes):
    store = SharedStore()
    a = thread_fakes("a", store=store)
    b = thread_fakes("b", store=store)
    c, log = oneshot(a.address, b.address)
    with c:
        c.call("hello")
        a.drop_on_op, a.apply_before_drop, a.kill_on_drop = a.op_count + 1, True, True
        result = c.call("jobsubmit", {"x": 1})
        assert result == {"op": "jobsubmit", "applied_by": "a", "n": 1}  # the stored result
        assert c.candidate == parse_address(b.address)
    assert len(store.applied) == 1
    assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid
    assert log.find(f"lost connection to {a.address}", "WARNING")


def test_redirect_reply_goes_to_the_named_primary(thread_fakes):
    store = SharedStore()
    a = thread_fakes("a", store=store)
    b = thread_fakes("b", store=store, mode="standby")
    c, _ = oneshot(a.address, b.address)
    with c:
        c.call("hello")
        a.mode, a.primary, b.mode = "standby", b.address, "primary"
        assert c.call("jobsubmit")["applied_by"] == "b"
    assert a.ops("jobsubmit")[0].rid == b.ops("jobsubmit")[0].rid


def test_not_joined_joins_and_retries_once(thread_fakes):
    a = thread_fakes("a")
    a.require_join = {"update_resvals"}
    c, log = oneshot(a.address)
    with c:
        assert c.call("update_resvals", {"r1m": 1})["op"] == "update_resvals"
    assert [r.op for r in a.requests] == ["update_resvals", "join", "update_resvals"]
    assert a.joins[0].args == {"role": "cli", "attrs": {}}
    assert log.find("answered NOT_JOINED to update_resvals; re-joining, then retrying once")


def test_unanswered_write_past_its_deadline_is_unknown_a_read_unavailable(thread_fakes):
    a = thread_fakes("a")
    a.hold_ops = {"jobsubmit", "jobinfo"}
    c, log = oneshot(a.address)
    with c:
        with pytest.raises(OutcomeUnknown) as info:
            c.call("jobsubmit", {"x": 1}, deadline=0.3)
        assert info.value.rid == a.ops("jobsubmit")[0].rid
        with pytest.raises(BackendUnavailable, match="deadline of 0.3 s"):
            c.call("jobinfo", deadline=0.3)
        with pytest.raises(BackendUnavailable):
            OneShotClient(make_config(nowhere()), log=log).call("jobsubmit", deadline=0.3)
    assert log.find("giving up on jobsubmit", "WARNING")


def test_silent_primary_is_left_after_the_liveness_timeout(thread_fakes):
    store = SharedStore()
    a = thread_fakes("a", store=store)
    b = thread_fakes("b", store=store)
    c, log = oneshot(a.address, b.address, liveness_timeout=0.3, connect_timeout=0.3)
    with c:
        c.call("hello")
        a.mode = "hang"
        assert c.call("jobsubmit", {"x": 1})["applied_by"] == "b"
    assert log.find("no frame for 0.3 s with 1 request(s) outstanding: liveness timeout", "WARNING")


def test_wrong_key_is_an_authentication_failure_not_an_outage(thread_fakes):
    a = thread_fakes("a", key=b"right")
    c, log = oneshot(a.address, key=b"wrong")
    with c:
        for _ in range(2):
            with pytest.raises(AuthenticationFailed) as info:
                c.call("hello")  # no deadline, no budget: raised at once all the same
    assert str(info.value).startswith("authentication failed: bad cluster key")
    assert a.connections == 2
    assert len(log.find("refused the handshake", "ERROR")) == 1


def test_error_replies_raise_remote_error(thread_fakes):
    a = thread_fakes("a")
    a.handlers["bad"] = lambda args: (_ for _ in ()).throw(wire.RemoteError("INVALID", "bad args"))
    c, _ = oneshot(a.address)
    with c, pytest.raises(wire.RemoteError) as info:
        c.call("bad")
    assert (info.value.code, info.value.message) == ("INVALID", "bad args")
    assert len(a.ops("bad")) == 1


def test_probe_tells_primary_standby_and_down(thread_fakes):
    p = thread_fakes("p")
    s = thread_fakes("s", mode="standby", primary=p.address)
    dead = nowhere()
    c, _ = oneshot(p.address, s.address, dead)
    with c:
        assert [c.probe(cand, timeout=0.5) for cand in c.config.candidates] == [
            "primary", "standby", "down"]
    assert p.requests == []  # a probe only handshakes
