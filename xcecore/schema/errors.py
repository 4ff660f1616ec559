"""Validation errors in words: which field (a dotted path) broke which limit.

Both edges use :func:`describe`: the controller turns a failed op validation into one
``INVALID`` reply (:func:`invalid`), the API server a failed body into an HTTP 422; so the
same bad value gets the same sentence on the wire and on REST.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xcecore.schema.limits import PATTERN_TEXT
from xcecore.wire import ErrorCode, RemoteError

_TYPE_NAMES = {
    "int_type": "int", "int_parsing": "int", "string_type": "str", "bool_type": "bool",
    "bool_parsing": "bool", "float_type": "float", "float_parsing": "float",
    "dict_type": "object", "list_type": "list", "typed_dict_type": "object",
    "model_type": "object", "model_attributes_type": "object", "none_required": "null",
}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def describe(error: Any, prefix: Sequence[str | int] = ()) -> tuple[str, str]:
    """``(dotted path, what is wrong)`` for one pydantic error (an ``ErrorDetails`` dict).

    The path names the field as the caller wrote it: ``alloc.0.ntasks``, ``env.PATH``; an
    object key that is itself invalid reads ``env.<key> (key)``.
    """
    loc = [*prefix, *error.get("loc", ())]
    key = bool(loc) and loc[-1] == "[key]"
    if key:
        loc = loc[:-1]
    ctx = error.get("ctx") or {}
    kind = error.get("type", "")
    sub = ctx.get("path") if kind == "json_bound" else None
    parts = [str(p) for p in loc] + ([sub] if sub else [])
    path = ".".join(parts)
    text = _problem(kind, ctx, error.get("input"), error.get("msg", ""))
    if key:
        path, text = f"{path} (key)", f"key {text}"
    return path, text


def _problem(kind: str, ctx: dict[str, Any], value: Any, msg: str) -> str:
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not accepted"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]}, got {json_type(value)}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "is empty" if n == 1 else f"must have at least {n:,} characters"
    if kind == "string_too_long":
        return f"must have at most {ctx.get('max_length', 0):,} characters, got {len(value):,}"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return "is empty" if n == 1 else f"must have at least {n:,} items"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length', 0):,} items, got {ctx.get('actual_length', '?'):,}"
    if kind == "string_pattern_mismatch":
        text = PATTERN_TEXT.get(ctx.get("pattern", ""), f"must match {ctx.get('pattern')!r}")
        found = _first_control(value)
        return f"{text} (found {found})" if found else text
    bounds = {"greater_than_equal": (">=", "ge"), "less_than_equal": ("<=", "le"),
              "greater_than": (">", "gt"), "less_than": ("<", "lt")}
    if kind in bounds:
        op, name = bounds[kind]
        return f"must be {op} {ctx.get(name)}, got {value!r}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {_short(value)}"
    if kind == "json_bound":
        return str(ctx.get("problem") or msg)
    if kind == "string_unicode":
        return "must be valid Unicode (no lone surrogates)"
    if kind == "recursion_loop":
        return "nests too deeply"
    if kind in ("value_error", "assertion_error"):
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return msg or kind


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_control(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    for i, ch in enumerate(value):
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return f"U+{code:04X} at position {i}"
    return ""


def limit_of(error: Any) -> dict[str, Any]:
    """The violated constraint as JSON-safe data (``{"max_length": 255}``, ...), or {}."""
    ctx = error.get("ctx") or {}
    return {k: v for k, v in ctx.items()
            if k in ("min_length", "max_length", "ge", "le", "gt", "lt", "pattern", "expected")
            and isinstance(v, int | str)}


def invalid(op: str, errors: Sequence[Any], noun: str = "argument",
            prefix: Sequence[str | int] = ()) -> RemoteError:
    """One ``INVALID`` error for a failed validation of ``op``'s arguments.

    The message names the first problem (``jobsubmit: argument 'ntasks' must be >= 1, got
    0``) and how many more there are; ``data`` holds ``arg`` (the dotted path), ``limit``
    (the violated constraint) and, when there are several, ``errors`` (the first ten).
    """
    described = [describe(e, prefix) for e in errors[:10]] or [("", "is invalid")]
    path, problem = described[0]
    kind = errors[0].get("type") if errors else ""
    if problem == "is not accepted":
        text = f"{op}: unknown {noun} {path!r}"
    elif kind in ("value_error", "assertion_error"):  # a validator's own sentence
        text = f"{op}: {noun} {path!r}: {problem}" if path else f"{op}: {problem}"
    else:
        text = f"{op}: {noun} {path!r} {problem}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    data: dict[str, Any] = {"arg": path}
    limit = limit_of(errors[0]) if errors else {}
    if limit:
        data["limit"] = limit
    if len(errors) > 1:
        data["errors"] = [{"arg": p, "problem": q} for p, q in described]
    return RemoteError(ErrorCode.INVALID, text, data)
