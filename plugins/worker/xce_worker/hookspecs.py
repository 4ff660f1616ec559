"""The worker distribution's own hooks: how jobs are contained.

Only the worker calls these, so they live here, not in the core: the worker's plugin adds
them through the core's ``xce_addhooks``, and :func:`containments` is their typed facade. A
site adds a containment (a systemd scope, a container runtime...) by implementing
``xce_worker_containments`` in its plugin, marked with ``xcecore.hookspecs.hookimpl``, and
naming it in ``[worker] containment``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookspec

if TYPE_CHECKING:
    import pluggy

    from xce_worker.containment import ContainmentSpec


@hookspec
def xce_worker_containments() -> Iterable[ContainmentSpec]:
    """Return the job containments this plugin provides (:class:`ContainmentSpec` records).

    Called once when a worker starts, on its main thread, before any job runs. Each record
    names a containment, a ``probe(config)`` that returns a score (higher: it does more on
    this host; ``[worker] containment = "auto"`` takes the highest) or raises
    ``xce_worker.containment.Unavailable`` with the reason, and a ``factory(config)`` that
    builds the :class:`xce_worker.containment.Containment`. Probes must be cheap and must not
    change the host. Two plugins registering one name is an error naming it. The built-ins
    are ``cgroup2``, ``cgroup1`` and ``fallback`` (the worker's own plugin).
    """


class ContainmentRegistryError(RuntimeError):
    """Two containments share a name, or a plugin returned something else."""


def containments(hook: pluggy.HookRelay) -> dict[str, ContainmentSpec]:
    """Every registered containment by name (typed facade of the hook)."""
    from xce_worker.containment import ContainmentSpec

    out: dict[str, ContainmentSpec] = {}
    found: Any = hook.xce_worker_containments()
    for group in found:
        for spec in group or ():
            if not isinstance(spec, ContainmentSpec):
                raise ContainmentRegistryError(
                    f"xce_worker_containments returned {spec!r}, not a ContainmentSpec")
            if spec.name in out:
                raise ContainmentRegistryError(f"containment {spec.name!r} is registered twice")
            out[spec.name] = spec
    return out
