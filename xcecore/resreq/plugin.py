"""The built-in ``resreq`` plugin: provides the default resource-requirement evaluator."""

from __future__ import annotations

from xcecore.hookspecs import hookimpl
from xcecore.resreq.evaluator import Evaluator
from xcecore.resreq.registry import ResourceRegistry

__all__ = ["xce_resreq_evaluator"]


@hookimpl(trylast=True)
def xce_resreq_evaluator(registry: ResourceRegistry) -> Evaluator:
    """Return the default :class:`Evaluator` for ``registry`` (site plugins may override)."""
    return Evaluator(registry)
