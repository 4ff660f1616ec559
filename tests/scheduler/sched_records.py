"""Synthetic controller records (docs/protocol-ops.md "Records") for scheduler unit tests."""

from __future__ import annotations

from typing import Any


def host(name: str, *, slots: int = 4, used: int = 0, state: str = "ok", **attrs: Any) -> dict[str, Any]:
    """A pushed host record; extra keyword arguments become ``attrs``, ``resvals=`` load values."""
    resvals = attrs.pop("resvals", {})
    return {
        "name": name, "state": state, "available": state != "unavail",
        "closed": state == "closed", "comment": "", "max_slots": slots, "used_slots": used,
        "attrs": {"hname": name, "ncpus": slots, **attrs}, "resvals": resvals,
        "joined_at": 1.0,
    }


def job(jobid: int, *, queue: str = "normal", resreq: str = "", ntasks: int = 1,
        submit_time: float | None = None, state: str = "PEND", pend_reason: str | None = None) -> dict[str, Any]:
    """A pushed job record."""
    return {
        "jobid": jobid, "name": "", "user": "alice", "project": "default", "queue": queue,
        "command": "true", "cwd": "", "env": {}, "resreq": resreq, "ntasks": ntasks,
        "state": state, "submit_time": float(jobid) if submit_time is None else submit_time,
        "start_time": None, "end_time": None, "alloc": [], "pid": None, "exit_status": None,
        "pend_reason": pend_reason, "reason": None, "signal": None, "attempt": 0,
        "forced": False, "usage": {},
    }


def queue(name: str, priority: int, *, active: bool = True, open_: bool = True) -> dict[str, Any]:
    """A pushed queue record."""
    return {"name": name, "priority": priority, "description": "", "open": open_,
            "active": active, "status": "Open:Active"}


def sync(hosts: list[dict[str, Any]], jobs: list[dict[str, Any]],
         queues: list[dict[str, Any]] | None = None, resources: list[Any] | None = None,
         *, mode: str = "snapshot", store: str = "s1", rev: int = 1) -> list[tuple[str, Any]]:
    """The frames of one state sync (docs/protocol.md): begin, records per kind, end."""
    queues = queues if queues is not None else [queue("priority", 43), queue("normal", 30)]
    cluster = {"name": "t", "resources": resources or [], "admins": [], "default_queue": "normal",
               "host_timeout": 30.0, "host_groups": {}, "user_groups": {},
               "queues": [q["name"] for q in queues]}
    frames: list[tuple[str, Any]] = [
        ("sync_begin", {"mode": mode, "store": store, "rev": rev, "since": None}),
        ("sync_records", {"kind": "cluster", "items": [cluster]}),
        ("sync_records", {"kind": "queues", "items": queues}),
        ("sync_records", {"kind": "hosts", "items": hosts}),
        ("sync_records", {"kind": "jobs", "items": jobs}),
    ]
    return [*frames, ("sync_end", {"rev": rev})]


def load(view: Any, *args: Any, **kw: Any) -> None:
    """Feed ``view`` (anything with ``apply(event, data)``) the frames of :func:`sync`."""
    for event, data in sync(*args, **kw):
        view.apply(event, data)
