"""LSF-style resource requirements: parse, check, compile and evaluate against hosts.

Typical use::

    ev = Evaluator(ResourceRegistry([{"name": "gpu", "type": "bool"}]))
    matches = ev.select("select[mem>4G && gpu] order[r1m] rusage[mem=2048]", hosts)

The language is described in ``docs/resreq.md``. The names below load on first use (PEP 562),
so that importing the built-in plugin module, which every ``xce`` command does, stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xcecore.resreq.errors import MAX_DEPTH, MAX_LENGTH, MAX_NODES, ResreqError
    from xcecore.resreq.evaluator import (
        CompiledReq,
        Evaluator,
        HostMatch,
        ResreqEvaluator,
        RusageAlternative,
    )
    from xcecore.resreq.registry import Resource, ResourceRegistry

_WHERE = {
    "MAX_DEPTH": "errors", "MAX_LENGTH": "errors", "MAX_NODES": "errors", "ResreqError": "errors",
    "CompiledReq": "evaluator", "Evaluator": "evaluator", "HostMatch": "evaluator",
    "ResreqEvaluator": "evaluator", "RusageAlternative": "evaluator",
    "Resource": "registry", "ResourceRegistry": "registry",
}

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_NODES",
    "CompiledReq",
    "Evaluator",
    "HostMatch",
    "Resource",
    "ResourceRegistry",
    "ResreqError",
    "ResreqEvaluator",
    "RusageAlternative",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'xcecore.resreq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"xcecore.resreq.{module}"), name)
    globals()[name] = value
    return value
