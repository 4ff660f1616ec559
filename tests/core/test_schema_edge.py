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
    ({"command": "x", "user": "u", "mem_limit": 0}, "mem_limit", ">= 1, got 0"),
    ({"command": "x", "user": "u", "mem_limit": 2**62 + 1}, "mem_limit", f"<= {2**62}"),
    ({"command": "x", "user": "u", "mem_limit": 1.5}, "mem_limit", "must be int, got float"),
    ({"command": "x", "user": "u", "run_limit": True}, "run_limit", "must be int, got bool"),
    ({"command": "x", "user": "u", "run_limit": lim.RUN_LIMIT_MAX + 1}, "run_limit", "<= 3153600000"),
    ({"command": "x", "user": "u", "stdout": "out.%x"}, "stdout", "unknown pattern %x (use %J, %I, %A)"),
    ({"command": "x", "user": "u", "stdout": "out.%"}, "stdout", "a lone % at the end"),
    ({"command": "x", "user": "u", "stderr": "a\nb"}, "stderr", "found U+000A at position 1"),
    ({"command": "x", "user": "u", "stdin": ""}, "stdin", "is empty"),
    ({"command": "x", "user": "u", "stdin": "i" * (lim.PATH_MAX + 1)}, "stdin", "at most 4,096 characters"),
    ({"command": "x", "user": "u", "exclusive": "yes"}, "exclusive", "must be bool, got str"),
])
def test_violations_name_the_field_and_the_limit(args: dict[str, Any], path: str, words: str) -> None:
    err = _invalid("jobsubmit", args)
    assert err.data["arg"] == path and words in err.message and f"'{path}'" in err.message, err.message


def test_the_job_execution_fields_are_taken_within_their_limits() -> None:
    args = {"command": "x", "user": "u", "mem_limit": 64 * 2**20, "run_limit": 5400,
            "stdout": "out.%J.%I", "stderr": "err.%A%%", "stdin": "in", "exclusive": True}
    assert SCHEMAS["jobsubmit"].check(args) == args
    report = {"jobid": 1, "event": "finish", "exit_status": 137, "attempt": 0, "time": 1.7e9,
              "usage": {"cputime": 1.25, "max_mem": 64.0, "pids": [1, 2]}, "exit_reason": "mem_limit"}
    assert SCHEMAS["notify_job"].check(report) == report
    assert SCHEMAS["notify_job"].check({"jobid": 1, "event": "start", "pid": 7, "time": 0})["time"] == 0


@pytest.mark.parametrize(("args", "path", "words"), [
    ({"time": -1}, "time", ">= 0"),
    ({"time": 1e300}, "time", "<= 253402300799"),
    ({"time": float("nan")}, "time", "finite number"),
    ({"time": "now"}, "time", "must be float, got str"),
    ({"exit_reason": "oom"}, "exit_reason", "must be one of 'done', 'exit_code', 'signal', "
                                            "'mem_limit', 'run_limit', 'killed' or 'no_start'"),
    ({"usage": {"cpu": float("inf")}}, "usage.cpu", "finite number"),
    ({"usage": [1]}, "usage", "must be object, got list"),
])
def test_worker_reports_are_bounded(args: dict[str, Any], path: str, words: str) -> None:
    err = _invalid("notify_job", {"jobid": 1, "event": "finish", "exit_status": 0, **args})
    assert err.data["arg"] == path and words in err.message, err.message


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
                                 {"queue": "a b"}, {"command": " "}, {"mem_limit": 0},
                                 {"run_limit": 2**40}, {"stdout": "o.%q"}, {"stdin": ""},
                                 {"exclusive": 1}])
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
