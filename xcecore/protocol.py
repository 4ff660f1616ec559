"""The protocol's vocabulary, in one place: job states and the names of the controller's ops.

Every role, the CLI and the REST server take these names from here, so a new state or op is
added once. Nothing here imports anything heavy: the one-shot commands import this module.
"""

from __future__ import annotations

from typing import Final, Literal

JobState = Literal["PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT"]
JOB_STATES: Final[tuple[JobState, ...]] = ("PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT")
PENDING: Final = frozenset({"PEND", "PSUSP"})
"""Waiting to run (PSUSP: held by its owner or an administrator)."""
ACTIVE: Final = frozenset({"RUN", "USUSP", "SSUSP"})
"""Dispatched to hosts, holding their slots (suspended ones too)."""
FINISHED: Final = frozenset({"DONE", "EXIT"})
"""Ended; kept until the controller's ``clean_period`` has passed."""
UNFINISHED: Final = PENDING | ACTIVE
