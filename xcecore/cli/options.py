"""The ``xce`` command's global options (before the command name) and their parser."""

from __future__ import annotations


class Options:
    """The global options, given before the command name."""

    __slots__ = ("config", "json_logs", "log_level", "timeout", "verbose")

    def __init__(self) -> None:
        self.config: str | None = None
        self.log_level: str | None = None
        self.json_logs: bool | None = None
        self.timeout: float | None = None
        self.verbose = False

    def command_log_level(self) -> str:
        """The level a one-shot command logs at: errors only, warnings with ``-v``, or
        ``--log-level``. (A failover a command rode through is no news to its user.)"""
        return self.log_level or ("WARNING" if self.verbose else "ERROR")


GLOBAL_HELP = """\
options:
  -h, --help         show this help (and the commands) and exit
  --config FILE      TOML config file (or $XCE_CONFIG)
  --log-level LEVEL  TRACE, DEBUG, INFO, WARNING or ERROR
  -v, --verbose      also print warnings (a candidate down, a retry); errors always print
  --json-logs        log one JSON object per line
  --timeout SECONDS  seconds a command waits for the controller (default 15)"""


class UsageError(Exception):
    """The command line is malformed (exit status 2)."""


def parse_global(argv: list[str]) -> tuple[Options, str | None, list[str], bool]:
    """Split ``argv`` into the global options, the command name and its arguments.

    Returns ``(options, name, rest, help)``; ``name`` is None when no command is given.
    """
    opts = Options()
    i, wants_help = 0, False
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word == "-":
            return opts, word, argv[i + 1:], wants_help
        name, eq, inline = word.partition("=")
        if name in ("-h", "--help"):
            wants_help = True
            i += 1
            continue
        if name in ("-v", "--verbose"):
            opts.verbose = True
            i += 1
            continue
        if name == "--json-logs":
            opts.json_logs = True
            i += 1
            continue
        if name not in ("--config", "--log-level", "--timeout"):
            if word == "--":
                return opts, (argv[i + 1] if i + 1 < len(argv) else None), argv[i + 2:], wants_help
            raise UsageError(f"no such option: {word}")
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
        else:
            raise UsageError(f"option {name} requires a value")
        if name == "--config":
            opts.config = value
        elif name == "--log-level":
            opts.log_level = value
        else:
            try:
                opts.timeout = float(value)
            except ValueError:
                raise UsageError(f"--timeout: {value!r} is not a number") from None
    return opts, None, [], wants_help
