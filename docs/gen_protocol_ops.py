"""Generate ``docs/protocol-ops.md`` from the schemas, the op table and the page's prose.

Run from the repository root::

    python docs/gen_protocol_ops.py > docs/protocol-ops.md

The op table comes from ``xce_controller.ops.OPS`` (who may call, kind, joins), each op's
section from its argument model in ``xcecore.schema.ops`` (docstring: the contract; fields:
the argument table, with each constrained type's limits from ``xcecore.schema.types``), and
the rest of the page from ``docs/protocol-ops.md.in``. ``tests/core/test_docs.py`` checks that
the committed page is this script's output.
"""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "protocol-ops.md.in"


def _metadata(tp: Any) -> tuple[Any, list[Any]]:
    """(the bare type, every ``Annotated`` metadata item), unwrapping NotRequired/Required."""
    meta: list[Any] = []
    while True:
        origin = typing.get_origin(tp)
        if origin in (typing.NotRequired, typing.Required):
            tp = typing.get_args(tp)[0]
        elif origin is typing.Annotated:
            meta.extend(tp.__metadata__)
            tp = typing.get_args(tp)[0]
        else:
            return tp, meta


def _label(tp: Any, meta: list[Any]) -> str:
    from xcecore.schema.types import Shape

    shapes = [m for m in meta if isinstance(m, Shape)]
    if shapes:
        return shapes[0].label
    if typing.get_origin(tp) is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(tp))
    return {bool: "bool", int: "int", str: "str", float: "number"}.get(tp, getattr(tp, "__name__", str(tp)))


def _description(meta: list[Any]) -> str:
    texts = [m.description for m in meta if getattr(m, "description", None)]
    return texts[-1] if texts else ""


def _fields(model: Any) -> list[tuple[str, str, str]]:
    """(name, type label, description) of each field of a TypedDict model."""
    from xcecore.schema.ops import typed_dict_of

    cls = typed_dict_of(model)
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for name in cls.__annotations__:
        tp, meta = _metadata(hints[name])
        out.append((name, _label(tp, meta), _description(meta)))
    return out


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").replace("``", "`")


def _who(roles: frozenset[str] | None, users: bool) -> str:
    if roles is None:
        return "any"
    names = sorted(roles)
    if users:
        names.append("users' clients")
    return ", ".join(names)


def op_table() -> str:
    """The table of who may call each op, its kind, joins and admin rights."""
    from xce_controller.ops import OPS

    rows = ["## The op table", "",
            "| op | roles | join | kind | admin |", "|---|---|---|---|---|"]
    for op, spec in OPS.items():
        if spec.member_roles is None:
            join = "yes"
        elif not spec.member_roles:
            join = "no"
        else:
            join = f"{_who(spec.member_roles, False)}: yes; others: no"
        kind = spec.kind + (" (not deduplicated)" if spec.kind == "write" and not spec.dedupe else "")
        admin = "users' clients: yes (or a grant)" if spec.admin else "no"
        if spec.acts:
            admin += " (*user*)"
        rows.append(f"| `{op}` | {_who(spec.roles, spec.users)} | {join} | {kind} | {admin} |")
    rows += ["", "A role not listed for an op gets `DENIED` (a `worker` calling `jobsubmit`, a "
                 "scheduler calling `notify_job`). *Users' clients* are every role but the "
                 "member daemons (`cli`, the API server, a third party's role). *(user)*: the "
                 "op acts for a user -- the caller's authenticated user, or the one a front end "
                 "(the API server) names in `user`; nobody else may name a user.", ""]
    return "\n".join(rows)


def _arg_table(model: Any, required: frozenset[str], user_needed: bool) -> list[str]:
    fields = [f for f in _fields(model) if f[0] != "user" or "user" in required or user_needed]
    if not fields:
        return ["Arguments: none (`user` is accepted)."]
    rows = ["| argument | type | required | meaning |", "|---|---|---|---|"]
    for name, label, text in fields:
        needed = "yes" if name in required else "from front ends" if name == "user" else "no"
        rows.append(f"| `{name}` | {label} | {needed} | {text} |")
    return rows


def ops() -> str:
    """One section per op: its contract and its arguments."""
    from xce_controller.ops import OPS, SCHEMAS

    out: list[str] = []
    for op, spec in OPS.items():
        schema = SCHEMAS[op]
        table = _arg_table(schema.model, schema.required, spec.acts)
        out += [f"### `{op}`", "", *table, "",
                _doc(schema.fields), ""]
    return "\n".join(out)


def host_attrs() -> str:
    """The attributes a joining host (a worker) gives."""
    from xcecore.schema.ops import HostAttrs

    rows = ["### Host attributes (a worker's `join` `attrs`)", "", _doc(HostAttrs), "",
            "| attribute | type | required | meaning |", "|---|---|---|---|"]
    required = {"hname"}
    for name, label, text in _fields(HostAttrs):
        rows.append(f"| `{name}` | {label} | {'yes' if name in required else 'no'} | {text} |")
    return "\n".join(rows) + "\n"


def limits() -> str:
    """Every constrained type and the generic bound, with their limits."""
    from xcecore.schema import limits as lim
    from xcecore.schema import types as t

    rows = ["## Limits", "",
            "Every request's `args` first get a generic bound, whatever the op: "
            f"{lim.WIRE.describe()} (and the frame itself at most `cluster.max_frame`). Then "
            "the op's own types, each with its limits:", "",
            "| type | what it accepts |", "|---|---|"]
    seen: set[str] = set()
    for name in t.__dict__:
        value = getattr(t, name)
        if typing.get_origin(value) is not typing.Annotated:
            continue
        for shape in (m for m in value.__metadata__ if isinstance(m, t.Shape)):
            key = f"{shape.label}|{shape.text}"
            if shape.text and key not in seen:
                seen.add(key)
                rows.append(f"| {shape.label} | {shape.text} |")
    rows += ["", "A request past a limit is `INVALID` naming the argument and the limit; nothing "
                 "of it is applied. The REST API's request bodies use the same types "
                 "(an HTTP 422 names the same field and limit).", ""]
    return "\n".join(rows)


def standby_verdict() -> str:
    """The standby's handshake verdict (``xcecore.schema.verdict.StandbyVerdict``)."""
    from xcecore.schema.verdict import StandbyVerdict

    required = StandbyVerdict.__required_keys__
    rows = [_doc(StandbyVerdict), "", "| field | type | always | meaning |", "|---|---|---|---|"]
    for name, label, text in _fields(StandbyVerdict):
        label = label.replace("None", "null").replace(" | ", " \\| ")
        rows.append(f"| `{name}` | {label} | {'yes' if name in required else 'no'} | {text} |")
    return "\n".join(rows)


def render() -> str:
    """The whole page."""
    text = TEMPLATE.read_text()
    for marker, part in (("{{op_table}}", op_table), ("{{ops}}", ops),
                         ("{{host_attrs}}", host_attrs), ("{{limits}}", limits),
                         ("{{standby_verdict}}", standby_verdict)):
        text = text.replace(marker, part())
    return text


if __name__ == "__main__":
    sys.stdout.write(render())
