"""What ``xce submit`` sends: its options, a job script's directives, the environment.

:func:`build` turns the parsed command line into ``jobsubmit`` arguments:

- a command whose first word names a job script (a regular file whose first line starts
  with ``#``) has its ``#XCE``, ``#BSUB`` and ``#SBATCH`` directives read
  (:mod:`xcecore.jobscript`); options given on the command line override them, field by
  field. The script runs where it is, by its absolute path (as ``bsub script`` does; it is
  not copied), with its arguments; one that is not executable runs through its ``#!``
  interpreter, or ``/bin/sh``;
- ``-M`` is converted to bytes (a bare number in ``[cluster] unit_for_limits``, default MB),
  ``-W`` to seconds, ``-x`` to ``exclusive``; ``-o``/``-e``/``-i`` go as given (the
  controller checks their patterns, the worker expands them in the job's cwd);
- the environment: the submitter's (all of it by default, as LSF does, or what ``--env`` or a
  directive chooses), less what the controller would refuse (named in a warning);
- the working directory: ``--cwd``, a directive's, or the current one, made absolute here.

The parsers (:mod:`xcecore.jobspec`, :mod:`xcecore.jobscript`) are imported only when an
option or a script needs them: ``xce submit -- true`` pays for none of them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from xcecore.cli.session import CommandError
from xcecore.cli.spec import ArgError, Parsed

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    from xcecore.jobenv import EnvOption

SCRIPT_HEAD = 1 << 20
"""Directives are read from the first MiB of a script (:data:`xcecore.jobscript.MAX_SCRIPT`)."""

FIELDS = ("queue", "name", "ntasks", "resreq", "project", "cwd", "stdout", "stderr", "stdin",
          "array", "depend")
"""Options that are given as they are, and that override a directive of the same field."""


def read_script(word: str) -> str | None:
    """The text of ``word`` if it names a job script (a regular file whose first line starts
    with ``#``: a ``#!`` line or a directive), else None. A name that is no file here (``true``,
    ``sleep``) costs one failed ``stat``."""
    try:
        if not stat.S_ISREG(os.stat(word).st_mode):
            return None
        with open(word, "rb") as fh:
            head = fh.read(SCRIPT_HEAD)
    except OSError:
        return None
    return head.decode("utf-8", errors="replace") if head.startswith(b"#") else None


def script_command(path: str, text: str, args: list[str]) -> list[str]:
    """The command that runs script ``path`` (absolute) with ``args``: itself if it is
    executable, else its ``#!`` interpreter (with its one argument, as the kernel passes it)
    or ``/bin/sh``."""
    if os.access(path, os.X_OK):
        return [path, *args]
    first = text.split("\n", 1)[0]
    if first.startswith("#!") and first[2:].strip():
        interpreter, _, arg = first[2:].strip().partition(" ")
        return [interpreter, *([arg.strip()] if arg.strip() else []), path, *args]
    return ["/bin/sh", path, *args]


def _mem_unit(cluster: Mapping[str, Any]) -> str:
    from xcecore.jobspec import JobSpecError, mem_unit

    unit = str(cluster.get("unit_for_limits") or "MB")
    try:
        mem_unit(unit, what="cluster.unit_for_limits")
    except JobSpecError as exc:
        raise CommandError(str(exc)) from None
    return unit


def _directives(word: str, text: str, unit: str) -> tuple[dict[str, Any], list[str]]:
    from xcecore.jobscript import parse_script
    from xcecore.jobspec import JobSpecError

    try:
        found = parse_script(text, mem_unit=unit)
    except JobSpecError as exc:
        raise CommandError(f"submit: {word}: {exc}") from None
    return found.given(), [f"{word}: {w}" for w in found.warnings]


def _limits(ns: Parsed, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """``-M``, ``-W`` and ``-x`` as ``jobsubmit`` fields; a malformed value is an
    :class:`ArgError` (a usage error) naming the option."""
    out: dict[str, Any] = {}
    if ns.mem is None and ns.time is None:
        return {"exclusive": True} if ns.exclusive else {}
    from xcecore.jobspec import JobSpecError, parse_mem, parse_run_limit

    try:
        if ns.mem is not None:
            out["mem_limit"] = parse_mem(ns.mem, _mem_unit(cluster), what="-M/--mem")
        if ns.time is not None:
            out["run_limit"] = parse_run_limit(ns.time, what="-W/--time")
    except JobSpecError as exc:
        raise ArgError(str(exc)) from None
    if ns.exclusive:
        out["exclusive"] = True
    return out


def _env_option(text: str | None, directive: EnvOption | None) -> EnvOption:
    if text is None:
        if directive is not None:
            return directive
        from xcecore.jobenv import EnvOption

        return EnvOption()  # all of the submitter's environment, as LSF does
    from xcecore.jobspec import JobSpecError, parse_env_option

    try:
        return parse_env_option(text, what="--env")
    except JobSpecError as exc:
        raise ArgError(str(exc)) from None


def _split_array(given: dict[str, Any]) -> None:
    """LSF's ``-J "name[1-10]%2"`` is a name and an array; ``--array`` (Slurm's) is checked
    here too, so a bad expression is refused before anything is sent."""
    name = given.get("name")
    if not isinstance(name, str) and given.get("array") is None:
        return
    from xcecore.arrayspec import ArrayError, describe, parse_array, split_name

    try:
        if isinstance(name, str):
            base, spec = split_name(name)
            if spec is not None:
                if given.get("array") is not None:
                    raise ArgError(f"-J {name!r} names an array and --array gives one too: "
                                   "give one of them")
                given["name"], given["array"] = base, describe(spec)
        if given.get("array") is not None:
            given["array"] = describe(parse_array(given["array"]))
    except ArrayError as exc:
        raise ArgError(str(exc)) from None


def build(ns: Parsed, cluster: Mapping[str, Any], environ: Mapping[str, str],
          cwd: str) -> tuple[dict[str, Any], list[str]]:
    """The ``jobsubmit`` arguments of ``xce submit``'s command line ``ns``, and the warnings
    to print (ignored directives, variables not passed on)."""
    from xcecore.jobenv import resolve_env, submittable

    words = list(ns.command)
    if not words:
        raise CommandError("submit: name the command to run, e.g. xce submit -- ./job.sh")
    warnings: list[str] = []
    given: dict[str, Any] = {}
    text = read_script(words[0])
    if text is not None:
        given, warnings = _directives(words[0], text, _mem_unit(cluster))
        words = script_command(os.path.abspath(words[0]), text, words[1:])
    for name in FIELDS:
        value = getattr(ns, name)
        if value is not None:
            given[name] = value
    given.update(_limits(ns, cluster))
    env, dropped = submittable(resolve_env(_env_option(ns.env, given.pop("env", None)), environ))
    if dropped:
        warnings.append(f"not passing {len(dropped)} variable(s) the controller would refuse: "
                        f"{', '.join(dropped[:10])}{', ...' if len(dropped) > 10 else ''}")
    _split_array(given)
    if given.get("depend") is not None:  # refused here, with its reason, before anything is sent
        from xcecore.depspec import DepError, parse

        try:
            parse(given["depend"])
        except DepError as exc:
            raise ArgError(str(exc)) from None
    ntasks = given.pop("ntasks", 1)
    if ntasks < 1:
        raise ArgError(f"-n/--ntasks must be >= 1, got {ntasks}")
    if len(words) > 1 or text is not None:
        import shlex

        command = shlex.join(words)
    else:
        command = words[0]  # one word is a shell command line: `xce submit -- "a | b"`
    args: dict[str, Any] = {
        "command": command, "resreq": given.pop("resreq", ""), "name": given.pop("name", ""),
        "ntasks": ntasks, "env": env,
        "cwd": os.path.join(cwd, os.path.expanduser(given.pop("cwd", cwd))),
        **given,
    }
    return args, warnings
