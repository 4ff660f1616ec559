"""The environment a job takes from its submitter: which variables, and only ones it can carry.

- :class:`EnvOption` -- what ``--env`` (LSF ``bsub -env``, Slurm ``--export``) asks for; the
  parser of its text is :func:`xcecore.jobspec.parse_env_option`;
- :func:`resolve_env` -- the variables a job gets from its submitter's environment;
- :func:`submittable` -- those of them the submission edge accepts, and the names of the
  others.

Every ``xce submit`` propagates the submitter's environment (all of it by default, as LSF
does), so this module is on the command's path and imports nothing but what is already
loaded there; the parsers (:mod:`xcecore.jobspec`, :mod:`xcecore.jobscript`) load only when an
option or a script needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from xcecore.schema import limits as lim

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see xcecore.protocol
if TYPE_CHECKING:
    from typing import Final, Literal

    EnvMode = Literal["all", "none", "list"]

_NO_ASSIGN: Mapping[str, str] = MappingProxyType({})
NOT_PROPAGATED: Final = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
"""Shell bookkeeping that would be wrong on another host or in another directory."""


class EnvOption(tuple["EnvMode", "tuple[str, ...]", "tuple[str, ...]", "Mapping[str, str]"]):
    """What ``--env`` asks for: every variable (less ``exclude``), none, or the ``names``
    listed; ``assign`` sets variables to given values on top. (A ``(mode, names, exclude,
    assign)`` tuple with named fields, written out: a dataclass would cost ``xce submit``
    ~10 ms of start-up, a ``typing.NamedTuple`` ~7 ms for ``typing``.)"""

    __slots__ = ()

    def __new__(cls, mode: EnvMode = "all", names: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
                assign: Mapping[str, str] = _NO_ASSIGN) -> EnvOption:
        return super().__new__(cls, (mode, names, exclude, assign))

    @property
    def mode(self) -> EnvMode:
        return self[0]

    @property
    def names(self) -> tuple[str, ...]:
        return self[1]

    @property
    def exclude(self) -> tuple[str, ...]:
        return self[2]

    @property
    def assign(self) -> Mapping[str, str]:
        return self[3]

    def __repr__(self) -> str:
        return (f"EnvOption(mode={self[0]!r}, names={self[1]!r}, exclude={self[2]!r}, "
                f"assign={self[3]!r})")


def resolve_env(option: EnvOption, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a job gets from its submitter's ``environ`` under ``option``."""
    if option.mode == "none":
        picked: dict[str, str] = {}
    elif option.mode == "all":
        skip = NOT_PROPAGATED | set(option.exclude)
        picked = {k: v for k, v in environ.items() if k not in skip}
    else:
        picked = {k: environ[k] for k in option.names if k in environ}
    picked.update(option.assign)
    return picked


def _refused(name: str, value: str) -> str | None:
    """Why the submission edge (``xcecore.schema.types.Env``) would refuse this variable."""
    if not 0 < len(name) <= lim.NAME_MAX or "=" in name or lim.CONTROL_OR_SPACE.search(name):
        return "its name"
    if len(value) > lim.ENV_VALUE_MAX:
        return f"a value longer than {lim.ENV_VALUE_MAX:,} characters"
    if lim.CONTROL.search(value) and lim.CONTROL.search(value.replace("\t", "").replace("\n", "")):
        return "a control character in its value"
    return None


def submittable(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``env`` less what the submission edge would refuse: ``(kept, "NAME (why)" of each
    dropped)``. A submitter's environment holds whatever its shell put there (a value with an
    escape sequence, thousands of variables); one such variable must not refuse the job, so
    the command drops it and says so. The edge checks again: this only spares the refusal.
    Past :data:`~xcecore.schema.limits.ENV_MAX_ITEMS` variables, the rest (in name order) are
    dropped."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name in sorted(env):
        value = env[name]
        why = _refused(name, value)
        if why is None and len(kept) >= lim.ENV_MAX_ITEMS:
            why = f"more than {lim.ENV_MAX_ITEMS:,} variables"
        if why is None:
            kept[name] = value
        else:
            dropped.append(f"{name[:64]} ({why})")
    return kept, dropped
