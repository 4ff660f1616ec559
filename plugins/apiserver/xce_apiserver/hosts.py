"""Two views of a pushed host record: LSF's host fields, and the evaluator's host mapping."""

from __future__ import annotations

from typing import Any

LOAD_INDICES = ("r15s", "r1m", "r15m", "ut", "pg", "io", "ls", "it", "tmp", "swp", "mem")
"""LSF's load indices, in ``lsload`` order."""

_LSF_STATUS = {"ok": "ok", "closed": "closed_Adm", "unavail": "unavail"}


def lsf_status(host: dict[str, Any]) -> str:
    """LSF's host status word: ``ok``, ``closed_Adm``, ``closed_Full`` or ``unavail``."""
    state = str(host.get("state", "ok"))
    if state == "ok" and _free_slots(host) <= 0:
        return "closed_Full"
    return _LSF_STATUS.get(state, state)


def _free_slots(host: dict[str, Any]) -> int:
    return int(host.get("max_slots") or 0) - int(host.get("used_slots") or 0)


def lsf_host(host: dict[str, Any]) -> dict[str, Any]:
    """A host record in LSF's field names (``lshosts``/``bhosts``/``lsload`` rolled into one)."""
    attrs = host.get("attrs") or {}
    resvals = host.get("resvals") or {}
    return {
        "hostName": host.get("name"),
        "hostType": attrs.get("type"),
        "hostModel": attrs.get("model"),
        "cpuFactor": attrs.get("cpuf"),
        "maxCpus": attrs.get("ncpus"),
        "maxMem": attrs.get("maxmem"),
        "maxSwap": attrs.get("maxswp"),
        "maxTmp": attrs.get("maxtmp"),
        "resources": list(attrs.get("resources") or []),
        "status": lsf_status(host),
        "available": bool(host.get("available", True)),
        "closed": bool(host.get("closed", False)),
        "comment": host.get("comment") or "",
        "loadIndices": {name: resvals.get(name) for name in LOAD_INDICES},
        "maxSlots": int(host.get("max_slots") or 0),
        "usedSlots": int(host.get("used_slots") or 0),
        "slots": _free_slots(host),
    }


def evaluator_host(host: dict[str, Any]) -> dict[str, Any]:
    """The mapping of resource name -> value that the resource-requirement evaluator reads.

    Static attributes, then the latest monitor values, then what the API server knows best:
    ``hname``, ``status`` ("ok" only when the host is available and open), free ``slots``
    and ``maxslots``. A boolean resource the host lists is true.
    """
    attrs = host.get("attrs") or {}
    out: dict[str, Any] = {k: v for k, v in attrs.items() if k != "resources"}
    for name in attrs.get("resources") or ():
        if isinstance(name, str):
            out[name] = True
    out.update(host.get("resvals") or {})
    out["hname"] = host.get("name")
    out["status"] = "ok" if host.get("state", "ok") == "ok" else str(host.get("state"))
    out["slots"] = _free_slots(host)
    out["maxslots"] = int(host.get("max_slots") or 0)
    return out
