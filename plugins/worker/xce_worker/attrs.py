"""Join attributes: this host's static facts, overridable from ``[worker]``.

The attributes describe the member, not a moment: they are asked once at start and sent by
every join and re-join (protocol-ops.md, ``join``). ``hname`` and ``max_slots`` are always
present; the site's boolean resources go in ``resources`` and its string and numeric
resources become attributes of their own name.
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
from typing import Any

MB = 1024 * 1024


def _cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo`` on Linux), else whatever platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_facts() -> dict[str, Any]:
    """What the hardware says: type, model, CPU counts, memory, swap and temp space (MB)."""
    import psutil  # heavy-ish; only the running worker needs it

    ncpus = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    ncores = psutil.cpu_count(logical=False) or ncpus
    try:
        maxtmp = psutil.disk_usage(tempfile.gettempdir()).total // MB
    except OSError:
        maxtmp = 0
    return {
        "type": (platform.machine() or "unknown").upper(),
        "model": _cpu_model(),
        "ncpus": int(ncpus),
        "ncores": int(ncores),
        "nthreads": max(1, int(ncpus) // int(ncores)),
        "maxmem": int(psutil.virtual_memory().total // MB),
        "maxswp": int(psutil.swap_memory().total // MB),
        "maxtmp": int(maxtmp),
    }


FACT_KEYS = ("type", "model", "ncpus", "ncores", "nthreads", "maxmem", "maxswp", "maxtmp")


def host_view(section: dict[str, Any], facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The host's facts as the cluster must see them: a configured value always wins.

    ``facts`` defaults to :func:`host_facts`. The join attributes and the hardware monitor's
    reports both come from here, so a host configured with ``ncpus = 16`` is a 16-CPU host
    for ``GET /hosts`` and for ``select[ncpus>=16]`` alike.
    """
    facts = host_facts() if facts is None else facts
    view: dict[str, Any] = {}
    for key in FACT_KEYS:
        value = section.get(key)
        view[key] = value if value is not None else facts[key]
    if section.get("ncpus") is not None and section.get("nthreads") is None:
        view["nthreads"] = max(1, view["ncpus"] // max(1, view["ncores"]))
    return view


def join_attributes(section: dict[str, Any], facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The worker's join attributes from its (validated) ``[worker]`` section.

    ``facts`` defaults to :func:`host_facts`; a configured value always wins over a fact
    (:func:`host_view`), so a test or a second worker on one machine can pose as another host.
    """
    attrs: dict[str, Any] = {"hname": section.get("hname") or socket.gethostname()}
    attrs.update(host_view(section, facts))
    attrs["cpuf"] = float(section.get("cpuf", 1.0))
    slots = section.get("slots")
    attrs["max_slots"] = int(slots if slots is not None else attrs["ncpus"])
    attrs["resources"] = sorted(set(section.get("resources") or ()))
    attrs.update(section.get("strings") or {})
    attrs.update({k: float(v) for k, v in (section.get("numbers") or {}).items()})
    return attrs
