"""Job-submission vocabulary: limits, output paths, environment options, exit reasons.

Pure functions shared by whoever submits a job (the CLI, REST) and the worker that runs it:

- :func:`parse_mem` — a memory limit as LSF's ``-M`` takes it (``64MB``, ``2G``, a bare number
  in the site's default unit), in bytes;
- :func:`parse_run_limit` — LSF's ``-W [hours:]minutes`` (also xce's ``--time``), and
  :func:`parse_slurm_time` — Slurm's ``--time`` forms; both in seconds;
- :func:`parse_exclusive` — ``-x`` / ``--exclusive[=...]``;
- :func:`parse_env_option` — ``--env none|all|VAR,...`` (LSF ``bsub -env``; Slurm's
  ``--export`` maps to the same :class:`xcecore.jobenv.EnvOption`);
- :func:`expand_path` — ``%J`` (job id), ``%I`` (array index, 0 for a job that is not in an
  array, as LSF does) and ``%A`` (the attempt) in ``-o``/``-e``/``-i`` paths;
- :data:`EXIT_REASONS` and :func:`describe_exit` — how a job ended, as the worker reports it.

The job record fields these produce (``mem_limit`` bytes, ``run_limit`` seconds, ``stdout``,
``stderr``, ``stdin``, ``exclusive``, ``env``) are documented in ``docs/protocol-ops.md``.
Nothing here imports anything heavy or names a role.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final, Literal

from xcecore.jobenv import EnvOption
from xcecore.schema.limits import MEM_LIMIT_MAX, RUN_LIMIT_MAX

if TYPE_CHECKING:
    from xcecore.jobenv import EnvMode

MEM_UNITS: Final[dict[str, int]] = {
    "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60,
}
"""Memory units, binary as LSF and Slurm count them (``KB``/``K`` = 1024 bytes)."""
DEFAULT_MEM_UNIT: Final = "MB"
"""The unit of a bare number when the site configures none (LSF's LSF_UNIT_FOR_LIMITS is
commonly set to MB; Slurm's ``--mem`` defaults to MB)."""
MAX_MEM: Final = MEM_LIMIT_MAX  # the submission edge's limit (xcecore.schema.limits)

_MEM_RE: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]{0,8})\s*\Z")
_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class JobSpecError(ValueError):
    """A submission option's value is malformed; the message names the option and why."""


def mem_unit(text: str, *, what: str) -> int:
    """The bytes in a memory unit: ``B``, ``KB`` or ``K``, ``MB`` or ``M``, ... ``EB``
    (case-insensitive, binary); anything else is a :class:`JobSpecError` naming ``what``."""
    word = text.upper()
    if word.endswith("B") and len(word) == 2:
        word = word[0]
    if word not in MEM_UNITS:
        raise JobSpecError(f"{what}: unknown unit {text!r} (use KB, MB, GB, TB, PB or EB)")
    return MEM_UNITS[word]


def parse_mem(text: str, default_unit: str = DEFAULT_MEM_UNIT, *, what: str = "-M") -> int:
    """A memory amount in bytes: ``"64MB"``, ``"2G"``, ``"1.5GB"``, ``"512"`` (in
    ``default_unit``). Units are case-insensitive and binary. Zero, a negative, a unit that
    is not one, or more than 4 EiB is a :class:`JobSpecError` naming ``what``."""
    if not isinstance(text, str):
        raise JobSpecError(f"{what}: expected a memory amount such as 64MB, got {text!r}")
    m = _MEM_RE.match(text)
    if m is None:
        raise JobSpecError(f"{what}: {text!r} is not a memory amount (e.g. 64MB, 2G, 512)")
    number, unit = m.groups()
    scale = (mem_unit(unit, what=what) if unit else
             mem_unit(default_unit, what=f"{what} default unit"))
    value = float(number) * scale if "." in number else int(number) * scale
    if value < 1:
        raise JobSpecError(f"{what}: {text!r} must be at least one byte")
    if value > MAX_MEM:
        raise JobSpecError(f"{what}: {text!r} is larger than any memory ({MAX_MEM} bytes)")
    return int(value)


def format_mem(nbytes: int) -> str:
    """Bytes as the largest binary unit that divides them evenly (``67108864`` -> ``64MB``)."""
    for unit in ("E", "P", "T", "G", "M", "K"):
        scale = MEM_UNITS[unit]
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}B"
    return f"{nbytes}B"


def _int(part: str, what: str, text: str) -> int:
    if not part.isdigit() or not part.isascii():
        raise JobSpecError(f"{what}: {text!r} is not a run limit ([hours:]minutes, e.g. 90 or 1:30)")
    return int(part)


MAX_RUN_LIMIT: Final = RUN_LIMIT_MAX  # a century: beyond it a limit means nothing


def parse_run_limit(text: str, *, what: str = "-W") -> int:
    """LSF's run limit ``[hours:]minutes`` in seconds: ``"90"``, ``"1:30"``. Minutes may
    exceed 59 (``"210"`` is three and a half hours, as in LSF). Normalisation to a host
    (``-W 1:30/hostA``) is not supported and says so. Zero is an error: no option means no
    limit."""
    if not isinstance(text, str):
        raise JobSpecError(f"{what}: expected [hours:]minutes, got {text!r}")
    raw = text.strip()
    if "/" in raw:
        raise JobSpecError(f"{what}: {text!r}: a run limit normalised to a host (/HOST) is not "
                           "supported; give the wall-clock limit")
    parts = raw.split(":")
    if len(parts) > 2:
        raise JobSpecError(f"{what}: {text!r} is not a run limit ([hours:]minutes, e.g. 90 or 1:30)")
    nums = [_int(p, what, text) for p in parts]
    minutes = nums[0] * 60 + nums[1] if len(nums) == 2 else nums[0]
    return _positive_limit(minutes * 60, what, text)


def _positive_limit(seconds: int, what: str, text: str) -> int:
    if seconds <= 0:
        raise JobSpecError(f"{what}: {text!r}: a run limit must be more than zero")
    if seconds > MAX_RUN_LIMIT:
        raise JobSpecError(f"{what}: {text!r} is longer than a century")
    return seconds


def parse_slurm_time(text: str, *, what: str = "--time") -> int | None:
    """Slurm's time limit in seconds, or None for no limit (``0``, ``UNLIMITED``,
    ``INFINITE``). Forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    if not isinstance(text, str):
        raise JobSpecError(f"{what}: expected a Slurm time such as 1:00:00, got {text!r}")
    raw = text.strip()
    if raw.upper() in ("UNLIMITED", "INFINITE", "0"):
        return None
    bad = JobSpecError(f"{what}: {text!r} is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M, "
                       "D-H:M:S)")
    days = 0
    if "-" in raw:
        d, _, raw = raw.partition("-")
        if not d.isdigit() or not d.isascii():
            raise bad
        days = int(d)
        parts = raw.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
            raise bad
        h, m, s = [*map(int, parts), 0, 0][:3]
    else:
        parts = raw.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
            raise bad
        nums = [*map(int, parts)]
        h, m, s = ([0, *nums, 0] if len(nums) == 1 else
                   [0, *nums] if len(nums) == 2 else nums)
    return _positive_limit(((days * 24 + h) * 60 + m) * 60 + s, what, text)


def parse_exclusive(value: str | bool | None, *, what: str = "--exclusive") -> bool:
    """Whether a job wants its hosts to itself: ``-x`` (a flag: None or True) or Slurm's
    ``--exclusive[=user|mcs|topo]`` — the ``user``/``mcs``/``topo`` variants share hosts
    with others and are refused with a message rather than silently widened."""
    if value is None or value is True or value == "":
        return True
    if value is False:
        return False
    if isinstance(value, str) and value.lower() in ("yes", "true", "1"):
        return True
    if isinstance(value, str) and value.lower() in ("no", "false", "0"):
        return False
    raise JobSpecError(f"{what}: {value!r} is not supported (only whole-host exclusivity)")


# ----------------------------------------------------------------------------- environment

def _env_name(name: str, what: str) -> str:
    if not _NAME_RE.match(name):
        raise JobSpecError(f"{what}: {name!r} is not a variable name")
    return name


def parse_env_option(text: str, *, what: str = "--env") -> EnvOption:
    """``none``, ``all``, ``all, ~VAR, VAR2=value``, or ``VAR[=value], ...`` (LSF's ``bsub
    -env``); case-insensitive keywords. A value may not contain a comma."""
    if not isinstance(text, str):
        raise JobSpecError(f"{what}: expected none, all or a list of variables, got {text!r}")
    items = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in items):
        raise JobSpecError(f"{what}: {text!r}: empty entry (use none, all or VAR,...)")
    head = items[0].lower()
    if head == "none":
        if len(items) > 1:
            raise JobSpecError(f"{what}: {text!r}: 'none' takes no variables")
        return EnvOption("none")
    mode: EnvMode = "all" if head == "all" else "list"
    names: list[str] = []
    exclude: list[str] = []
    assign: dict[str, str] = {}
    for item in items[1:] if mode == "all" else items:
        if item.lower() in ("all", "none"):
            raise JobSpecError(f"{what}: {text!r}: {item!r} must come first and alone")
        if item.startswith("~"):
            if mode != "all":
                raise JobSpecError(f"{what}: {text!r}: ~{item[1:]} excludes only after 'all'")
            exclude.append(_env_name(item[1:], what))
        elif "=" in item:
            name, _, value = item.partition("=")
            assign[_env_name(name.strip(), what)] = value
        else:
            names.append(_env_name(item, what))
    return EnvOption(mode, tuple(names), tuple(exclude), assign)


# ----------------------------------------------------------------------------- output paths

_PATTERN: Final = re.compile(r"%(.)", re.DOTALL)


def expand_path(template: str, jobid: int, attempt: int = 0, index: int = 0) -> str:
    """``%J`` -> job id, ``%I`` -> array index, ``%A`` -> attempt, ``%%`` -> ``%``; any other
    ``%x`` is a :class:`JobSpecError` (an unknown pattern is a typo, not a file name)."""
    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "J":
            return str(jobid)
        if key == "I":
            return str(index)
        if key == "A":
            return str(attempt)
        if key == "%":
            return "%"
        raise JobSpecError(f"output path {template!r}: unknown pattern %{key} (use %J, %I, %A)")
    if template.endswith("%") and not template.endswith("%%"):
        raise JobSpecError(f"output path {template!r}: a lone % at the end")
    return _PATTERN.sub(one, template)


# ----------------------------------------------------------------------------- exit reasons

ExitReason = Literal["done", "exit_code", "signal", "mem_limit", "run_limit", "killed",
                     "no_start"]
EXIT_REASONS: Final[tuple[ExitReason, ...]] = (
    "done", "exit_code", "signal", "mem_limit", "run_limit", "killed", "no_start")
"""How a job ended, as the worker knows it. ``killed``: on request (the controller knows
whether the owner or an administrator asked, the worker does not)."""


def describe_exit(reason: ExitReason, exit_status: int | None = None) -> str:
    """The words for an exit reason: ``exit code 3``, ``killed by signal 9``, ``memory limit
    exceeded``, ``run limit reached``, ``killed``, ``could not start``, ``done``."""
    if reason == "exit_code":
        return f"exit code {exit_status}"
    if reason == "signal":
        sig = exit_status - 128 if exit_status is not None and exit_status > 128 else exit_status
        return f"killed by signal {sig}"
    return {"done": "done", "mem_limit": "memory limit exceeded",
            "run_limit": "run limit reached", "killed": "killed",
            "no_start": "could not start"}[reason]
