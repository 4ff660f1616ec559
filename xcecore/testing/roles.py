"""Role objects built in-process, for unit tests of a role (no controller, no connection)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xcecore.config import CORE_SECTIONS, validate
from xcecore.plugins import PluginManager
from xcecore.role import Role, RoleContext


def make_role(pm: PluginManager, role: str, raw_config: Mapping[str, Any] | None = None, *,
              client: Any = None) -> Role:
    """The object of ``role`` as ``xce run`` builds it, from ``raw_config`` (a parsed file).

    The config is validated against the core's and ``pm``'s sections; the role's required
    keys are checked; ``client`` (a fake, or None) is put in ``ctx.client``. Nothing connects.
    """
    from xcecore.runtime import build_role

    config = validate(dict(raw_config or {}), [*CORE_SECTIONS, *pm.config_sections()])
    ctx = RoleContext.create(role, pm, config)
    ctx.client = client
    return build_role(pm.role(role), ctx)
