"""The candidate-list helper: order, clamping, and every malformed entry named."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from xcecore.candidates import (
    N_MAX_MASTERS,
    Candidate,
    CandidateError,
    candidates_from_config,
    parse_address,
    parse_peers,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def warnings() -> list[str]:
    seen: list[str] = []
    handler = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    yield seen
    logger.remove(handler)


def test_one_candidate() -> None:
    assert parse_peers("ctl1:7600") == (Candidate("ctl1", 7600),)


def test_three_candidates_keep_order(warnings: list[str]) -> None:
    got = parse_peers(" ctl2:7600, ctl1:7601,[::1]:7602 ")
    assert got == (Candidate("ctl2", 7600), Candidate("ctl1", 7601), Candidate("::1", 7602))
    assert [str(c) for c in got] == ["ctl2:7600", "ctl1:7601", "[::1]:7602"]
    assert warnings == []


def test_four_candidates_clamped_with_one_warning(warnings: list[str]) -> None:
    got = parse_peers("a:1,b:2,c:3,d:4")
    assert got == (Candidate("a", 1), Candidate("b", 2), Candidate("c", 3))
    assert len(got) == N_MAX_MASTERS
    assert len(warnings) == 1
    assert "d:4" in warnings[0] and "a:1" not in warnings[0]


def test_address_port_fallback() -> None:
    assert parse_peers(None, address="10.0.0.1", port=7600) == (Candidate("10.0.0.1", 7600),)
    assert parse_peers(None, address="::1", port=7600) == (Candidate("::1", 7600),)
    assert parse_peers(None, address="[::1]", port=7600) == (Candidate("::1", 7600),)


def test_peers_win_over_address() -> None:
    assert parse_peers("a:1", address="b", port=2) == (Candidate("a", 1),)


@pytest.mark.parametrize(
    ("peers", "needle"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("ctl1", "missing ':port'"),
        ("ctl1:", "missing port"),
        ("ctl1:0", "out of range"),
        ("ctl1:65536", "out of range"),
        ("ctl1:-5", "not a number"),
        ("ctl1:http", "not a number"),
        (":7600", "empty host"),
        ("[::1:7600", "without a closing"),
        ("::1]:7600", "without an opening"),
        ("[::1]7600", "missing ':port' after ']'"),
        ("[]:7600", "empty host between brackets"),
        ("[ctl1]:7600", "only for IPv6"),
        ("::1:7600", "must be bracketed"),
        ("a:1,,b:2", "double ','"),
        (",a:1", "leading ','"),
        ("a:1,", "trailing ','"),
        ("a:1,a:1", "listed twice"),
        ("bad host:1", "not a valid host"),
        ("a..b:1", "not a valid host"),
    ],
)
def test_malformed_entries_are_named(peers: str, needle: str) -> None:
    with pytest.raises(CandidateError) as err:
        parse_peers(peers)
    assert needle in str(err.value)
    if peers.strip() and "," not in peers:
        assert repr(peers.strip()) in str(err.value) or peers.strip() in str(err.value)


def test_nothing_configured() -> None:
    with pytest.raises(CandidateError, match="no controller candidates"):
        parse_peers(None)
    with pytest.raises(CandidateError, match="missing 'port'"):
        parse_peers(None, address="a")


def test_from_config_accepts_list_and_string() -> None:
    assert candidates_from_config({"peers": ["a:1", "b:2"]}) == parse_peers("a:1,b:2")
    assert candidates_from_config({"address": "a", "port": 1}) == (Candidate("a", 1),)
    with pytest.raises(CandidateError, match="string or a list"):
        candidates_from_config({"peers": 7600})


def test_address_roundtrip() -> None:
    for text in ["h:1", "[::1]:2", "10.1.2.3:65535", "[fe80::1%eth0]:7600"]:
        assert str(parse_address(text)) == text


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=80))
def test_random_input_raises_only_candidate_error(text: str) -> None:
    try:
        got = parse_peers(text)
    except CandidateError:
        return
    assert 1 <= len(got) <= N_MAX_MASTERS
    for c in got:
        assert 1 <= c.port <= 65535 and c.host


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True),
                          st.integers(1, 65535)), min_size=1, max_size=6, unique_by=lambda t: t))
def test_valid_lists_roundtrip(entries: list[tuple[str, int]]) -> None:
    text = ",".join(f"{h}:{p}" for h, p in entries)
    if len({(h, p) for h, p in entries}) != len(entries):
        return
    assert parse_peers(text) == tuple(Candidate(h, p) for h, p in entries[:N_MAX_MASTERS])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_address("  "), "empty candidate"),
        (lambda: parse_address("[::1/64]:1"), "candidate '[::1/64]:1': '::1/64' is not an IPv6 address"),
        (lambda: parse_address("[::1]:x"), "candidate '[::1]:x': port 'x' is not a number"),
        (lambda: parse_peers(None), "no controller candidates: set 'peers' or 'address' and 'port'"),
        (lambda: parse_peers(None, port=1), "single-controller configuration is missing 'address'"),
        (lambda: parse_peers(None, address="a"), "single-controller configuration is missing 'port'"),
        (lambda: parse_peers(7600), "peers must be a string like 'h1:7600,h2:7600', not 7600"),  # type: ignore[arg-type]
        (lambda: parse_peers(" "), "peers is empty: list at least one controller candidate"),
        (lambda: parse_peers("a:1,,b:2"), "peers 'a:1,,b:2': stray double ',' (empty entry #2)"),
    ],
)
def test_messages_exactly(call: Any, message: str) -> None:
    with pytest.raises(CandidateError) as err:
        call()
    assert str(err.value) == message


def test_brackets_and_colons_are_parsed_from_the_right_end() -> None:
    assert parse_address("[::1]:7600") == Candidate("::1", 7600)
    with pytest.raises(CandidateError, match="missing ':port' after ']'"):
        parse_address("[::1]]:7600")  # the first ']' closes the host
    with pytest.raises(CandidateError, match="must be bracketed"):
        parse_address("a:b:1")  # two colons outside brackets: a bare IPv6 address
    with pytest.raises(CandidateError, match="without a closing"):
        parse_address("[")
    assert parse_address("[ABCD::1]:1").host == "ABCD::1"
    with pytest.raises(CandidateError):
        parse_peers(None, address="[::1", port=1)  # half a bracket is kept, and refused


def test_clamp_warning_names_counts_and_what_is_dropped(warnings: list[str]) -> None:
    parse_peers("a:1,b:2,c:3,d:4,e:5")
    assert warnings == ["candidates: 5 listed, at most 3 are used; dropping d:4, e:5\n"]
