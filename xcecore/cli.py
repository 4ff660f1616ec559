"""The ``xce`` command. Core commands live here; plugins add theirs via ``xce_cli_commands``.

Building the command tree loads the plugins named by the config file, so the config is
found (``--config`` or ``$XCE_CONFIG``) before click parses the rest of the arguments.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from xcecore import __version__


class XceGroup(click.Group):
    """Loads plugins lazily, so ``xce --help`` and plugin commands see the configured set."""

    def plugin_manager(self, ctx: click.Context) -> Any:
        """The loaded plugin manager (loads it once); a load error is one clear line."""
        from xcecore.runtime import load

        obj = ctx.ensure_object(dict)
        if "pm" not in obj:
            try:
                obj["pm"], obj["config"] = load(obj.get("config_path"), obj.get("overrides", ()))
            except Exception as exc:
                raise click.ClickException(str(exc)) from None
            obj["pm"].cli_commands(self)
        return obj["pm"]

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._safe_load(ctx)
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None:
            self._safe_load(ctx)
            found = super().get_command(ctx, cmd_name)
        return found

    def _safe_load(self, ctx: click.Context) -> None:
        self.plugin_manager(ctx.find_root())


def _early_config(argv: list[str]) -> str | None:
    # click parses group options after resolving the subcommand's lookup for --help; find
    # --config early so plugin loading uses the right file.
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return os.environ.get("XCE_CONFIG") or None


@click.group(cls=XceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="FILE", help="TOML config file (or $XCE_CONFIG).")
@click.option("--log-level", default=None, help="TRACE, DEBUG, INFO, WARNING or ERROR.")
@click.option("--json-logs", is_flag=True, default=None, help="Log one JSON object per line.")
@click.option("--timeout", type=float, default=None, help="Seconds a command waits for the controller.")
@click.pass_context
def main(
    ctx: click.Context, config_path: str | None, log_level: str | None, json_logs: bool | None, timeout: float | None
) -> None:
    """xce: cluster workload management with controller high availability."""
    obj = ctx.ensure_object(dict)
    obj["timeout"] = timeout
    obj.setdefault("config_path", config_path)
    obj["log_level"] = log_level
    obj["log_json"] = json_logs
    # Commands print results, not logs: only warnings and errors unless asked (`xce run`
    # sets up the role's own logging).
    from xcecore.log import setup_logging

    setup_logging("xce", log_level or "WARNING", json=bool(json_logs))


@main.command()
def version() -> None:
    """Print the xce version."""
    click.echo(f"xce {__version__}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def plugins(ctx: click.Context, as_json: bool) -> None:
    """List loaded plugins, their distribution, version and hooks."""
    root = ctx.find_root()
    assert isinstance(root.command, XceGroup)
    infos = root.command.plugin_manager(root).info()
    if as_json:
        import orjson

        rows = [{"name": i.name, "distribution": i.distribution, "version": i.version,
                 "hooks": list(i.hooks)} for i in infos]
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("plugin", "distribution", "version", "hooks")
    for i in infos:
        table.add_row(i.name, i.distribution, i.version, ", ".join(i.hooks))
    Console().print(table)


@main.group()
def config() -> None:
    """Inspect configuration: the reference of every key, or a file checked and resolved."""


@config.command("reference")
@click.pass_context
def config_reference(ctx: click.Context) -> None:
    """Print the configuration reference (Markdown) for the installed plugins."""
    from xcecore.config import CORE_SECTIONS, reference_markdown

    root = ctx.find_root()
    assert isinstance(root.command, XceGroup)
    pm = root.command.plugin_manager(root)
    click.echo(reference_markdown([*CORE_SECTIONS, *pm.config_sections()]), nl=False)


@config.command("check")
@click.pass_context
def config_check(ctx: click.Context) -> None:
    """Validate the config file and print it with every default filled in (JSON)."""
    import orjson

    root = ctx.find_root()
    assert isinstance(root.command, XceGroup)
    root.command.plugin_manager(root)
    cfg = root.ensure_object(dict)["config"]
    click.echo(orjson.dumps(cfg.as_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    if cfg.unchecked:  # sections of plugins not installed (or disabled) here: kept, not checked
        names = ", ".join(f"[{n}]" for n in sorted(cfg.unchecked))
        click.echo(f"not checked (no loaded plugin declares them): {names}", err=True)
    for section, keys in sorted(cfg.missing.items()):
        click.echo(f"[{section}] lacks required {', '.join(keys)}: needed when its role runs", err=True)


@main.command(context_settings={"ignore_unknown_options": False})
@click.argument("role")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a config value (TOML syntax), e.g. --set controller.listen=h:7600")
@click.pass_context
def run(ctx: click.Context, role: str, overrides: tuple[str, ...]) -> None:
    """Run ROLE (any role a plugin registers) in the foreground."""
    from xcecore.runtime import run_role

    obj = ctx.ensure_object(dict)
    try:
        run_role(role, obj.get("config_path"), overrides,
                 log_level=obj.get("log_level"), log_json=obj.get("log_json"))
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        from xcecore.config import ConfigError
        from xcecore.plugins import PluginError
        from xcecore.runtime import RoleError

        if isinstance(exc, ConfigError | PluginError | RoleError | ValueError):
            raise click.ClickException(str(exc)) from None
        raise


def cli(argv: list[str] | None = None) -> None:
    """Entry point: ``xce`` (console script) and ``python -m xcecore``."""
    args = sys.argv[1:] if argv is None else argv
    main.main(args=args, prog_name="xce", obj={"config_path": _early_config(args)})
