"""Jittered exponential back-off between failed passes over the controller candidates.

Pure and I/O-free: it only computes delays. "Full jitter" (a uniform draw between zero and the
exponential ceiling) spreads a herd of clients that lost the same primary at the same instant,
so a freshly promoted standby is not hit by all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable

_MAX_EXPONENT = 62  # 2**62 * any sane base is far past any cap; stops float overflow


class Backoff:
    """Delays for successive failed passes: ``uniform(0, min(cap, base * 2**n))``.

    ``uniform`` is injectable so tests can pin the draw (default: ``random.uniform``, imported
    at the first draw: a one-shot command that never fails a pass never pays for ``random``).
    """

    def __init__(
        self,
        base: float,
        cap: float,
        uniform: Callable[[float, float], float] | None = None,
        *,
        busy_cap: float | None = None,
    ) -> None:
        if base <= 0 or cap <= 0:
            raise ValueError(f"back-off base and cap must be positive, got {base} and {cap}")
        self.base = base
        self.cap = max(cap, base)
        # How far ``at_least`` may stretch a draw (a busy candidate): the cap unless a policy
        # that retries fast by design (heartbeats while down) must still spread under load.
        self.busy_cap = self.cap if busy_cap is None else max(busy_cap, self.cap)
        self.failures = 0
        self._uniform = uniform

    def ceiling(self) -> float:
        """The largest delay the next :meth:`next_delay` may return."""
        return min(self.cap, self.base * 2.0 ** min(self.failures, _MAX_EXPONENT))

    def next_delay(self, at_least: float = 0.0) -> float:
        """Record one more failed pass and return how long to sleep before the next one.

        ``at_least`` raises this draw's ceiling (never past ``busy_cap``): after a pass in which a
        live candidate timed out, i.e. it is too busy to serve its queued handshakes, clients
        spread their retries over at least that long instead of re-queuing within ``base``
        (thousands of clients retrying at once is how a join storm collapses).
        """
        ceiling = max(self.ceiling(), min(self.busy_cap, at_least))
        if self._uniform is None:
            from random import uniform

            self._uniform = uniform
        delay = self._uniform(0.0, ceiling)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """Forget past failures (after a success)."""
        self.failures = 0
