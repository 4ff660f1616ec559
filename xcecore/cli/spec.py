"""How a built-in command is declared and how its command line is parsed.

Built-in commands register here when their module is imported (:func:`command`), each with
its arguments (:func:`arg`, keyword names as in argparse). :func:`parse` turns a command
line into a :class:`Parsed` namespace and :func:`help_text` writes the ``--help`` page.

This is a small parser of its own rather than argparse, on purpose: argparse and the
``gettext``/``locale`` lookups it makes cost a one-shot command ~5 ms of its ~40 ms here.
It does what the commands use: short and long options (``-q X``, ``--queue X``,
``--queue=X``, ``-qX``), flags, repeated options, typed values with choices, required
options, positionals (one, ``*``, ``+``, or the rest of the line), and ``--``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    from xcecore.cli.session import Session


class Arg:
    """One argument: an option (``flags`` start with ``-``) or a positional (one name)."""

    __slots__ = ("action", "choices", "default", "dest", "flags", "help", "metavar", "nargs",
                 "required", "type")

    def __init__(self, flags: tuple[str, ...], *, dest: str | None = None, help: str = "",
                 type: Callable[[str], Any] | None = None, choices: tuple[str, ...] | list[str] | None = None,
                 default: Any = None, action: str | None = None, nargs: str | None = None,
                 required: bool = False, metavar: str | None = None) -> None:
        if action not in (None, "store_true", "append"):
            raise ValueError(f"unknown action {action!r}")
        self.flags = flags
        long = next((f for f in flags if f.startswith("--")), flags[0])
        self.dest = dest or long.lstrip("-").replace("-", "_")
        self.help = help
        self.type = type
        self.choices = tuple(choices) if choices is not None else None
        self.action = action
        self.default: Any = ([] if default is None else default) if action == "append" else (
            False if action == "store_true" else default)
        self.nargs = nargs
        self.required = required
        self.metavar = metavar or self.dest.upper()

    def initial(self) -> Any:
        """The value before the command line is read (a fresh list for ``append``)."""
        return list(self.default) if self.action == "append" else self.default

    @property
    def is_option(self) -> bool:
        return self.flags[0].startswith("-")

    def convert(self, text: str) -> Any:
        """``text`` as this argument's value: typed, and one of the choices if it has any."""
        value: Any = text
        if self.type is not None:
            try:
                value = self.type(text)
            except ValueError as exc:
                detail = str(exc) if self.type not in (int, float) else (
                    f"invalid {self.type.__name__} value: {text!r}")
                raise ArgError(f"argument {self.name}: {detail}") from None
        if self.choices is not None and value not in self.choices:
            raise ArgError(f"argument {self.name}: invalid choice: {text!r} "
                           f"(choose from {', '.join(self.choices)})")
        return value

    @property
    def name(self) -> str:
        return "/".join(self.flags) if self.is_option else self.dest


def arg(*flags: str, **kwargs: Any) -> Arg:
    """An argument of a built-in command (keywords: dest, help, type, choices, default,
    action ``store_true``/``append``, nargs ``*``/``+``/``...`` (the rest), required, metavar)."""
    return Arg(flags, **kwargs)


class Parsed:
    """The parsed arguments of a command, as attributes (like argparse's Namespace)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # only for names no argument declared
        raise AttributeError(f"no argument {name!r}")

    def __repr__(self) -> str:
        return f"Parsed({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


Runner = Callable[["Session", Parsed], "int | None"]


class Command:
    """A built-in command: ``run(session, parsed)`` returns the exit status (None: 0).

    A plain class, not a ``typing.NamedTuple``: every one-shot command imports this module,
    and ``typing`` costs ~7 ms of its start-up."""

    __slots__ = ("args", "epilog", "help", "name", "run")

    def __init__(self, name: str, help: str, args: tuple[Arg, ...], run: Runner,
                 epilog: str = "") -> None:
        self.name = name
        self.help = help
        self.args = args
        self.run = run
        self.epilog = epilog

    def __repr__(self) -> str:
        return f"Command({self.name!r})"


COMMANDS: dict[str, Command] = {}
"""Every built-in command (and the one-shot plugin commands imported so far) by name, in
registration order."""


def command(name: str, help: str, *args: Arg, epilog: str = "") -> Callable[[Runner], Runner]:
    """Register the decorated function as the command ``name`` (a built-in, or a plugin's
    one-shot command: see :mod:`xcecore.cli`)."""

    def register(run: Runner) -> Runner:
        if name in COMMANDS:
            raise RuntimeError(f"command {name!r} is declared twice")
        COMMANDS[name] = Command(name, help, args, run, epilog)
        return run

    return register


class ArgError(Exception):
    """A command line its command does not accept (usage error: exit status 2)."""


class HelpRequested(Exception):
    """``-h``/``--help`` was given: print the help and exit 0."""


def parse(cmd: Command, argv: list[str]) -> Parsed:
    """Parse ``argv`` (the words after the command name) for ``cmd``.

    Raises :class:`ArgError` for a bad command line, :class:`HelpRequested` for ``--help``.
    """
    options = {f: a for a in cmd.args if a.is_option for f in a.flags}
    positionals = [a for a in cmd.args if not a.is_option]
    values: dict[str, Any] = {a.dest: a.initial() for a in cmd.args}
    seen: set[str] = set()
    words: list[str] = []
    i = 0
    rest_at = next((n for n, a in enumerate(positionals) if a.nargs == "..."), None)
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            words += argv[i:]
            break
        if word in ("-h", "--help"):
            raise HelpRequested()
        if not word.startswith("-") or word == "-":
            words.append(word)
            if rest_at is not None and len(words) > rest_at:
                words += argv[i:]  # the rest of the line belongs to the command it names
                break
            continue
        if word.startswith("--"):
            flag, eq, inline = word.partition("=")
            value = inline if eq else None
        else:
            flag, value = word[:2], (word[2:] or None)
        spec = options.get(flag)
        if spec is None:
            raise ArgError(f"unrecognized option: {word}")
        seen.add(spec.dest)
        if spec.action == "store_true":
            if value is not None:
                raise ArgError(f"option {flag} takes no value")
            values[spec.dest] = True
            continue
        if value is None:
            if i >= len(argv):
                raise ArgError(f"option {flag} requires a value")
            value = argv[i]
            i += 1
        converted = spec.convert(value)
        if spec.action == "append":
            values[spec.dest].append(converted)
        else:
            values[spec.dest] = converted
    for spec in options.values():
        if spec.required and spec.dest not in seen:
            raise ArgError(f"option {'/'.join(spec.flags)} is required")
    _place(positionals, words, values)
    return Parsed(**values)


def _place(positionals: list[Arg], words: list[str], values: dict[str, Any]) -> None:
    """Hand the positional ``words`` to the positional arguments, in order."""
    left = list(words)
    for n, spec in enumerate(positionals):
        later = sum(1 for a in positionals[n + 1:] if a.nargs in (None, "+"))
        if spec.nargs in ("*", "+", "..."):
            take = max(0, len(left) - later) if spec.nargs != "..." else len(left)
            if spec.nargs == "+" and take == 0:
                raise ArgError(f"argument {spec.dest}: expected at least one value")
            chunk, left = left[:take], left[take:]
            values[spec.dest] = chunk if spec.nargs == "..." else [spec.convert(w) for w in chunk]
        else:
            if not left:
                raise ArgError(f"argument {spec.dest} is required")
            values[spec.dest] = spec.convert(left.pop(0))
    if left:
        raise ArgError(f"unrecognized arguments: {' '.join(left)}")


def terminal_width() -> int:
    """The width help text wraps at: ``$COLUMNS``, the terminal's, or 80."""
    try:
        return max(40, int(os.environ["COLUMNS"]) - 2)
    except (KeyError, ValueError):
        pass
    try:
        return max(40, os.get_terminal_size(sys.stdout.fileno()).columns - 2)
    except (OSError, ValueError):
        return 78


def usage(cmd: Command) -> str:
    """``usage: xce NAME [OPTIONS] ARGS``."""
    words = [f"xce {cmd.name}"]
    if any(a.is_option for a in cmd.args):
        words.append("[OPTIONS]")
    for a in cmd.args:
        if a.is_option and a.required:
            words.append(f"{a.flags[0]} {a.metavar}")
        elif not a.is_option:
            shown = "{" + ",".join(a.choices) + "}" if a.choices else a.metavar
            words.append({None: shown, "*": f"[{shown}...]", "+": f"{shown}...",
                          "...": f"[--] {shown}..."}[a.nargs])
    return "usage: " + " ".join(words)


def help_text(cmd: Command) -> str:
    """The ``xce NAME --help`` page."""
    import textwrap

    width = terminal_width()
    rows: list[tuple[str, str]] = []
    for a in [a for a in cmd.args if not a.is_option]:
        shown = "{" + ",".join(a.choices) + "}" if a.choices else a.metavar
        rows.append((shown, a.help))
    options = [(", ".join(a.flags) + ("" if a.action == "store_true" else f" {a.metavar}"),
                a.help + (f" (one of: {', '.join(a.choices)})" if a.choices else ""))
               for a in cmd.args if a.is_option]
    options.append(("-h, --help", "show this help and exit"))
    left = min(30, max(len(name) for name, _ in [*rows, *options]) + 4)
    out = [usage(cmd), "", textwrap.fill(cmd.help, width)]

    def block(title: str, entries: list[tuple[str, str]]) -> None:
        out.extend(["", f"{title}:"])
        for name, text in entries:
            lead = f"  {name}"
            body = textwrap.wrap(text, max(20, width - left)) or [""]
            if len(lead) + 2 > left:
                out.append(lead)
                out.extend(" " * left + line for line in body)
            else:
                out.append(lead.ljust(left) + body[0])
                out.extend(" " * left + line for line in body[1:])

    if rows:
        block("arguments", rows)
    block("options", options)
    if cmd.epilog:
        out.extend(["", cmd.epilog])
    return "\n".join(out)
