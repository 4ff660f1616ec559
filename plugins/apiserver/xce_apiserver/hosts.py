"""Views of pushed records for REST clients: a host in LSF's ``hostInfo`` fields, a job with the
fields existing XCE clients read, and the evaluator's host mapping."""

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


NO_THRESHOLD = 1e30
"""LSF's ``INFINIT_LOAD``: a load index without a busy threshold (xce sets none)."""

HOST_INFO: dict[str, type] = {
    "hostName": str, "hostType": str, "hostModel": str, "cpuFactor": float, "maxCpus": int,
    "maxMem": int, "maxSwap": int, "maxTmp": int, "nDisks": int, "nRes": int,
    "resources": list, "nDRes": int, "DResources": list, "windows": str, "numIndx": int,
    "busyThreshold": list, "isServer": int, "licensed": int, "rexPriority": int,
    "licFeaturesNeeded": int, "licClass": int, "cores": int, "hostAddr": str, "pprocs": int,
    "cores_per_proc": int, "threads_per_core": int,
}
"""Every field of LSF's ``struct hostInfo`` (lsf.h) and the JSON type its C type maps to
(``char``/``int`` -> integer, ``float`` -> number, ``char *`` -> string, ``char **`` and
``float *`` -> arrays): each is in every ``GET /hosts`` object, never null, so a client's
decoder (Go's zero-fills what is missing) reads what it expects."""


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def lsf_host(host: dict[str, Any]) -> dict[str, Any]:
    """A host record in LSF's field names: ``struct hostInfo`` whole (:data:`HOST_INFO`),
    then ``bhosts``/``lsload`` (status, slots, load indices) and xce's own."""
    attrs = host.get("attrs") or {}
    resvals = host.get("resvals") or {}
    resources = [r for r in attrs.get("resources") or [] if isinstance(r, str)]
    ncpus = _int(attrs.get("ncpus"), 1)
    ncores = _int(attrs.get("ncores"), ncpus)
    pprocs = max(1, _int(attrs.get("nprocs"), 1))  # sockets: workers report none yet
    cpuf = attrs.get("cpuf")
    return {
        "hostName": str(host.get("name") or ""),
        "hostType": str(attrs.get("type") or ""),
        "hostModel": str(attrs.get("model") or ""),
        "cpuFactor": float(cpuf) if isinstance(cpuf, int | float) else 1.0,
        "maxCpus": ncpus,
        "maxMem": _int(attrs.get("maxmem")),  # MB, as LSF
        "maxSwap": _int(attrs.get("maxswp")),
        "maxTmp": _int(attrs.get("maxtmp")),
        "nDisks": _int(attrs.get("ndisks")),
        "nRes": len(resources),
        "resources": resources,
        "nDRes": 0,
        "DResources": [],
        "windows": "",  # no dispatch windows: always open
        "numIndx": len(LOAD_INDICES),
        "busyThreshold": [NO_THRESHOLD] * len(LOAD_INDICES),
        "isServer": 1,
        "licensed": 1,
        "rexPriority": 0,
        "licFeaturesNeeded": 0,
        "licClass": 0,
        "cores": max(1, ncores // pprocs),
        "hostAddr": str(attrs.get("addr") or ""),
        "pprocs": pprocs,
        "cores_per_proc": max(1, ncores // pprocs),
        "threads_per_core": max(1, _int(attrs.get("nthreads"), 1)),
        "status": lsf_status(host),
        "available": bool(host.get("available", True)),
        "closed": bool(host.get("closed", False)),
        "comment": host.get("comment") or "",
        "loadIndices": {name: resvals.get(name) for name in LOAD_INDICES},
        "maxSlots": int(host.get("max_slots") or 0),
        "usedSlots": int(host.get("used_slots") or 0),
        "slots": _free_slots(host),
    }


JOB_CLIENT: dict[str, type] = {
    "jobid": int, "user": str, "status": str, "jobname": str, "queue": str,
    "projectname": str, "command": str, "resreq": str, "submittime": int,
    "jobdescription": str,
}
"""The job fields existing XCE REST clients read, and their JSON types (beside xce's own)."""


def client_job(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` (a REST job view) with :data:`JOB_CLIENT`'s fields added, never null:
    ``status`` is the state (PEND, RUN, DONE, ...), ``submittime`` whole epoch seconds,
    ``jobdescription`` the job's name (xce keeps no separate description)."""
    out = dict(job)
    out["user"] = str(job.get("user") or "")
    out["status"] = str(job.get("state") or "")
    out["jobname"] = str(job.get("name") or "")
    out["queue"] = str(job.get("queue") or "")
    out["projectname"] = str(job.get("project") or "default")
    out["command"] = str(job.get("command") or "")
    out["resreq"] = str(job.get("resreq") or "")
    out["submittime"] = int(job.get("submit_time") or 0)
    out["jobdescription"] = str(job.get("description") or job.get("name") or "")
    return out


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
