"""The built-in ``resreq`` plugin: provides the default resource-requirement evaluator.

Every ``xce`` command loads this module, so it imports the language only when a role asks
for an evaluator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xcecore.hookspecs import hookimpl

if TYPE_CHECKING:
    from xcecore.resreq.evaluator import Evaluator
    from xcecore.resreq.registry import ResourceRegistry

__all__ = ["xce_resreq_evaluator"]


@hookimpl(trylast=True)
def xce_resreq_evaluator(registry: ResourceRegistry) -> Evaluator:
    """Return the default :class:`Evaluator` for ``registry`` (site plugins may override)."""
    from xcecore.resreq.evaluator import Evaluator

    return Evaluator(registry)
