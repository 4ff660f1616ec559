"""One TOML config file, validated against the sections that the core and the plugins declare.

Every key has a declared type and default (:class:`xcecore.records.Field`); an unknown key or
a wrong type is an error that names the key path (``cluster.port: expected int, got str``).

One file serves every host: a section no loaded plugin declares (the ``[controller]`` table on
a host that installs only the worker, or a disabled plugin's) is kept aside *unchecked*, and
listed by ``xce config check``; one whose name is close to a declared section's is a typo and
an error (``unknown config section [wroker]; did you mean [worker]?``). A section's required
keys are checked when it is used (:meth:`Config.require`), so a host where a plugin's section
is absent runs every other command.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xcecore.client.settings import CLIENT_KEYS, CLUSTER_KEYS, KeySpec
from xcecore.records import ConfigSection, Field
from xcecore.tls import TLS_KEYS
from xcecore.tls import check_section as _check_tls

ENV_CONFIG = "XCE_CONFIG"


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the key path."""


def _check_site_resources(resources: list[Any]) -> None:
    """Site resources must be valid definitions: checked when the config loads, not at first use."""
    if resources:
        from xcecore.resreq.registry import ResourceRegistry

        ResourceRegistry(resources)


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def _check_cluster(values: dict[str, Any]) -> None:
    _check_site_resources(values["resources"])
    from xcecore.jobspec import mem_unit

    mem_unit(values["unit_for_limits"], what="unit_for_limits")  # a JobSpecError: ValueError
    if values["event_loop"] not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, "
                         f"got {values['event_loop']!r}")
    users = values["service_users"]
    if not all(isinstance(u, str) and u for u in users):
        raise ValueError(f"service_users must be a list of user names, got {users!r}")
    if not values["auth"]:
        raise ValueError("auth must name a method: 'key', 'munge' or a plugin's")


def _check_log(values: dict[str, Any]) -> None:
    if values["repeat_interval"] < 0:
        raise ValueError(f"repeat_interval must be >= 0, got {values['repeat_interval']!r}")
    for key in ("rotation", "retention"):
        value = values[key]
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"{key} must be positive, got {value!r}")


def _check_metrics(section: dict[str, Any]) -> None:
    for role, port in (section.get("ports") or {}).items():
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"ports.{role}: {port!r} is not a TCP port (0-65535; 0: any free one)")


def _fields(keys: Mapping[str, KeySpec]) -> dict[str, Field]:
    """Config fields from a table of ``(types, default, doc)`` owned by another module."""
    return {name: Field(types, default, doc) for name, (types, default, doc) in keys.items()}


_S = (str,)
_B = (bool,)
_L = (list,)

CORE_SECTIONS: tuple[ConfigSection, ...] = (
    ConfigSection(
        "cluster",
        {
            "name": Field(_S, "xce", "cluster name"),
            **_fields(CLUSTER_KEYS),  # how a client reaches the controller (xcecore.client)
            "resources": Field(_L, [], "site resources: [{name, type, consumable?, ...}]"),
            "event_loop": Field(_S, "auto", "role processes' loop: auto (uvloop if installed), "
                                            "uvloop, asyncio"),
            "service_users": Field(_L, [], "users (besides root) whose processes may join as a "
                                           "daemon role (controller, worker, scheduler, "
                                           "apiserver) or a role holding grants"),
        },
        "where the controller candidates are and how to reach them",
        check=_check_cluster,
    ),
    ConfigSection(
        "client",
        _fields(CLIENT_KEYS),
        "connection manager tuning shared by every client role",
    ),
    ConfigSection(
        "tls",
        _fields(TLS_KEYS),
        "TLS between every role and the controller candidates, and HTTPS on the REST API "
        "(on when ca is set)",
        check=_check_tls,
    ),
    ConfigSection(
        "plugins",
        {
            "enable": Field(_L, [], "only these plugins (plus built-ins) are loaded, if set"),
            "disable": Field(_L, [], "plugins never loaded (blocked by name)"),
            "modules": Field(_L, [], "importable modules to register as plugins, uninstalled"),
        },
        "which installed plugins are loaded",
    ),
    ConfigSection(
        "log",
        {
            "level": Field(_S, "INFO", "TRACE, DEBUG, INFO, WARNING, ERROR"),
            "json": Field(_B, False, "one flat JSON object per line (time, level, component, "
                                     "role, host, message, fields), for log shippers"),
            "file": Field(_S, None, "also log to this file"),
            "rotation": Field((str, int), "100 MB", "start a new file at this size ('100 MB', or "
                                                 "bytes), age ('1 day') or time ('00:00')"),
            "retention": Field((str, int), 10, "rotated files kept: a count, or an age ('2 weeks')"),
            "repeat_interval": Field((float, int), 10.0, "a WARNING or worse repeated by one call "
                                                         "site is logged once per this many s, "
                                                         "with a count (0: every time)"),
            "pid_file": Field(_S, None, "write the role's pid here while it runs (also "
                                        "`xce run --pid-file`)"),
        },
        "logging (and the pid file) of every role",
        check=_check_log,
    ),
    ConfigSection(
        "metrics",
        {
            "host": Field(_S, "127.0.0.1", "address the roles' metrics exporters listen on"),
            "ports": Field((dict,), {}, "role -> port of its Prometheus exporter (/metrics), "
                                        "e.g. { controller = 9610, worker = 9611 }; a role not "
                                        "named exports nothing; 0: any free port (logged)"),
        },
        "Prometheus metrics of the roles (xcecore.metrics; off unless a role has a port)",
        check=_check_metrics,
    ),
)


def read_file(path: str | os.PathLike[str] | None) -> tuple[Path | None, dict[str, Any]]:
    """Read the TOML file named by ``path`` or ``$XCE_CONFIG``; no file means an empty config."""
    if path is None:
        path = os.environ.get(ENV_CONFIG) or None
    if path is None:
        return None, {}
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return p, tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=value`` (value in TOML syntax, or a bare string)."""
    name, eq, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not eq or not dot or not section or not key:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def _check_value(path: str, spec: Field, value: Any) -> Any:
    # bool is an int subclass in Python; a TOML `true` is never a valid port.
    if isinstance(value, bool) and bool not in spec.types:
        raise ConfigError(f"{path}: expected {_type_name(spec.types)}, got bool")
    if not isinstance(value, spec.types):
        raise ConfigError(f"{path}: expected {_type_name(spec.types)}, got {type(value).__name__}")
    if float in spec.types and isinstance(value, int):
        return float(value)
    return value


class Config:
    """A validated configuration: every declared section, with defaults filled in.

    ``unchecked`` holds the sections no loaded plugin declares, as written (never used by
    the core); ``missing`` the required keys each declared section lacks (see :meth:`require`).
    """

    def __init__(
        self,
        sections: dict[str, dict[str, Any]],
        path: Path | None = None,
        *,
        unchecked: Mapping[str, Any] | None = None,
        missing: Mapping[str, tuple[str, ...]] | None = None,
        docs: Mapping[str, str] | None = None,
    ) -> None:
        self._sections = sections
        self.path = path
        self.overrides: tuple[str, ...] = ()  # the command line's --set, kept for a reload
        self.unchecked: dict[str, Any] = dict(unchecked or {})
        self.missing: dict[str, tuple[str, ...]] = dict(missing or {})
        self._docs = dict(docs or {})

    def section(self, name: str) -> dict[str, Any]:
        """The named section with defaults applied (an empty dict if nobody declared it)."""
        return self._sections.get(name, {})

    def require(self, name: str) -> dict[str, Any]:
        """The named section, after checking that it has every required key.

        Raises :class:`ConfigError` naming the first missing key (``fakerole.out is required:
        ...``). The runtime calls this for a role's own section before the role connects.
        """
        missing = self.missing.get(name)
        if missing:
            key = missing[0]
            doc = self._docs.get(f"{name}.{key}", "")
            raise ConfigError(f"{name}.{key} is required{': ' + doc if doc else ''}")
        return self.section(name)

    @property
    def cluster(self) -> dict[str, Any]:
        """The ``[cluster]`` section."""
        return self.section("cluster")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """All declared sections, for display and for passing to child processes."""
        return {k: dict(v) for k, v in self._sections.items()}


def validate(
    raw: Mapping[str, Any],
    sections: Iterable[ConfigSection],
    *,
    skip: Iterable[str] = (),
    path: Path | None = None,
) -> Config:
    """Validate ``raw`` against ``sections``.

    Sections nobody declares are kept unchecked (``skip`` names those of disabled plugins,
    which are never mistaken for typos); an undeclared name close to a declared one is an
    error suggesting it. Required keys that are absent are recorded, not raised: see
    :meth:`Config.require`. A section's ``check`` runs only when the file has that section.
    """
    known = {s.name: s for s in sections}
    skipped = set(skip)
    out: dict[str, dict[str, Any]] = {}
    unchecked: dict[str, Any] = {}
    missing: dict[str, tuple[str, ...]] = {}
    docs: dict[str, str] = {}
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{name}: must be a table ([{name}]), got {type(body).__name__}")
        if name in known:
            continue
        close = [] if name in skipped else difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            raise ConfigError(f"unknown config section [{name}]; did you mean [{close[0]}]? "
                              f"known sections: {', '.join(sorted(known))}")
        unchecked[name] = body
    for name, spec in known.items():
        body = raw.get(name, {})
        values: dict[str, Any] = {}
        for key, value in body.items():
            fspec = spec.fields.get(key)
            if fspec is None:
                if spec.open:
                    values[key] = value
                    continue
                choices = ", ".join(sorted(spec.fields)) or "none"
                raise ConfigError(f"unknown key {name}.{key}; keys of [{name}]: {choices}")
            values[key] = _check_value(f"{name}.{key}", fspec, value)
        absent: list[str] = []
        for key, fspec in spec.fields.items():
            if key not in values:
                if fspec.required:
                    absent.append(key)
                    docs[f"{name}.{key}"] = fspec.doc
                    continue
                # Copy mutable defaults so one Config never leaks into another.
                d = fspec.default
                values[key] = list(d) if isinstance(d, list) else dict(d) if isinstance(d, dict) else d
        if absent:
            missing[name] = tuple(absent)
        if spec.check is not None and name in raw:
            try:
                spec.check(values)
            except ValueError as exc:
                raise ConfigError(f"[{name}]: {exc}") from None
        out[name] = values
    return Config(out, path, unchecked=unchecked, missing=missing, docs=docs)


def reference_markdown(sections: Iterable[ConfigSection]) -> str:
    """The configuration reference (every section, key, type, default and meaning) as Markdown.

    ``docs/configuration.md`` is this text for the installed plugins, and a test keeps the two
    equal, so the reference never drifts from the code.
    """
    out = ["# Configuration reference", "",
           "Generated by `xce config reference` from the sections the core and the installed plugins",
           "declare; a test keeps this page equal to its output. Unknown keys and wrong types are",
           "errors that name the key.", ""]
    for sec in sorted(sections, key=lambda s: (s.name not in _CORE_NAMES, s.name)):
        out += [f"## [{sec.name}]", ""]
        if sec.doc:
            out += [sec.doc[0].upper() + sec.doc[1:] + ".", ""]
        if sec.open:
            out += ["Keys beyond those listed are kept as given.", ""]
        if not sec.fields:
            continue
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, f in sec.fields.items():
            default = "(required)" if f.required else "-" if f.default is None else f"`{_toml(f.default)}`"
            doc = f.doc.replace("|", "\\|")
            out.append(f"| `{key}` | {_type_name(f.types)} | {default} | {doc} |")
        out.append("")
    return "\n".join(out)


_CORE_NAMES = {s.name for s in CORE_SECTIONS}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)
