"""How many handshakes a candidate serves at once (the accept loops wait for room).

Every handshake in progress costs the event loop a step per message, and the steps of all of
them share each loop pass. When 10,000 workers re-joined a new primary at once, each of their
handshakes took about as long as all of them together, longer than the clients' connect
timeout: they gave up on work the primary had half done (thousands of abandoned handshakes),
and came back to do it again. Admitted a few hundred at a time, each handshake finishes in a
few short passes; the connections behind them wait in the kernel's accept queue, at no cost to
the process (a client that gives up there costs one accept and one failed write later).

A slot is held from the accept until the handshake is over (verdict sent, refused, abandoned),
and never longer than ``hold`` seconds: a client that connects and says nothing (hostile or
hung) cannot keep the door shut for more than that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Admission:
    """Slots for handshakes in progress: at most ``limit``, each for at most ``hold`` s."""

    def __init__(self, limit: int, hold: float) -> None:
        self.limit = limit
        self.hold = hold
        self.active = 0
        self._slots: deque[list[float | bool]] = deque()  # [admitted at, released], oldest first
        self.on_room: Callable[[], None] = lambda: None  # called when a full door opens again

    def admit(self, now: float) -> Callable[[], None]:
        """Take a slot; the returned function gives it back (the first call only)."""
        slot: list[float | bool] = [now, False]
        self._slots.append(slot)
        self.active += 1

        def release() -> None:
            if not slot[1]:
                slot[1] = True
                self._released()

        return release

    def _released(self) -> None:
        self.active -= 1
        if self.active == self.limit * 3 // 4:  # room for a batch again: wake the accept loops
            self.on_room()

    def room(self, now: float) -> int:
        """Slots free now (slots held past ``hold`` are given back first)."""
        slots = self._slots
        while slots:
            at, released = slots[0]
            if released:
                slots.popleft()
            elif now - float(at) >= self.hold:
                slots.popleft()[1] = True
                self._released()
            else:
                break
        return self.limit - self.active

    def next_expiry(self, now: float) -> float:
        """Seconds until the oldest held slot expires (``hold`` when none is held)."""
        for at, released in self._slots:
            if not released:
                return max(0.0, float(at) + self.hold - now)
        return self.hold
