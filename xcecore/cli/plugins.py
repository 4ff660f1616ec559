"""Commands that plugins add through ``xce_cli_commands``: click commands, loaded on demand.

Only a name that is not built in (``xce up``) loads the plugins and click; a built-in command
never does. ``xce --help`` lists the plugin commands from a cache (``$XDG_CACHE_HOME/xce``)
keyed on the installed plugin distributions, the ``[plugins]`` section and the plugin
environment variables, so only the first listing after an install or upgrade pays for loading
them (~100 ms here). Editable installs and uninstalled ``[plugins] modules`` are never cached:
their code changes without a reinstall.
"""

from __future__ import annotations

from xcecore.cli.options import Options
from xcecore.cli.spec import COMMANDS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Any

    import click

    from xcecore.entrypoints import EntryPoint


def _plugins_section(path: str | None) -> dict[str, Any]:
    """The raw ``[plugins]`` table of the config file (for listing plugin commands)."""
    import os

    from xcecore.client.settings import SettingsError, read_raw

    path = path or os.environ.get("XCE_CONFIG") or None
    if path is None:
        return {}
    try:
        section = read_raw(path).get("plugins", {})
    except SettingsError:
        return {}  # the command that runs reports it; a listing does not
    return section if isinstance(section, dict) else {}


def installed_entry_points() -> list[EntryPoint]:
    """The installed plugins' entry points, read without the plugin manager (which imports
    pluggy, dataclasses and inspect: ~20 ms of ``xce --help``). A broken installation (a name
    declared twice) is the listing's to report: it loads the plugins when the cache misses,
    and a listing that fails is not cached."""
    from xcecore.entrypoints import PLUGIN_GROUP, scan

    return scan(PLUGIN_GROUP)


def _cache_name(plugins_section: dict[str, Any]) -> str | None:
    """The user-cache entry (:mod:`xcecore.usercache`) for this set of plugins' listing, or
    None when it must not be cached."""
    import json
    import os

    from xcecore import __version__
    from xcecore.auth.key import sha256_constructor  # not hashlib: it initialises OpenSSL
    from xcecore.entrypoints import ENV_MODULES, ENV_NO_AUTOLOAD, ENV_PLUGINS, fingerprint

    if plugins_section.get("modules") or os.environ.get(ENV_MODULES):
        return None
    eps = installed_entry_points()
    if any(ep.editable for ep in eps):
        return None

    key = json.dumps([__version__, fingerprint(eps), [(e.name, e.value) for e in eps],
                      plugins_section, os.environ.get(ENV_PLUGINS, ""),
                      os.environ.get(ENV_NO_AUTOLOAD, "")], sort_keys=True, default=str)
    return f"commands-{sha256_constructor()(key.encode()).hexdigest()[:20]}.json"


def plugin_listing(opts: Options) -> list[tuple[str, str]]:
    """Every plugin command's name and one-line help, sorted; cached as the module says."""
    import json

    from xcecore import usercache

    section = _plugins_section(opts.config)
    name = _cache_name(section)
    cached = usercache.read(name) if name is not None else None
    if cached is not None:
        try:
            return [(str(n), str(h)) for n, h in json.loads(cached)]
        except (ValueError, TypeError):
            pass  # damaged: build it again
    group, _ = plugin_group(opts, listing=True)
    found = [(n, c.get_short_help_str(limit=200)) for n, c in sorted(group.commands.items())]
    if name is not None:
        usercache.write(name, json.dumps(found).encode())
    return found


def plugin_group(opts: Options, *, listing: bool) -> tuple[click.Group, dict[str, Any]]:
    """A click group holding every plugin command, and the ``obj`` its commands get.

    ``listing``: only to list them (the plugins the config selects; the config itself is not
    validated). Otherwise the whole config is loaded and validated, as for any role, and
    ``obj`` carries ``pm``, ``config``, ``config_path``, ``timeout``, ``log_level`` and
    ``log_json``. A plugin command named like a built-in one is ignored: built-ins win.
    """
    import click

    from xcecore.plugins import PluginManager

    obj: dict[str, Any] = {"config_path": opts.config, "timeout": opts.timeout,
                           "log_level": opts.log_level, "log_json": opts.json_logs}
    if listing:
        pm = PluginManager.load(_plugins_section(opts.config))
    else:
        from xcecore.runtime import load

        pm, obj["config"] = load(opts.config)
    obj["pm"] = pm
    group = click.Group("xce")
    pm.cli_commands(group)
    for name in [n for n in group.commands if n in COMMANDS]:
        del group.commands[name]
    return group, obj


def run_plugin_command(opts: Options, name: str, args: list[str]) -> int:
    """Run plugin command ``name`` with ``args``; its exit status."""
    import click

    from xcecore.cli.session import CommandError
    from xcecore.log import setup_logging

    # Commands print results, not logs: only errors unless asked (-v, --log-level).
    setup_logging("xce", opts.command_log_level(), json=bool(opts.json_logs))
    try:
        group, obj = plugin_group(opts, listing=False)
    except Exception as exc:  # a config or plugin error: one line
        raise CommandError(str(exc)) from None
    cmd = group.commands.get(name)
    if cmd is None:
        known = sorted([*COMMANDS, *group.commands])
        raise CommandError(f"no such command {name!r}; commands: {', '.join(known)}")
    try:
        cmd.main(args=args, prog_name=f"xce {name}", obj=obj, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        import sys

        sys.stderr.write("Aborted!\n")
        return 1
    return 0
