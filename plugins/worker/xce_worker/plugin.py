"""The worker's plugin: the ``worker`` role and its ``[worker]`` config section.

The worker is the daemon on every compute host (LSF's sbatchd+LIM, Slurm's slurmd). Its role
object (:class:`xce_worker.daemon.WorkerRole`) joins with the host's attributes, re-joins after
``hello`` when a reconnect left a rejoin pending, runs its monitors and process manager on
their own threads, and keeps every job report in a durable journal until the controller has
it. Reconnecting, following redirects and re-joining are the core client's work: there is no
reconnect loop here.

This module is imported by every ``xce`` command, so it imports only what registering the
hooks needs; the worker's machinery (and psutil) loads when the role runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from xce_worker import hookspecs
from xce_worker.settings import SECTION
from xcecore.hookspecs import HookAdder, hookimpl
from xcecore.records import ConfigSection
from xcecore.role import RoleSpec

if TYPE_CHECKING:
    from xce_worker.containment import ContainmentSpec
    from xcecore.role import Role, RoleContext

ROLE = "worker"


def worker_role(ctx: RoleContext) -> Role:
    """Build the worker's role object (imports the worker's machinery only now)."""
    from xce_worker.daemon import WorkerRole

    return WorkerRole(ctx)


@hookimpl
def xce_roles() -> Iterable[RoleSpec]:
    """The worker role."""
    return [RoleSpec(ROLE, worker_role, "runs jobs on this host and reports its load")]


@hookimpl
def xce_addhooks(pluginmanager: HookAdder) -> None:
    """Add ``xce_worker_containments``."""
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl(trylast=True)
def xce_worker_containments() -> Iterable[ContainmentSpec]:
    """The built-in containments: cgroup2, cgroup1, fallback (see xce_worker.containment)."""
    from xce_worker.containment import builtin_specs

    return builtin_specs()


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """The ``[worker]`` section."""
    return [SECTION]
