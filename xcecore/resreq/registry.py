"""The resources a requirement may name: LSF's built-ins plus site-defined ones.

The registry is immutable once built; its ``version`` is a digest of its content, so two
registries with the same resources share a version (and compiled-requirement cache entries)
and any change of content changes it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["BOOL", "NUMERIC", "RESERVED_NAMES", "STRING", "Resource", "ResourceRegistry"]

ResourceType = Literal["bool", "numeric", "string"]
BOOL: Final = "bool"
NUMERIC: Final = "numeric"
STRING: Final = "string"

_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Words the language itself uses; a resource with one of these names could never be named.
RESERVED_NAMES: Final = frozenset(
    {"and", "or", "not", "defined", "duration", "decay", "hosts", "ptile"}
)


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource: its type, unit, whether jobs can reserve it, and its best-first order.

    ``increasing`` is True when a larger value is better (``mem``), False when smaller is
    better (``r1m``); ``order[res]`` sorts best first.
    """

    name: str
    type: ResourceType
    unit: str | None = None
    consumable: bool = False
    increasing: bool = True
    builtin: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description of the resource."""
        return {
            "name": self.name,
            "type": self.type,
            "unit": self.unit,
            "consumable": self.consumable,
            "increasing": self.increasing,
            "builtin": self.builtin,
        }


def _builtins() -> dict[str, Resource]:
    """LSF's built-in static resources and load indices."""
    out: dict[str, Resource] = {}

    def add(name: str, type_: ResourceType, **kw: Any) -> None:
        out[name] = Resource(name, type_, builtin=True, **kw)

    for name in ("type", "model", "hname", "status"):
        add(name, STRING)
    add("server", BOOL)
    for name in ("cpuf", "ncpus", "ncores", "nthreads", "ndisks", "maxslots"):
        add(name, NUMERIC)
    for name in ("maxmem", "maxswp", "maxtmp"):
        add(name, NUMERIC, unit="MB")
    add("slots", NUMERIC, consumable=True)
    for name in ("mem", "swp", "tmp"):
        add(name, NUMERIC, unit="MB", consumable=True)
    add("it", NUMERIC)
    for name in ("r15s", "r1m", "r15m", "ut", "pg", "io", "ls"):
        add(name, NUMERIC, increasing=False)
    return out


_BUILTINS: Final = _builtins()
_ALIASES: Final = {"swap": "swp", "idle": "it", "login": "ls", "cpu": "r1m"}
_SITE_KEYS: Final = frozenset({"name", "type", "consumable", "increasing", "unit", "description"})
_TYPE_WORDS: Final[dict[str, ResourceType]] = {
    "bool": BOOL,
    "boolean": BOOL,
    "numeric": NUMERIC,
    "string": STRING,
}


def _site_resource(entry: Mapping[str, Any], index: int) -> Resource:
    """Validate one site entry; raise ``ValueError`` naming the entry and the problem."""
    where = f"site resource #{index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(entry).__name__}")
    name = entry.get("name")
    if isinstance(name, str):
        where = f"site resource #{index} ({name!r})"
    unknown = sorted(set(entry) - _SITE_KEYS, key=str)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{where}: 'name' must be an identifier ([A-Za-z_][A-Za-z0-9_]*)")
    if name in RESERVED_NAMES:
        raise ValueError(f"{where}: {name!r} is a reserved word")
    if name in _BUILTINS or name in _ALIASES:
        raise ValueError(f"{where}: {name!r} is a built-in resource")
    type_ = _TYPE_WORDS.get(str(entry.get("type")))
    if type_ is None:
        raise ValueError(f"{where}: 'type' must be 'bool', 'numeric' or 'string'")
    consumable = entry.get("consumable", False)
    increasing = entry.get("increasing", True)
    unit = entry.get("unit")
    if not isinstance(consumable, bool) or not isinstance(increasing, bool):
        raise ValueError(f"{where}: 'consumable' and 'increasing' must be true or false")
    if type_ != NUMERIC and (consumable or "increasing" in entry or unit is not None):
        raise ValueError(f"{where}: only numeric resources take consumable/increasing/unit")
    if unit is not None and unit != "MB":
        raise ValueError(f"{where}: 'unit' must be 'MB' (memory) or absent")
    return Resource(name, type_, unit=unit, consumable=consumable, increasing=increasing)


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (names are short; callers bound the lengths)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ResourceRegistry:
    """Built-in LSF resources (with aliases ``swap``, ``idle``, ``login``, ``cpu``) plus site ones.

    ``site`` entries look like ``{"name": "gpu", "type": "bool"}`` or ``{"name": "ngpus",
    "type": "numeric", "consumable": True, "increasing": True}``; bad entries raise
    ``ValueError``. Instances are immutable, hashable, and compare by content.
    """

    __slots__ = ("_aliases", "_resources", "version")

    version: str

    def __init__(self, site: Iterable[Mapping[str, Any]] = ()) -> None:
        """Build the registry from the built-ins and the validated ``site`` entries."""
        resources = dict(_BUILTINS)
        for index, entry in enumerate(site):
            res = _site_resource(entry, index)
            if res.name in resources:
                raise ValueError(f"site resource #{index} ({res.name!r}): defined twice")
            resources[res.name] = res
        self._resources: dict[str, Resource] = resources
        self._aliases: dict[str, str] = dict(_ALIASES)
        canon = json.dumps([r.to_dict() for r in sorted(resources.values(), key=lambda r: r.name)])
        self.version = hashlib.sha256(canon.encode()).hexdigest()[:16]

    def get(self, name: str) -> Resource | None:
        """The resource called ``name`` (aliases resolved), or None if unknown."""
        res = self._resources.get(name)
        if res is None:
            alias = self._aliases.get(name)
            if alias is not None:
                res = self._resources.get(alias)
        return res

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def names(self) -> list[str]:
        """Every canonical resource name, sorted (aliases excluded)."""
        return sorted(self._resources)

    def aliases(self) -> dict[str, str]:
        """Alias -> canonical name."""
        return dict(self._aliases)

    def resources(self) -> list[Resource]:
        """Every resource, sorted by name."""
        return [self._resources[n] for n in self.names()]

    def suggest(self, name: str) -> str | None:
        """The known name (or alias) closest to ``name``, or None if nothing is close."""
        known = list(self._resources) + list(self._aliases)
        # Exact case-insensitive hits beat edit-distance guesses (MEM -> mem).
        for cand in known:
            if cand.lower() == name.lower():
                return cand
        # Fewest edits wins; ties go to the name sharing the longest prefix (people usually
        # get the start of a word right: "gpus" -> "gpu" rather than "ngpus").
        limit = 1 if len(name) <= 4 else 2 if len(name) <= 8 else 3
        best: tuple[int, int, str] | None = None
        for cand in known:
            if abs(len(cand) - len(name)) > limit:
                continue
            dist = _edit_distance(name, cand)
            if dist <= limit:
                score = (dist, -_common_prefix(name, cand), cand)
                if best is None or score < best:
                    best = score
        return best[2] if best else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResourceRegistry) and other.version == self.version

    def __hash__(self) -> int:
        return hash(self.version)

    def __repr__(self) -> str:
        return f"ResourceRegistry(version={self.version!r}, resources={len(self._resources)})"
