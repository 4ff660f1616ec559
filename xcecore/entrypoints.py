"""Entry points of one group, read straight from the installed distributions' metadata.

``importlib.metadata`` costs 20-25 ms to import here (its email-based metadata parser, zipfile,
pathlib) before it reads a single file, and every ``xce`` command that loads plugins paid it.
Plugins only need ``entry_points.txt``, a small INI file in each ``*.dist-info`` (or
``*.egg-info``) directory on ``sys.path``; reading those costs about a millisecond. The rules
are importlib.metadata's: the first distribution of a (normalised) name on ``sys.path`` wins,
later copies are shadowed. Distribution name and version are read from ``METADATA`` only when
asked (``xce plugins``).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from types import ModuleType

PLUGIN_GROUP = "xce.plugins"
"""The entry-point group of plugins (:mod:`xcecore.plugins`); with the variables below, what
decides which plugins load -- here, so that ``xce --help`` keys its cache of the plugin
commands on them without importing the plugin manager (pluggy, dataclasses, inspect)."""
ENV_NO_AUTOLOAD = "XCE_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS = "XCE_PLUGINS"
ENV_MODULES = "XCE_PLUGIN_MODULES"


class EntryPoint(tuple[str, str, str, str]):
    """One ``name = module[:attr]`` line of a group, and the metadata directory it came from.

    A ``(name, value, group, metadata_dir)`` tuple with named fields, written out: a dataclass
    (with ``inspect``) costs a one-shot plugin command ~13 ms to import here, a fifth of its
    start-up, and ``typing.NamedTuple`` ~7 ms for ``typing``."""

    __slots__ = ()

    def __new__(cls, name: str, value: str, group: str, metadata_dir: str) -> EntryPoint:
        return super().__new__(cls, (name, value, group, metadata_dir))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def value(self) -> str:
        return self[1]

    @property
    def group(self) -> str:
        return self[2]

    @property
    def metadata_dir(self) -> str:
        return self[3]

    def __repr__(self) -> str:
        return (f"EntryPoint(name={self[0]!r}, value={self[1]!r}, group={self[2]!r}, "
                f"metadata_dir={self[3]!r})")

    def load(self) -> ModuleType | object:
        """Import the module (and the attribute, when the value names one)."""
        module_name, _, attr = self.value.partition(":")
        obj: object = importlib.import_module(module_name.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj

    def distribution(self) -> tuple[str, str]:
        """(name, version) from the distribution's ``METADATA``/``PKG-INFO`` headers."""
        name = version = "-"
        for fname in ("METADATA", "PKG-INFO"):
            try:
                with open(os.path.join(self.metadata_dir, fname), encoding="utf-8") as fh:
                    for line in fh:
                        if not line.strip():
                            break  # the headers end at the first blank line
                        key, _, val = line.partition(":")
                        if key == "Name":
                            name = val.strip()
                        elif key == "Version":
                            version = val.strip()
                return name, version
            except OSError:
                continue
        return name, version

    @property
    def editable(self) -> bool:
        """Installed with ``pip install -e`` (PEP 660: ``direct_url.json`` says so)."""
        try:
            with open(os.path.join(self.metadata_dir, "direct_url.json"), encoding="utf-8") as fh:
                return '"editable": true' in fh.read().replace("'", '"')
        except OSError:
            return False


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _metadata_dirs(paths: Iterable[str]) -> Iterable[tuple[str, str]]:
    """(normalised distribution name, metadata directory) in ``sys.path`` order."""
    for path in paths:
        try:
            names = sorted(os.listdir(path or "."))
        except OSError:  # missing, a file, a zip: plugins are never installed as eggs here
            continue
        for entry in names:
            if entry.endswith(".dist-info"):  # NAME-VERSION.dist-info
                yield _normalise(entry[:-10].rsplit("-", 1)[0]), os.path.join(path or ".", entry)
            elif entry.endswith(".egg-info"):  # NAME.egg-info or NAME-VERSION[-pyX.Y].egg-info
                yield _normalise(entry[:-9].split("-", 1)[0]), os.path.join(path or ".", entry)


def parse_group(text: str, group: str) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of section ``[group]`` in an ``entry_points.txt``."""
    found: list[tuple[str, str]] = []
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == group and "=" in line:
            name, _, value = line.partition("=")
            found.append((name.strip(), value.strip()))
    return found


def scan(group: str, paths: Iterable[str] | None = None) -> list[EntryPoint]:
    """Every entry point of ``group`` from the distributions on ``paths`` (``sys.path``)."""
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for dist, directory in _metadata_dirs(sys.path if paths is None else paths):
        if dist in seen:
            continue  # shadowed by an earlier copy on the path, as importlib.metadata does
        seen.add(dist)
        try:
            with open(os.path.join(directory, "entry_points.txt"), encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            continue
        out.extend(EntryPoint(n, v, group, directory) for n, v in parse_group(text, group))
    return out


def fingerprint(eps: Iterable[EntryPoint]) -> str:
    """Changes whenever one of these distributions is installed again, upgraded or removed."""
    parts = []
    for ep in eps:
        try:
            parts.append(f"{ep.metadata_dir}:{os.stat(ep.metadata_dir).st_mtime_ns}")
        except OSError:
            parts.append(f"{ep.metadata_dir}:gone")
    return "|".join(sorted(set(parts)))
