"""The protocol vocabulary: one host:port parser for every address, op names, error codes."""

from __future__ import annotations

import pytest

from xcecore import protocol, wire
from xcecore.candidates import CandidateError, parse_peers
from xcecore.protocol import AddressError, format_hostport, parse_hostport

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:7600", ("127.0.0.1", 7600)),
    ("  h-1.example.org:1 ", ("h-1.example.org", 1)),
    ("[::1]:65535", ("::1", 65535)),
    ("[fe80::1%eth0]:7600", ("fe80::1%eth0", 7600)),
    ("lab_host:80", ("lab_host", 80)),
])
def test_parses_and_formats_back(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected
    assert parse_hostport(format_hostport(*expected)) == expected


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty address"),
    ("h", "missing ':port'"),
    ("h:", "missing port after ':'"),
    ("h:x", "port 'x' is not a number"),
    ("h:0", "out of range 1-65535"),
    ("h:65536", "out of range 1-65535"),
    (":80", "empty host"),
    ("a..b:1", "not a valid host name"),
    ("::1:80", "IPv6 addresses must be bracketed"),
    ("[::1:80", "'[' without a closing ']'"),
    ("::1]:80", "']' without an opening '['"),
    ("[]:80", "empty host between brackets"),
    ("[host]:80", "brackets are only for IPv6"),
    ("[::1]80", "missing ':port' after ']'"),
    ("127.0.0.1:7600;127.0.0.1:7601", "';' is not a separator: list several addresses with ','"),
])
def test_every_malformed_address_says_why(text: str, needle: str) -> None:
    with pytest.raises(AddressError) as err:
        parse_hostport(text, what="address")
    assert needle in str(err.value)


def test_port_zero_only_where_asked() -> None:
    assert parse_hostport("127.0.0.1:0", port_zero=True) == ("127.0.0.1", 0)
    with pytest.raises(AddressError, match="out of range 1-65535"):
        parse_hostport("127.0.0.1:0")


def test_every_address_of_the_cluster_goes_through_the_one_parser() -> None:
    """Candidates, the controller's listen and the API server's listen reject alike."""
    from xce_controller.settings import parse_listen

    from xcecore.config import ConfigError, validate
    from xcecore.plugins import PluginManager

    bad = "::1:80"
    with pytest.raises(CandidateError, match="candidate '::1:80': IPv6 addresses must be bracketed"):
        parse_peers(bad)
    with pytest.raises(AddressError, match="controller.listen '::1:80': IPv6 addresses must be bracketed"):
        parse_listen(bad)
    pm = PluginManager.load({})
    with pytest.raises(ConfigError, match="apiserver.listen '::1:80': IPv6 addresses must be bracketed"):
        validate({"apiserver": {"listen": bad}}, pm.config_sections())
    # The semicolon slip: the right message, not an IPv6 one.
    with pytest.raises(CandidateError, match="';' is not a separator") as err:
        parse_peers("127.0.0.1:7600;127.0.0.1:7601")
    assert "IPv6" not in str(err.value)


def test_op_names_are_the_controllers_table() -> None:
    from xce_controller.ops import OPS

    assert set(OPS) == set(protocol.OP_NAMES)
    assert len(protocol.OP_NAMES) == len(set(protocol.OP_NAMES))


def test_error_codes_live_in_the_protocol() -> None:
    assert wire.ErrorCode is protocol.ErrorCode
    assert {c.value for c in protocol.ErrorCode} >= {"REDIRECT", "NO_PRIMARY", "NOT_JOINED", "CONFLICT"}
