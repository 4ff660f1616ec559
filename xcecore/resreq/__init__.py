"""LSF-style resource requirements: parse, check, compile and evaluate against hosts.

Typical use::

    ev = Evaluator(ResourceRegistry([{"name": "gpu", "type": "bool"}]))
    matches = ev.select("select[mem>4G && gpu] order[r1m] rusage[mem=2048]", hosts)

See ``/work/shared/RESREQ.md`` (the language) and the module docstrings for details.
"""

from __future__ import annotations

from xcecore.resreq.errors import MAX_DEPTH, MAX_LENGTH, MAX_NODES, ResreqError
from xcecore.resreq.evaluator import (
    CompiledReq,
    Evaluator,
    HostMatch,
    ResreqEvaluator,
    RusageAlternative,
)
from xcecore.resreq.registry import Resource, ResourceRegistry

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
