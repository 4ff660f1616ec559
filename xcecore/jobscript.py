"""Directives in a job script: ``#XCE``, and the common subset of ``#BSUB`` and ``#SBATCH``.

``xce submit script.sh`` reads them (a pure parser: text in, :class:`Directives` out);
options given on the command line override them. As in LSF and Slurm, directives are read
from the top of the script down to the first line that is neither blank nor a comment (a
``#!`` line first is fine); a directive after that is ordinary text. Each directive line is
split like a shell word list (quotes work, a ``#`` that starts a word starts a comment).
Later lines override earlier ones.

What each family understands (``docs/operator.md``, "Job scripts", lists the same):

========================  ==============================  ===================================
field                     ``#XCE`` and ``#BSUB``          ``#SBATCH``
========================  ==============================  ===================================
queue                     ``-q``                          ``-p``/``--partition``
name                      ``-J``                          ``-J``/``--job-name``
array (index text)        ``-J "name[1-10:2]%5"``         ``-a``/``--array=1-10:2%5``
                          (or ``--array`` in #XCE)
depend (expression)       ``-w``/``--dependency``         ``-d``/``--dependency``
ntasks                    ``-n``                          ``-n``/``--ntasks``
resreq                    ``-R``                          ``-G``/``--gpus``/``--gres=gpu:N``
                                                          (as ``rusage[ngpus=N]``)
mem_limit (bytes)         ``-M``/``--mem`` (LSF units)    ``--mem`` (Slurm units, MB default)
run_limit (seconds)       ``-W``/``--time`` ([h:]m)       ``-t``/``--time`` (Slurm forms)
stdout / stderr / stdin   ``-o`` / ``-e`` / ``-i``        ``-o``/``-e``/``-i`` and long forms
                                                          (``%j`` -> ``%J``, ``%a`` -> ``%I``)
exclusive                 ``-x``                          ``--exclusive``
project                   ``-P``                          ``-A``/``--account``
cwd                       ``-cwd`` (``--cwd`` in #XCE)    ``-D``/``--chdir``
env                       ``-env``/``--env``              ``--export`` (ALL, NONE, VAR[=v],..)
========================  ==============================  ===================================

Options that only notify (``#BSUB -u -N -B``, ``#SBATCH --mail-type --mail-user``) are
accepted and ignored, with a warning; anything else is a :class:`~xcecore.jobspec.JobSpecError`
naming the line and the option, so a script never runs with a directive silently dropped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar

from xcecore.jobenv import EnvOption
from xcecore.jobspec import (
    DEFAULT_MEM_UNIT,
    JobSpecError,
    parse_env_option,
    parse_exclusive,
    parse_mem,
    parse_run_limit,
    parse_slurm_time,
)

MAX_SCRIPT: Final = 1 << 20  # directives are read from the first MiB only
_SLURM_PATTERNS: Final = {"j": "%J", "a": "%I", "A": "%J", "%": "%%"}


class Directives:
    """What a script's directives ask for; None where they say nothing. (A plain class, not
    a dataclass: ``xce submit script.sh`` imports this module, and ``dataclasses`` would cost
    it ~10 ms.)"""

    FIELDS: Final = ("queue", "name", "ntasks", "resreq", "mem_limit", "run_limit", "stdout",
                     "stderr", "stdin", "exclusive", "project", "cwd", "env", "array", "depend")
    __slots__ = (*FIELDS, "warnings")

    queue: str | None
    name: str | None
    ntasks: int | None
    resreq: str | None
    mem_limit: int | None
    run_limit: int | None
    stdout: str | None
    stderr: str | None
    stdin: str | None
    exclusive: bool | None
    project: str | None
    cwd: str | None
    env: EnvOption | None
    array: str | None  # an index expression; LSF's -J name[...] is split by the submitter
    depend: str | None  # a dependency expression (checked by the submitter and the controller)
    warnings: list[str]

    def __init__(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, None)
        self.warnings = []

    def given(self) -> dict[str, Any]:
        """The fields a directive set (warnings excluded)."""
        return {name: getattr(self, name) for name in self.FIELDS
                if getattr(self, name) is not None}


class _Line:
    """One directive line being parsed: its words and where it came from."""

    def __init__(self, family: str, lineno: int, words: list[str]) -> None:
        self.family, self.lineno, self.words, self.pos = family, lineno, words, 0

    def err(self, msg: str) -> JobSpecError:
        return JobSpecError(f"line {self.lineno}: #{self.family} {msg}")

    def next_option(self) -> tuple[str, str | None] | None:
        """The next option and its inline value (``--time=10``), or None at the end."""
        if self.pos >= len(self.words):
            return None
        word = self.words[self.pos]
        self.pos += 1
        if not word.startswith("-") or word in ("-", "--"):
            raise self.err(f"{word!r}: expected an option")
        if word.startswith("--") and "=" in word:
            opt, _, value = word.partition("=")
            return opt, value
        return word, None

    def value(self, opt: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if self.pos >= len(self.words):
            raise self.err(f"{opt} needs a value")
        self.pos += 1
        return self.words[self.pos - 1]


def _count(text: str, where: _Line, opt: str) -> int:
    if not text.isdigit() or not text.isascii() or int(text) < 1:
        raise where.err(f"{opt} {text!r}: expected a whole number >= 1")
    return int(text)


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _checked(where: _Line, fn: Callable[_P, _T], *args: _P.args, **kw: _P.kwargs) -> _T:
    try:
        return fn(*args, **kw)
    except JobSpecError as exc:
        raise where.err(str(exc)) from None


# LSF-style options of #XCE and #BSUB: option -> field (values parsed below).
_LSF_FIELDS: Final = {
    "-q": "queue", "-J": "name", "-n": "ntasks", "-R": "resreq", "-M": "mem_limit",
    "--mem": "mem_limit", "-W": "run_limit", "--time": "run_limit", "-o": "stdout",
    "-e": "stderr", "-i": "stdin", "-P": "project", "-cwd": "cwd", "--cwd": "cwd",
    "-env": "env", "--env": "env", "--array": "array", "-w": "depend", "--dependency": "depend",
}
_LSF_IGNORED: Final = {"-u": True, "-N": False, "-B": False}  # option -> takes a value
_SLURM_FIELDS: Final = {
    "-p": "queue", "--partition": "queue", "-J": "name", "--job-name": "name",
    "-n": "ntasks", "--ntasks": "ntasks", "--mem": "mem_limit", "-t": "run_limit",
    "--time": "run_limit", "-o": "stdout", "--output": "stdout", "-e": "stderr",
    "--error": "stderr", "-i": "stdin", "--input": "stdin", "-A": "project",
    "--account": "project", "-D": "cwd", "--chdir": "cwd", "--export": "env",
    "-G": "gpus", "--gpus": "gpus", "--gres": "gres", "-a": "array", "--array": "array",
    "-d": "depend", "--dependency": "depend",
}
_SLURM_IGNORED: Final = {"--mail-type": True, "--mail-user": True}  # option -> takes a value


def _slurm_path(text: str, line: _Line, opt: str) -> str:
    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in _SLURM_PATTERNS:
            raise line.err(f"{opt} {text!r}: Slurm pattern %{key} is not supported "
                           "(%j, %a, %A, %%)")
        return _SLURM_PATTERNS[key]
    return re.sub(r"%(.)", one, text)


def _slurm_export(text: str, line: _Line, opt: str) -> EnvOption:
    parts = [p.strip() for p in text.split(",")]
    head = parts[0].upper() if parts else ""
    if head == "NONE" and len(parts) == 1:
        return EnvOption("none")
    if head in ("ALL", "NONE"):  # Slurm's NONE,VAR=v exports only the listed ones
        rest = ",".join(parts[1:])
        if not rest:
            return EnvOption("all")
        opt_text = ("all," if head == "ALL" else "") + rest
        return _checked(line, parse_env_option, opt_text, what=opt)
    return _checked(line, parse_env_option, text, what=opt)


def _add_gpus(out: Directives, n: int) -> None:
    part = f"rusage[ngpus={n}]"
    out.resreq = f"{out.resreq} {part}" if out.resreq else part


def _gres(out: Directives, value: str, line: _Line, opt: str) -> None:
    m = re.fullmatch(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", value)
    if m is None:
        raise line.err(f"{opt} {value!r}: only gpu[:type]:N is supported")
    _add_gpus(out, _count(m.group(1), line, opt))


_Setter = Callable[[Directives, str, _Line, str, str], None]
"""How a field takes an option's value: ``(out, value, line, option, mem_unit)``."""


def _set_ntasks(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
    out.ntasks = _count(v, line, opt)


def _set_mem(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
    out.mem_limit = _checked(line, parse_mem, v, unit, what=opt)


def _set_env(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
    out.env = _checked(line, parse_env_option, v, what=opt)


def _set_run_limit(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
    out.run_limit = _checked(line, parse_run_limit, v, what=opt)


def _set_slurm_time(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
    out.run_limit = _checked(line, parse_slurm_time, v, what=opt)


def _set_slurm_path(field: str) -> _Setter:
    def put(out: Directives, v: str, line: _Line, opt: str, unit: str) -> None:
        setattr(out, field, _slurm_path(v, line, opt))
    return put


class _Family:
    """One directive family's options: what each sets, which are ignored (and whether they
    take a value), the exclusive-host flag, how a field takes its value (a plain string
    when it has no setter), and the unit of a bare memory number (None: the caller's)."""

    __slots__ = ("exclusive", "fields", "ignored", "mem_unit", "setters")

    def __init__(self, fields: dict[str, str], ignored: dict[str, bool],
                 exclusive: tuple[str, Callable[[str | None, _Line, str], bool]],
                 setters: dict[str, _Setter], mem_unit: str | None) -> None:
        self.fields, self.ignored, self.exclusive = fields, ignored, exclusive
        self.setters, self.mem_unit = setters, mem_unit


_LSF: Final = _Family(
    _LSF_FIELDS, _LSF_IGNORED, ("-x", lambda inline, line, opt: True),
    {"ntasks": _set_ntasks, "mem_limit": _set_mem, "run_limit": _set_run_limit, "env": _set_env},
    None)
_SLURM: Final = _Family(
    _SLURM_FIELDS, _SLURM_IGNORED,
    ("--exclusive", lambda inline, line, opt: _checked(line, parse_exclusive, inline, what=opt)),
    {"ntasks": _set_ntasks, "mem_limit": _set_mem, "run_limit": _set_slurm_time,
     "stdout": _set_slurm_path("stdout"), "stderr": _set_slurm_path("stderr"),
     "stdin": _set_slurm_path("stdin"),
     "env": lambda out, v, line, opt, unit: setattr(out, "env", _slurm_export(v, line, opt)),
     "gpus": lambda out, v, line, opt, unit: _add_gpus(out, _count(v, line, opt)),
     "gres": lambda out, v, line, opt, unit: _gres(out, v, line, opt)},
    "MB")


def _options(line: _Line, out: Directives, family: _Family, mem_unit: str) -> None:
    """Apply one directive line's options to ``out`` by ``family``'s table."""
    unit = family.mem_unit or mem_unit
    flag, exclusive = family.exclusive
    while (item := line.next_option()) is not None:
        opt, inline = item
        if opt == flag:
            out.exclusive = exclusive(inline, line, opt)
            continue
        if opt in family.ignored:
            if family.ignored[opt]:
                line.value(opt, inline)
            out.warnings.append(f"line {line.lineno}: #{line.family} {opt} (mail) is ignored")
            continue
        name = family.fields.get(opt)
        if name is None:
            raise line.err(f"{opt}: not a supported option (see docs/operator.md, Job scripts)")
        value = line.value(opt, inline)
        setter = family.setters.get(name)
        if setter is None:
            setattr(out, name, value)
        else:
            setter(out, value, line, opt, unit)


_DIRECTIVE: Final = re.compile(r"#(XCE|BSUB|SBATCH)(?=\s|$)(.*)\Z")


def parse_script(text: str, *, mem_unit: str = DEFAULT_MEM_UNIT) -> Directives:
    """The directives of job script ``text``; :class:`JobSpecError` names the line of a bad
    one. ``mem_unit`` is the unit of a bare ``-M`` number in ``#XCE``/``#BSUB``."""
    out = Directives()
    for lineno, raw in enumerate(text[:MAX_SCRIPT].splitlines(), 1):
        stripped = raw.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break  # the first command ends the directives, as in LSF and Slurm
        m = _DIRECTIVE.match(stripped)
        if m is None:
            continue
        family, rest = m.groups()
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as exc:
            raise JobSpecError(f"line {lineno}: #{family}: {exc}") from None
        line = _Line(family, lineno, words)
        _options(line, out, _SLURM if family == "SBATCH" else _LSF, mem_unit)
    return out
