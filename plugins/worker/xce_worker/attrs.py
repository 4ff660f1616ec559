"""Join attributes: this host's static facts, overridable from ``[worker]``.

The attributes describe the member, not a moment: they are asked once at start and sent by
every join and re-join (protocol-ops.md, ``join``). ``hname`` and ``max_slots`` are always
present; the site's boolean resources go in ``resources`` and its string and numeric
resources become attributes of their own name.

GPUs: where NVIDIA's management library answers (NVML, through ``nvidia-ml-py``'s
``pynvml``), the host reports ``ngpus``, and with GPUs ``gpu_model`` (the first device's
name) and ``gpu_mem`` (the smallest device's memory, MB); with no library or no driver,
``ngpus`` is 0. :func:`gpus` lists the devices, which the process manager binds to jobs.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import tempfile
from dataclasses import dataclass
from typing import Any

from loguru import logger

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


@dataclass(frozen=True, slots=True)
class Gpu:
    """One NVIDIA device as NVML enumerates it (PCI bus order)."""

    index: int
    uuid: str
    name: str
    mem_mb: int


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_nvml_said: set[str] = set()


def gpus() -> list[Gpu]:
    """The host's NVIDIA GPUs, or none where NVML (the library or the driver) is absent."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if str(exc) not in _nvml_said:  # once per process: the monitor asks again and again
            _nvml_said.add(str(exc))
            logger.debug("NVML is not usable here ({}); reporting no GPUs", exc)
        return []
    try:
        out = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append(Gpu(i, _text(pynvml.nvmlDeviceGetUUID(handle)),
                           _text(pynvml.nvmlDeviceGetName(handle)),
                           int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MB))
        return out
    except pynvml.NVMLError as exc:
        logger.warning("NVML failed while listing GPUs ({}); reporting none", exc)
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def gpu_facts(devices: list[Gpu]) -> dict[str, Any]:
    """``ngpus`` and, with GPUs, ``gpu_model`` and ``gpu_mem`` (MB)."""
    facts: dict[str, Any] = {"ngpus": len(devices)}
    if devices:
        facts["gpu_model"] = devices[0].name
        facts["gpu_mem"] = min(d.mem_mb for d in devices)
    return facts


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
        **gpu_facts(gpus()),
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
    for key in ("ngpus", "gpu_model", "gpu_mem"):  # from NVML; nothing to configure
        if key in facts:
            view[key] = facts[key]
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
