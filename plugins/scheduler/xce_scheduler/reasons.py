"""Pend reasons: why a pending job was not dispatched, sent only when a job's reason changes.

The controller keeps reasons in memory only (``set_pend_reason`` is volatile), so the truth
of what it has is what it pushed (``pend_reasons``, sent whole by every sync). A reason is
sent when the picker's reason differs from it and was not already requested; every sync (a
new primary after a failover has no reasons) forgets what was requested, so the reasons are
sent again. A request is forgotten once its push came back (or the job left), so what is
remembered stays as small as what is in flight. The controller clears a job's reason when it
dispatches it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Final

from xcecore import protocol

NO_HOST: Final = "no host satisfies the resource requirement"
NO_SLOTS: Final = "not enough free slots on matching hosts"
QUEUE_INACTIVE: Final = protocol.QUEUE_INACTIVE  # derived from the queue, never sent
HOSTS_UNUSABLE: Final = "all matching hosts are closed or unavailable"
BAD_REQUIREMENT: Final = "bad resource requirement: "
RESERVED: Final = "resources of matching hosts are reserved (rusage of running or dispatched jobs)"
EXCLUSIVE_WAIT: Final = "exclusive job: no matching host is empty"
HOSTS_EXCLUSIVE: Final = "matching hosts with free slots run exclusive jobs"
ARRAY_LIMIT: Final = "job array limit reached: "


def array_limit(limit: int) -> str:
    """An array whose ``%limit`` elements all run."""
    return f"{ARRAY_LIMIT}{limit} element(s) running"


def bad_requirement(message: str) -> str:
    """The reason for a requirement that does not compile (first line of the message)."""
    first = message.strip().splitlines()[0] if message.strip() else "invalid"
    return BAD_REQUIREMENT + first


class PendReasons:
    """Tracks which reason was last requested per job; turns a cycle's reasons into changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requested: dict[int, str] = {}
        self._epoch = -1

    def changes(
        self,
        wanted: Mapping[int, str],
        current: Mapping[int, str | None],
        epoch: int,
    ) -> dict[str, str]:
        """The ``set_pend_reason`` batch for this cycle (job id as a string -> reason).

        ``wanted`` holds this cycle's reason per job it looked at, ``current`` the reason the
        controller last pushed for each of them, ``epoch`` the view's count of syncs (a new
        one forgets what was requested).
        """
        out: dict[str, str] = {}
        with self._lock:
            if epoch != self._epoch:
                self._requested.clear()
                self._epoch = epoch
            requested = self._requested
            now = current.get
            for jobid, reason in wanted.items():
                if now(jobid) == reason:
                    # The controller has it: nothing left to remember (keeps this map small).
                    requested.pop(jobid, None)
                elif requested.get(jobid) != reason:
                    requested[jobid] = reason
                    out[str(jobid)] = reason
        return out

    def settle(self, pushed: Iterable[tuple[int, str | None]]) -> None:
        """The controller pushed these reasons: requests they answer need no remembering."""
        with self._lock:
            requested = self._requested
            for jobid, reason in pushed:
                if requested.get(jobid) == reason:
                    del requested[jobid]

    def drop(self, jobids: Iterable[int]) -> None:
        """These jobs are no longer pending: forget what was requested for them."""
        with self._lock:
            for jobid in jobids:
                self._requested.pop(jobid, None)

    def __len__(self) -> int:
        return len(self._requested)

    def forget(self, jobids: Iterable[str]) -> None:
        """Forget requests that were not delivered, so the next cycle sends them again."""
        with self._lock:
            for key in jobids:
                self._requested.pop(int(key), None)
