"""The ``xce`` command.

Start-up time is the design constraint: ``xce jobs`` and ``xce submit`` must answer like
``bjobs`` and ``bsub`` (well under 60 ms here from a regular install). So a command is
found by name before anything heavy is imported:

- the **built-in commands** (:mod:`xcecore.cli.commands`: submit, jobs, hosts, ...;
  :mod:`xcecore.cli.core`: version, plugins, config, run) are declared in
  :mod:`xcecore.cli.spec` and reach the controller through
  :class:`xcecore.client.OneShotClient` -- no event loop, no plugins, no entry-point scan;
- a plugin distribution's **one-shot commands** are declared the same way, in a module its
  ``xce.commands`` entry points name (``hist = "xce_accounting.commands"``: the entry point's
  name is the command's): only that module is imported, no plugin manager, no config load --
  a command that only talks to the controller answers as fast as a built-in one;
- any **other name** is a plugin command, added through ``xce_cli_commands`` as a click
  command (:mod:`xcecore.cli.plugins`): only then are the plugins loaded (for commands that
  need them, such as ``xce up``).

``xce --help`` lists both (the plugins' from a cache, see :mod:`xcecore.cli.plugins`). Global options come before
the command name.
"""

from __future__ import annotations

import sys

from xcecore.cli.options import GLOBAL_HELP, Options, UsageError, parse_global
from xcecore.cli.spec import COMMANDS, ArgError, HelpRequested, help_text, parse, usage

COMMAND_GROUP = "xce.commands"
"""The entry-point group of plugins' one-shot commands (``NAME = module``)."""


def _builtins() -> None:
    """Register every built-in command (cheap modules: no heavy imports at their top)."""
    from xcecore.cli import commands, core  # noqa: F401  # importing them registers them


def _one_shot(name: str | None) -> list[str]:
    """Import the modules of the plugins' one-shot commands (``name``'s only, or all of them
    for a listing); problems, one line each, for the listing."""
    from xcecore.entrypoints import scan

    problems = []
    for ep in scan(COMMAND_GROUP):
        if name is not None and ep.name != name:
            continue
        try:
            ep.load()
        except Exception as exc:  # a broken distribution names itself, and hides nothing else
            dist = "-".join(ep.distribution())
            problems.append(f"{ep.name} ({dist}): {ep.value} cannot be imported: {exc}")
            if name is not None:
                from xcecore.cli.session import CommandError

                raise CommandError(f"command {name!r} from {dist}: {ep.value} cannot be imported: "
                                   f"{exc}") from None
        if ep.name not in COMMANDS:
            problems.append(f"{ep.name} ({ep.value}): the module declares no command {ep.name!r}")
    return problems


def main_help(opts: Options) -> str:
    """The top-level help: usage, global options, built-in and plugin commands."""
    _builtins()
    builtin = list(COMMANDS.values())
    problems = _one_shot(None)
    found = [(c.name, c.help) for c in COMMANDS.values() if c not in builtin]
    try:
        from xcecore.cli.plugins import plugin_listing

        found += plugin_listing(opts)
    except Exception as exc:  # a broken plugin must not hide the built-in commands
        problems.append(f"unavailable ({exc})")
    width = max(len(n) for n in [*COMMANDS, *(n for n, _ in found)]) + 2
    lines = ["usage: xce [OPTIONS] COMMAND [ARGS]...", "",
             "xce: cluster workload management with controller high availability.", "",
             GLOBAL_HELP, "", "commands:"]
    lines += [f"  {c.name:<{width}}{c.help}" for c in builtin]
    if found or problems:
        lines += ["", f"plugin commands: {'; '.join(problems)}".rstrip()]
        lines += [f"  {n:<{width}}{text}" for n, text in sorted(found)]
    lines += ["", "Run `xce COMMAND --help` for the options of a command."]
    return "\n".join(lines)


_PLAIN_EXIT = [False]
"""Set by :func:`run` when a plugin's click command ran (it may leave threads, atexit
handlers or buffered logs that the interpreter's normal shutdown must see to)."""


def run(argv: list[str]) -> int:
    """Run the ``xce`` command line ``argv`` (without the program name); the exit status."""
    from xcecore.cli.session import CommandError

    try:
        opts, name, rest, wants_help = parse_global(argv)
    except UsageError as exc:
        sys.stderr.write(f"usage: xce [OPTIONS] COMMAND [ARGS]...\nxce: error: {exc}\n")
        return 2
    if name is None:
        sys.stdout.write(main_help(opts) + "\n")
        return 0
    if wants_help:  # `xce --help jobs`
        rest = ["--help"]
    _builtins()
    try:
        cmd = COMMANDS.get(name)
        if cmd is None:
            _one_shot(name)
            cmd = COMMANDS.get(name)
        if cmd is None:
            from xcecore.cli.plugins import run_plugin_command

            _PLAIN_EXIT[0] = True
            return run_plugin_command(opts, name, rest)
        from xcecore.cli.session import Session

        try:
            ns = parse(cmd, rest)
        except HelpRequested:
            sys.stdout.write(help_text(cmd) + "\n")
            return 0
        except ArgError as exc:
            sys.stderr.write(f"{usage(cmd)}\nTry 'xce {name} --help' for help.\n\nError: {exc}\n")
            return 2
        session = Session(opts)
        try:
            return cmd.run(session, ns) or 0
        except ArgError as exc:  # an option's value the command itself found malformed
            sys.stderr.write(f"{usage(cmd)}\nTry 'xce {name} --help' for help.\n\nError: {exc}\n")
            return 2
        finally:
            session.close()
    except CommandError as exc:
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


def _shutdown_has_work() -> bool:
    """Whether the interpreter's shutdown may have something to do: an ``atexit`` handler
    (registering one imports :mod:`atexit`, which a one-shot command never does; ``xce run``'s
    role removes its pid file so) or a thread still running."""
    threading = sys.modules.get("threading")
    return "atexit" in sys.modules or (threading is not None and threading.active_count() > 1)


def cli(argv: list[str] | None = None) -> None:
    """Entry point: ``xce`` (console script) and ``python -m xcecore``.

    A one-shot command leaves at once when it is done: its output flushed, then
    ``os._exit``, unless the shutdown has work (:func:`_shutdown_has_work`). The interpreter's
    own shutdown -- tearing down every imported module -- cost 7-10 ms of a ~60 ms
    ``xce jobs`` on a quiet 2-core machine, and a one-shot command leaves it nothing to do:
    no threads, no atexit handlers, its socket closed with the process.
    A reader that went away (``xce jobs | head -1``) ends the command quietly, status 141 as
    for a writer a shell saw killed by SIGPIPE. Plugin (click) commands exit the normal way.
    """
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # the reader left: a shell's status for a writer killed by SIGPIPE
        code = 141
    if _PLAIN_EXIT[0] or _shutdown_has_work():
        sys.exit(code)
    import os

    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  # contextlib.suppress would import contextlib
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left / closed (not contextlib: ~1 ms)
            pass
    os._exit(code)
