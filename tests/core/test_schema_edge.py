"""The typed edge: the generated ops page is current, every op has its schema, and the limits
of :mod:`xcecore.schema` hold at both edges (wire and REST) with the same words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xce_controller.ops import OPS, SCHEMAS

from xcecore import wire
from xcecore.schema import limits as lim
from xcecore.schema.ops import OP_ARGS, check_host_attrs
from xcecore.wire import RemoteError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def test_protocol_ops_page_is_generated_from_the_schemas() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_protocol_ops.py")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert (ROOT / "docs" / "protocol-ops.md").read_text() == res.stdout, (
        "docs/protocol-ops.md is stale: run `python docs/gen_protocol_ops.py > docs/protocol-ops.md`")
    for op in OPS:
        assert f"### `{op}`" in res.stdout


def test_every_op_has_exactly_one_schema() -> None:
    from xcecore.protocol import OP_NAMES

    assert list(OPS) == list(OP_ARGS) == list(SCHEMAS) == list(OP_NAMES)
    for op, schema in SCHEMAS.items():
        assert "user" in schema.names, op  # every op accepts the front end's user
        assert schema.fields.__doc__, f"{op}'s model has no docstring: it is the op's contract"


def _invalid(op: str, args: dict[str, Any]) -> RemoteError:
    with pytest.raises(RemoteError) as info:
        SCHEMAS[op].check(args)
    assert info.value.code == "INVALID"
    return info.value


@pytest.mark.parametrize(("args", "path", "words"), [
    ({"command": "a\x00b", "user": "u"}, "command", "found U+0000 at position 1"),
    ({"command": "x", "user": "u", "cwd": "/a\x1bb"}, "cwd", "control characters"),
    ({"command": "x", "user": "u", "env": {"A": "v\x00"}}, "env.A", "control characters"),
    ({"command": "x", "user": "u", "env": {"A=": "v"}}, "env.A= (key)", "'='"),
    ({"command": "x", "user": "u bad"}, "user", "spaces"),
    ({"command": "x", "user": "u", "ntasks": 2**31}, "ntasks", "<= 2147483647"),
    ({"command": "x" * (lim.COMMAND_MAX + 1), "user": "u"}, "command", "at most 32,768 characters"),
    ({"command": "x", "user": "u", "queue": "q" * 256}, "queue", "at most 255 characters"),
])
def test_violations_name_the_field_and_the_limit(args: dict[str, Any], path: str, words: str) -> None:
    err = _invalid("jobsubmit", args)
    assert err.data["arg"] == path and words in err.message and f"'{path}'" in err.message, err.message


def test_free_form_values_are_bounded() -> None:
    deep: Any = 1
    for _ in range(lim.JSON.depth):
        deep = [deep]
    err = _invalid("join", {"role": "worker", "attrs": {"x": deep}})
    assert "nests deeper than 8 levels" in err.message and err.data["arg"].startswith("attrs.x")
    assert _invalid("update_jusage", {"jobid": 1, "usage": {"k": "a\x00"}}).data["arg"] == "usage.k"
    assert _invalid("update_resvals", {"values": {"r1m": [1]}}).data["arg"] == "values.r1m"
    assert _invalid("update_resvals", {"values": {"r 1": 1}}).data["arg"] == "values.r 1"
    ok = {"r1m": 0.5, "mem": 2**63 - 1, "tag": "x", "up": True, "none": None}
    assert SCHEMAS["update_resvals"].check({"values": ok}) == {"values": ok}


def test_host_attrs_are_typed_where_the_views_read_them() -> None:
    with pytest.raises(RemoteError, match="attrs.maxmem"):
        check_host_attrs("join", {"hname": "n1", "maxmem": "lots"})
    with pytest.raises(RemoteError, match="attrs.hname"):
        check_host_attrs("join", {"ncpus": 2})
    assert check_host_attrs("join", {"hname": "n1", "maxmem": 8, "site": [1]})["hname"] == "n1"


def test_the_wire_bounds_every_request_whatever_the_op() -> None:
    deep: Any = 1
    for _ in range(lim.WIRE.depth):
        deep = {"k": deep}
    with pytest.raises(RemoteError, match="nests deeper than 32 levels") as info:
        wire.parse_request({"id": 1, "op": "any_op_at_all", "args": {"a": deep}})
    assert info.value.data["arg"].startswith("a.k")
    with pytest.raises(RemoteError, match="'rid'"):
        wire.parse_request({"id": 1, "op": "x", "rid": "a\x00b"})
    with pytest.raises(RemoteError, match="'op'"):
        wire.parse_request({"id": 1, "op": "x" * 65})
    assert wire.parse_request({"id": 1, "op": "x", "args": {"a": [1, {"b": "c"}]}}).args == {"a": [1, {"b": "c"}]}


@pytest.mark.parametrize("bad", [{"env": {"A": "v\x00"}}, {"ntasks": 0}, {"cwd": "\x07"},
                                 {"queue": "a b"}, {"command": " "}])
def test_rest_and_wire_refuse_the_same_value_in_the_same_words(bad: dict[str, Any]) -> None:
    from pydantic import ValidationError
    from xce_apiserver import models as m

    from xcecore.schema.errors import describe

    body = {"command": "x", **bad}
    with pytest.raises(ValidationError) as info:
        m.SubmitBody.model_validate(body)
    rest_path, rest_problem = describe(info.value.errors()[0])
    wire_err = _invalid("jobsubmit", {**body, "user": "u"})
    assert rest_path == wire_err.data["arg"] and rest_problem in wire_err.message
