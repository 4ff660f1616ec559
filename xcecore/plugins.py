"""The plugin manager: which plugins load, and a typed facade over their hooks.

Plugins come from two places: built-ins that ship in ``xcecore`` (registered like any other
plugin, and blockable by name) and the ``xce.plugins`` entry-point group, where each role
distribution and each third party declares its plugin module. The config file's
``[plugins] enable``/``disable`` lists and ``XCE_DISABLE_PLUGIN_AUTOLOAD=1`` select the set.

The rest of xce calls hooks only through :class:`PluginManager`'s methods, so every call is
typed and hooks asked once are asked in one place. A distribution adds hooks of its own
through ``xce_addhooks`` (the controller adds its election and store hooks that way) and wraps
them in a typed facade of its own, on top of :attr:`PluginManager.hook`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from xcecore import __version__, hookspecs
from xcecore.entrypoints import ENV_MODULES, ENV_NO_AUTOLOAD, ENV_PLUGINS, PLUGIN_GROUP, EntryPoint, scan

if TYPE_CHECKING:  # imported where used: `xce --help` imports this module for its names only
    import click

    from xcecore.candidates import Candidate
    from xcecore.config import Config
    from xcecore.records import ConfigSection
    from xcecore.role import RoleSpec

ENTRY_POINT_GROUP = PLUGIN_GROUP
ENV_TRACE = "XCE_TRACE_HOOKS"

# Built-in plugins: name -> module. They are plugins like any other, so a site can block one
# (``disable = ["resreq"]``) and register its own replacement.
BUILTINS: dict[str, str] = {
    "rejoin": "xcecore.rejoin",
    "resreq": "xcecore.resreq.plugin",
}


class PluginError(Exception):
    """A plugin is unknown, fails to import, or conflicts with another; the message names it."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``xce plugins`` shows for one loaded plugin."""

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


def installed_plugins() -> dict[str, EntryPoint]:
    """The installed entry-point plugins by name; a name declared twice is an error."""
    found: dict[str, EntryPoint] = {}
    for ep in scan(ENTRY_POINT_GROUP):
        if ep.name in found or ep.name in BUILTINS:
            raise PluginError(
                f"plugin name {ep.name!r} is declared twice ({ep.value} and "
                f"{found[ep.name].value if ep.name in found else BUILTINS[ep.name]})"
            )
        found[ep.name] = ep
    return found


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PluginError(f"plugins.{what} must be a list of plugin names, got {value!r}")
    return list(value)


def select_plugins(
    plugins_section: Mapping[str, Any], available: Iterable[str], *, autoload: bool
) -> list[str]:
    """The names to load, in order, from the ``[plugins]`` section and the autoload switch.

    ``enable`` (when non-empty) keeps only the named entry-point plugins; with autoload off
    only named plugins load at all. ``disable`` blocks plugins, built-ins included. A name
    that is neither installed nor built in is an error listing the choices.
    """
    names = list(available)
    known = [*BUILTINS, *names]
    enable = _names(plugins_section.get("enable", []), "enable")
    disable = _names(plugins_section.get("disable", []), "disable")
    env_named = [n.strip() for n in os.environ.get(ENV_PLUGINS, "").split(",") if n.strip()]
    for name in [*enable, *disable, *env_named]:
        if name not in known:
            raise PluginError(
                f"unknown plugin {name!r}; choose one of: {', '.join(sorted(known))}"
            )
    wanted = enable + [n for n in env_named if n not in enable]
    chosen = [n for n in names if n in wanted] if not autoload or enable else names
    builtins = [n for n in BUILTINS if n not in disable]
    return builtins + [n for n in chosen if n not in disable]


class PluginManager:
    """A pluggy manager with xce's hook specs and a typed method per hook."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._dists: dict[str, tuple[str, str]] = {}
        self._entry_points: dict[str, EntryPoint] = {}
        self.skipped: list[str] = []
        if os.environ.get(ENV_TRACE):
            from loguru import logger  # only when tracing: every `xce` command builds a manager

            self.pm.trace.root.setwriter(lambda msg: logger.debug("hook: {}", msg.rstrip()))
            self.pm.enable_tracing()
        # Historic: every plugin registered from now on is asked at its registration.
        self.pm.hook.xce_addhooks.call_historic(kwargs={"pluginmanager": self})

    @property
    def hook(self) -> pluggy.HookRelay:
        """Every hook by name (``pm.hook.xce_x(...)``), including those added by
        ``xce_addhooks``; a distribution's typed facade for its own hooks calls through this."""
        return self.pm.hook

    def add_hookspecs(self, module_or_class: ModuleType | type) -> None:
        """Add the hook specs of ``module_or_class`` (from an ``xce_addhooks`` implementation)."""
        self.pm.add_hookspecs(module_or_class)

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, plugins_section: Mapping[str, Any] | None = None) -> PluginManager:
        """Build a manager from the installed plugins, selected by ``[plugins]`` and the env."""
        self = cls()
        installed = installed_plugins()
        autoload = os.environ.get(ENV_NO_AUTOLOAD, "") not in ("1", "true", "yes")
        section = plugins_section or {}
        chosen = select_plugins(section, installed, autoload=autoload)
        for name in chosen:
            if name in BUILTINS:
                self.register(_import(name, BUILTINS[name]), name, ("xce", __version__))
            else:
                ep = installed[name]
                try:
                    module = ep.load()
                except Exception as exc:
                    raise PluginError(
                        f"plugin {name!r} ({ep.value}) failed to import: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                self.register(module, name)
                self._entry_points[name] = ep  # distribution and version: read when shown
        # Modules named in [plugins] modules (or $XCE_PLUGIN_MODULES) load without installing:
        # how a plugin author tries a plugin before packaging it.
        env_modules = [m for m in os.environ.get(ENV_MODULES, "").split(",") if m.strip()]
        for module in [*_names(section.get("modules", []), "modules"), *env_modules]:
            self.register(_import(module.strip(), module.strip()), module.strip(), ("-", "-"))
        self.skipped = [n for n in installed if n not in chosen]
        return self

    def register(
        self, plugin: object, name: str, dist: tuple[str, str] = ("-", "-")
    ) -> None:
        """Register ``plugin`` under ``name``; tests use this to add mocks or fakes."""
        if self.pm.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered")
        self.pm.register(plugin, name)
        self._dists[name] = dist

    def info(self) -> list[PluginInfo]:
        """Every loaded plugin with its distribution, version and implemented hooks."""
        out = []
        for name, plugin in self.pm.list_name_plugin():
            hooks = tuple(sorted(c.name for c in self.pm.get_hookcallers(plugin) or ()))
            ep = self._entry_points.get(name)
            if ep is not None:  # reading METADATA costs: only here
                dist, version = ep.distribution()
            else:
                dist, version = self._dists.get(name, ("-", "-"))
            out.append(PluginInfo(name, dist, version, hooks))
        return out

    # ---------------------------------------------------------------- registration hooks
    def roles(self) -> dict[str, RoleSpec]:
        """Every registered role by name; a name registered twice is an error naming both."""
        from xcecore.role import RoleSpec

        roles: dict[str, RoleSpec] = {}
        for specs in self.pm.hook.xce_roles():
            for spec in specs or ():
                if not isinstance(spec, RoleSpec):
                    raise PluginError(f"xce_roles returned {spec!r}, not a RoleSpec")
                if spec.name in roles:
                    owners = self._role_owners(spec.name)
                    raise PluginError(f"role {spec.name!r} is registered twice"
                                      + (f" (by plugins {' and '.join(owners)})" if owners else ""))
                roles[spec.name] = spec
        return roles

    def _role_owners(self, name: str) -> list[str]:
        """The plugins whose ``xce_roles`` answers ``name`` (for the error message only)."""
        owners = []
        for impl in self.pm.hook.xce_roles.get_hookimpls():
            try:
                answer: Any = impl.function()
                if any(getattr(s, "name", None) == name for s in answer or ()):
                    owners.append(repr(impl.plugin_name))
            except Exception:  # a broken plugin must not hide the real error
                continue
        return owners

    def role(self, name: str) -> RoleSpec:
        """The role registered as ``name``; an unknown name is an error listing the choices."""
        roles = self.roles()
        if name not in roles:
            raise PluginError(f"unknown role {name!r}; registered roles: {', '.join(sorted(roles)) or 'none'}")
        return roles[name]

    def join_attributes(self, role: str, config: Config) -> dict[str, Any] | None:
        """What role ``role`` would join with under ``config``, or None if no plugin registers it.

        Builds the role's object for a fresh context (no connection) and asks it, as ``xce
        run`` does: for unit tests and tools. Raises what the role's factory raises.
        """
        from xcecore.role import RoleContext

        spec = self.roles().get(role)
        if spec is None:
            return None
        return dict(spec.factory(RoleContext.create(role, self, config)).join_attributes())

    def config_sections(self) -> list[ConfigSection]:
        """Sections declared by the loaded plugins; duplicates are an error."""
        seen: dict[str, ConfigSection] = {}
        for group in self.pm.hook.xce_config_sections():
            for sec in group or ():
                if sec.name in seen:
                    raise PluginError(f"config section [{sec.name}] is declared twice")
                seen[sec.name] = sec
        return list(seen.values())

    def cli_commands(self, group: click.Group) -> None:
        """Let every plugin add subcommands."""
        self.pm.hook.xce_cli_commands(group=group)

    # ---------------------------------------------------------------- client sessions
    def reconnected(self, client: Any, candidate: Candidate) -> list[Any]:
        """Call ``xce_reconnected``; the implementations' results (awaitables among them)."""
        return list(self.pm.hook.xce_reconnected(client=client, candidate=candidate))

    def connection_state(
        self, client: Any, role: str, state: str, candidate: Candidate | None, detail: str
    ) -> list[Any]:
        """Tell the cross-role observers (``xce_connection_state``); their results, awaitables
        among them, for the caller to await."""
        return list(self.pm.hook.xce_connection_state(
            client=client, role=role, state=state, candidate=candidate, detail=detail))

    def push(self, client: Any, role: str, event: str, seq: int, data: Any) -> list[Any]:
        """Show one push to the cross-role observers (``xce_push``); their results, awaitables
        among them, for the caller to await."""
        return list(self.pm.hook.xce_push(client=client, role=role, event=event, seq=seq, data=data))

    # ---------------------------------------------------------------- pluggable parts
    def resreq_evaluator(self, registry: Any) -> Any:
        """The resource-requirement evaluator for ``registry``."""
        ev = self.pm.hook.xce_resreq_evaluator(registry=registry)
        if ev is None:
            raise PluginError("no plugin provides a resource-requirement evaluator (is 'resreq' disabled?)")
        return ev


def _import(name: str, module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise PluginError(f"plugin {name!r} ({module}) failed to import: {exc}") from exc
