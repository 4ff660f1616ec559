"""The commands about xce itself: version, plugins, config, run.

They load the plugins (that is what they are about), so they import what that costs -- when
they run, never when another command does.
"""

from __future__ import annotations

from xcecore.cli.session import CommandError, Session, echo, emit_json
from xcecore.cli.spec import Parsed, arg, command


@command("version", "Print the xce version.")
def version(s: Session, ns: Parsed) -> None:
    from xcecore import __version__

    echo(f"xce {__version__}")


@command("plugins", "List loaded plugins, their distribution, version and hooks.",
         arg("--json", dest="as_json", action="store_true", help="machine-readable output"))
def plugins(s: Session, ns: Parsed) -> None:
    infos = s.plugin_manager().info()
    if ns.as_json:
        emit_json([{"name": i.name, "distribution": i.distribution, "version": i.version,
                    "hooks": list(i.hooks)} for i in infos])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("plugin", "distribution", "version", "hooks")
    for i in infos:
        table.add_row(i.name, i.distribution, i.version, ", ".join(i.hooks))
    Console().print(table)


@command(
    "config", "Inspect configuration: the reference of every key, or a file checked and resolved.",
    arg("what", choices=["reference", "check"],
        help="reference: the configuration reference (Markdown) for the installed plugins; "
             "check: validate the config file and print it with every default filled in (JSON)"),
)
def config(s: Session, ns: Parsed) -> None:
    pm = s.plugin_manager()
    if ns.what == "reference":
        from xcecore.config import CORE_SECTIONS, reference_markdown

        print(reference_markdown([*CORE_SECTIONS, *pm.config_sections()]), end="")
        return
    cfg = s.config()
    emit_json(cfg.as_dict())
    if cfg.unchecked:  # sections of plugins not installed (or disabled) here: kept, not checked
        names = ", ".join(f"[{n}]" for n in sorted(cfg.unchecked))
        echo(f"not checked (no loaded plugin declares them): {names}", err=True)
    for section, keys in sorted(cfg.missing.items()):
        echo(f"[{section}] lacks required {', '.join(keys)}: needed when its role runs", err=True)


@command(
    "run", "Run ROLE (any role a plugin registers) in the foreground.",
    arg("role"),
    arg("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override a config value (TOML syntax), e.g. --set controller.listen=h:7600"),
    arg("--pid-file", dest="pid_file", metavar="FILE",
        help="write the role's pid to FILE while it runs (same as --set log.pid_file=FILE)"),
)
def run(s: Session, ns: Parsed) -> None:
    import json

    from xcecore.runtime import run_role

    overrides = [*ns.overrides, *([f"log.pid_file={json.dumps(ns.pid_file)}"] if ns.pid_file else [])]
    try:
        run_role(ns.role, s.opts.config, overrides, log_level=s.opts.log_level,
                 log_json=s.opts.json_logs)
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        from xcecore.config import ConfigError
        from xcecore.plugins import PluginError
        from xcecore.runtime import RoleError

        if isinstance(exc, ConfigError | PluginError | RoleError | ValueError):
            raise CommandError(str(exc)) from None
        raise


@command(
    "tls", "Make a small cluster CA and host certificates for [tls] (test and small sites).",
    arg("what", choices=["init"],
        help="init: make DIR/ca.pem and ca-key.pem unless DIR holds a CA, then a certificate "
             "for the hosts (DIR/NAME.pem, DIR/NAME-key.pem, keys mode 0600)"),
    arg("dir", metavar="DIR"),
    arg("--host", dest="hosts", action="append", default=[], metavar="HOST",
        help="a host name or IP address the certificate is for (repeatable; default: this "
             "host's name, localhost, 127.0.0.1, ::1)"),
    arg("--name", default="host", help="file name of the certificate (default: host)"),
    arg("--days", type=float, default=825.0, help="validity of the host certificate in days"),
)
def tls(s: Session, ns: Parsed) -> None:
    from pathlib import Path

    from xcecore.tlscerts import CA_CERT, CertError, default_hosts, make_ca, make_host

    directory = Path(ns.dir)
    if ns.days <= 0:
        raise CommandError(f"--days must be positive, got {ns.days:g}")
    try:
        if not (directory / CA_CERT).exists():
            make_ca(directory)
            echo(f"made the cluster CA {directory / CA_CERT} (its key: keep it off the hosts)")
        files = make_host(directory, ns.name, ns.hosts or default_hosts(), days=ns.days)
    except CertError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write in {directory}: {exc.strerror or exc}") from None
    echo(f"made {files.cert} and {files.key} for {', '.join(ns.hosts or default_hosts())}")
    echo(f'[tls]\nca = "{(directory / CA_CERT).resolve()}"\ncert = "{files.cert.resolve()}"\n'
         f'key = "{files.key.resolve()}"')
