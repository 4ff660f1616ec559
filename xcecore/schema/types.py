"""Constrained types shared by every edge: the controller's op arguments and the REST bodies.

Each type is an ``Annotated`` alias that carries its limits (from :mod:`xcecore.schema.limits`)
and a :class:`Shape`, the short name and the sentence the generated docs show for it. The API
server's request models use these very aliases, so a REST body and a wire request are held
to the same limits by the same objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

from xcecore import arrayspec, depspec, jobspec
from xcecore.protocol import JOB_STATES
from xcecore.schema import limits as lim


@dataclass(frozen=True, slots=True)
class Shape:
    """How the docs name a type (``label``, as in an argument table) and describe it."""

    label: str
    text: str = ""


def _str(min_length: int, max_length: int, pattern: str) -> StringConstraints:
    return StringConstraints(min_length=min_length, max_length=max_length, pattern=pattern)


def _int(ge: int, le: int) -> Any:
    return Field(ge=ge, le=le)


# ------------------------------------------------------------------------------ integers

Int64 = Annotated[int, _int(lim.INT64_MIN, lim.INT64_MAX), Shape("int", "a 64-bit integer")]
JobId = Annotated[int, _int(1, lim.INT64_MAX), Shape("int >= 1", "a job id (64-bit, >= 1)")]
Count = Annotated[int, _int(1, lim.INT32_MAX), Shape("int >= 1", f"a count, 1 to {lim.INT32_MAX:,}")]
Pid = Annotated[int, _int(1, lim.INT32_MAX), Shape("int >= 1", "a process id")]
ExitStatus = Annotated[int, _int(lim.INT32_MIN, lim.INT32_MAX),
                       Shape("int", "an exit status (32-bit; negative: killed by that signal)")]
Attempt = Annotated[int, _int(0, lim.INT32_MAX), Shape("int >= 0", "a run attempt (0 first)")]
NonNegative = Annotated[int, _int(0, lim.INT64_MAX), Shape("int >= 0", "a 64-bit integer >= 0")]
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False),
                   Shape("number >= 0", "an integer or a finite float >= 0")]
MemLimit = Annotated[int, _int(1, lim.MEM_LIMIT_MAX),
                     Shape("bytes", f"a memory limit in bytes, 1 to {lim.MEM_LIMIT_MAX:,} (4 EiB)")]
RunLimit = Annotated[int, _int(1, lim.RUN_LIMIT_MAX),
                     Shape("seconds", f"a run limit in seconds, 1 to {lim.RUN_LIMIT_MAX:,} (a century)")]
Epoch = Annotated[float, Field(ge=0, le=lim.EPOCH_MAX, allow_inf_nan=False),
                  Shape("time", "seconds since the epoch (integer or float), 0 to the end of year 9999")]

# ------------------------------------------------------------------------------- strings

Name = Annotated[str, _str(1, lim.NAME_MAX, lim.NAME_PATTERN),
                 Shape("name", f"1 to {lim.NAME_MAX} characters, no space or control character")]
Label = Annotated[str, _str(0, lim.LABEL_MAX, lim.NO_CONTROL),
                  Shape("text", f"at most {lim.LABEL_MAX:,} characters, no control character")]
Command = Annotated[str, _str(1, lim.COMMAND_MAX, lim.COMMAND_PATTERN),
                    Shape("command", f"1 to {lim.COMMAND_MAX:,} characters, not blank; no "
                                     "control character but TAB and LF (no NUL)")]
WorkDir = Annotated[str, _str(0, lim.PATH_MAX, lim.NO_CONTROL),
                    Shape("path", f"at most {lim.PATH_MAX:,} characters, no control character")]


def _check_job_path(text: str) -> str:
    """Only the patterns the worker expands (``%J``, ``%I``, ``%A``, ``%%``): a typo is refused
    at submission, not found when the job starts."""
    jobspec.expand_path(text, 1)  # a JobSpecError is a ValueError: pydantic's value_error
    return text


JobPath = Annotated[str, _str(1, lim.PATH_MAX, lim.NO_CONTROL), AfterValidator(_check_job_path),
                    Shape("job path", f"1 to {lim.PATH_MAX:,} characters, no control character; "
                                      "`%J` job id, `%I` array index, `%A` attempt, `%%` a `%` "
                                      "(any other `%` pattern is refused)")]


def _check_array(text: str) -> str:
    """An index expression the controller will accept (an ArrayError is a ValueError)."""
    arrayspec.parse_array(text)
    return text


ArrayText = Annotated[str, _str(1, arrayspec.TEXT_MAX, lim.NO_CONTROL), AfterValidator(_check_array),
                      Shape("array", "job array indexes, `N`, `FIRST-LAST` or `FIRST-LAST:STEP`, "
                                     "comma-separated, then an optional `%LIMIT` (elements "
                                     f"running at once); at most {arrayspec.ELEMENTS_MAX:,} "
                                     "elements, no index given twice")]


def _check_depend(text: str) -> str:
    depspec.parse(text)  # a DepError is a ValueError
    return text


DependText = Annotated[str, _str(1, depspec.TEXT_MAX, lim.NO_CONTROL), AfterValidator(_check_depend),
                       Shape("dependency", "done(ID), exit(ID[, OP CODE]), ended(ID), started(ID) "
                                           "with && || ! and parentheses (ID: a job id, "
                                           "ID[INDEX] or a job name), or Slurm's "
                                           "afterok:ID[:ID...],afterany:... ; at most "
                                           f"{depspec.TERMS_MAX} terms")]
ArrayIndex = Annotated[int, _int(0, arrayspec.INDEX_MAX),
                       Shape("int >= 0", f"an array index, 0 to {arrayspec.INDEX_MAX:,}")]
ResReq = Annotated[str, _str(0, lim.RESREQ_MAX, lim.NO_CONTROL),
                   Shape("resreq", f"a resource requirement: at most {lim.RESREQ_MAX:,} "
                                   "characters, no control character")]
EnvName = Annotated[str, _str(1, lim.NAME_MAX, lim.ENV_NAME_PATTERN)]
EnvValue = Annotated[str, _str(0, lim.ENV_VALUE_MAX, lim.NO_CONTROL_BUT_TAB_LF)]
Env = Annotated[dict[EnvName, EnvValue], Field(max_length=lim.ENV_MAX_ITEMS),
                Shape("env", f"object of at most {lim.ENV_MAX_ITEMS:,} variables: names of 1 to "
                             f"{lim.NAME_MAX} characters without '=', space or control "
                             f"character; values of at most {lim.ENV_VALUE_MAX:,} characters, "
                             "no control character but TAB and LF")]
Rid = Annotated[str, _str(1, lim.RID_MAX, lim.NO_CONTROL),
                Shape("rid", f"1 to {lim.RID_MAX} characters, no control character")]
TaskId = Annotated[int, _int(1, lim.INT32_MAX), Shape("int >= 1", "a task of a job (1 first)")]
TaskKey = Annotated[str, _str(64, 64, r"^[0-9a-f]{64}$"), Shape("sha-256 hex", "64 hex digits")]
TaskSecret = Annotated[str, _str(16, 128, r"^[0-9a-f]+$"), Shape("hex", "16 to 128 hex digits")]
JobIdKey = Annotated[str, _str(1, 18, lim.JOBID_KEY_PATTERN)]
StoreId = Annotated[str, _str(1, 64, lim.NAME_PATTERN), Shape("store id", "a store's id, 1 to 64 characters")]
Cursor = Annotated[str, _str(1, lim.CURSOR_MAX, lim.NAME_PATTERN),
                   Shape("cursor", f"a page's `next`, as given (1 to {lim.CURSOR_MAX} characters)")]
PageLimit = Annotated[int, _int(1, lim.PAGE_MAX), Shape("int >= 1", f"1 to {lim.PAGE_MAX:,}")]

ExitReason = jobspec.ExitReason
"""How a job ended, as its worker knows it (:data:`xcecore.jobspec.EXIT_REASONS`)."""
JobState = Literal[JOB_STATES]  # type: ignore[valid-type]
"""One of the job states of :mod:`xcecore.protocol` (PEND, PSUSP, RUN, ...)."""

# ------------------------------------------------------------------------------ batches

JobIds = Annotated[list[JobId], Field(max_length=lim.BATCH_MAX),
                   Shape("list[int >= 1]", f"at most {lim.BATCH_MAX:,} job ids")]
Names = Annotated[list[Name], Field(max_length=lim.BATCH_MAX),
                  Shape("list[name]", f"at most {lim.BATCH_MAX:,} names")]
PageJobIds = Annotated[list[JobId], Field(max_length=lim.PAGE_MAX),
                       Shape("list[int >= 1]", f"at most {lim.PAGE_MAX:,} job ids")]
PageNames = Annotated[list[Name], Field(max_length=lim.PAGE_MAX),
                      Shape("list[name]", f"at most {lim.PAGE_MAX:,} names")]
JobStates = Annotated[list[JobState], Field(max_length=len(JOB_STATES)),
                      Shape("list[state]", "job states")]
PendReasons = Annotated[dict[JobIdKey, Label], Field(max_length=lim.BATCH_MAX),
                        Shape("reasons", f"object: job id as a string (\"12\") -> reason (text); at most "
                                        f"{lim.BATCH_MAX:,} entries")]

# ------------------------------------------------------------------- free-form JSON values


def _json_validator(bound: lim.Bound, *, objects_only: bool) -> Any:
    def check(value: Any) -> Any:
        if objects_only and type(value) is not dict:
            raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
        found = lim.find_violation(value, bound)
        if found is not None:
            path, problem = found
            raise PydanticCustomError("json_bound", "{problem}", {"path": path, "problem": problem})
        return value

    return PlainValidator(check)


_JSON_TEXT = "a JSON value " + lim.JSON.describe() + "; integers 64-bit, no NUL in strings"

JsonValue = Annotated[Any, _json_validator(lim.JSON, objects_only=False), WithJsonSchema({}),
                      Shape("JSON", _JSON_TEXT)]
JsonObject = Annotated[dict[str, Any], _json_validator(lim.JSON, objects_only=True),
                       WithJsonSchema({"type": "object"}), Shape("JSON object", _JSON_TEXT)]


_GOOD_NAMES: set[str] = set()
"""Resource names already found valid: workers send the same dozen names every few seconds."""
_GOOD_NAMES_MAX = 4096


def _check_resvals(value: Any) -> dict[str, Any]:
    """Resource values: a flat object of names -> number, string or bool."""
    if type(value) is not dict:
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    if len(value) > lim.RESVALS_MAX:
        raise PydanticCustomError("json_bound", "{problem}", {
            "path": "", "problem": f"has {len(value):,} entries, more than {lim.RESVALS_MAX:,}"})
    for k, v in value.items():
        tv = type(v)
        if k in _GOOD_NAMES and (tv is bool or (tv is float and math.isfinite(v))
                                 or (tv is int and lim.INT64_MIN <= v <= lim.INT64_MAX)):
            continue  # the common case: a known resource name and a number
        problem = _resval_problem(k, v)
        if problem is None and len(_GOOD_NAMES) < _GOOD_NAMES_MAX:
            _GOOD_NAMES.add(k)
        if problem is not None:
            raise PydanticCustomError("json_bound", "{problem}", {"path": str(k)[:64], "problem": problem})
    return value


def _resval_problem(k: Any, v: Any) -> str | None:
    if type(k) is not str or not 0 < len(k) <= lim.NAME_MAX or lim.CONTROL_OR_SPACE.search(k):
        return f"resource name must be 1 to {lim.NAME_MAX} characters, no space or control character"
    t = type(v)
    if t is bool or v is None:
        return None
    if t is int:
        return None if lim.INT64_MIN <= v <= lim.INT64_MAX else "is an integer outside the 64-bit range"
    if t is float:
        return None if math.isfinite(v) else "must be a finite number"
    if t is str:
        if len(v) > lim.RESVAL_STRING_MAX:
            return f"is a string of more than {lim.RESVAL_STRING_MAX:,} characters"
        return "must not contain control characters" if lim.CONTROL.search(v) else None
    return "must be a number, a string, a bool or null"


ResVals = Annotated[dict[str, Any], PlainValidator(_check_resvals), WithJsonSchema({"type": "object"}),
                    Shape("resvals", f"object: resource name -> number, string, bool or null; at most "
                                    f"{lim.RESVALS_MAX:,} entries, strings of at most "
                                    f"{lim.RESVAL_STRING_MAX:,} characters")]
