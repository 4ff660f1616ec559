"""Config records: the keys (:class:`Field`) and sections (:class:`ConfigSection`) plugins declare.

The role records (``RoleSpec``, ``Monitor``, ``Subscription``) are in :mod:`xcecore.role`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Field:
    """One configuration key: its type(s), default, and what it means."""

    types: tuple[type, ...]
    default: Any = None
    doc: str = ""
    required: bool = False


@dataclass(frozen=True, slots=True)
class ConfigSection:
    """A top-level ``[name]`` table of the config file and its keys.

    Keys not listed are errors unless ``open`` is true (a free-form table such as site
    resources). ``check`` validates the whole section further (raise ``ValueError``); it runs
    only when the file has the section, and sees the keys given plus the defaults (a missing
    required key is absent). Required keys are checked when the section is used
    (:meth:`xcecore.config.Config.require`): for a role's own section, before it connects.
    """

    name: str
    fields: Mapping[str, Field] = field(default_factory=dict)
    doc: str = ""
    open: bool = False
    check: Callable[[dict[str, Any]], None] | None = None
