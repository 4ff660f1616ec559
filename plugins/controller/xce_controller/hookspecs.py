"""The controller distribution's own hooks: its election and its durable store.

Only the controller role calls these, so they live here, not in the core: the controller's
plugin adds them to the plugin manager through the core's ``xce_addhooks`` (the way pytest
plugins add theirs), and :func:`election` / :func:`store` are their typed facade. A site
replaces the built-ins (a flock on the state directory, SQLite) by answering first; its plugin
implements these hooks like any other, marked with ``xcecore.hookspecs.hookimpl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from xcecore.hookspecs import hookspec

if TYPE_CHECKING:
    import pluggy

    from xce_controller.election import Election
    from xce_controller.store import Loaded, Write


class Store(Protocol):
    """What the controller needs from a durable store (the ``xce_controller_store`` contract).

    The primary opens it at promotion, loads the state once, then hands every write to
    :meth:`submit`; one writer thread (:meth:`run_writer`) commits them in groups and reports
    each committed batch, in commit order. Every write's idempotency key is stored with its
    result in the same transaction.
    """

    def open(self) -> None:
        """Open (creating if needed); called on a thread at promotion."""
        ...

    def load(self, idem_ttl: float) -> Loaded:
        """The whole durable state; idempotency keys older than ``idem_ttl`` s are pruned."""
        ...

    def submit(self, write: Write) -> None:
        """Queue ``write`` for the writer (thread-safe, never blocks)."""
        ...

    def run_writer(self, on_done: Callable[[list[Write]], None]) -> None:
        """Commit queued writes in groups until :meth:`stop`; ``on_done(batch)`` after each
        commit. A failed commit sets every write's ``error``, reports it, and returns."""
        ...

    def stop(self) -> None:
        """Make :meth:`run_writer` commit what is queued and return."""
        ...

    def lookup(self, rid: str) -> bytes | None:
        """The stored result (JSON) of idempotency key ``rid``, or None."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


@hookspec(firstresult=True)
def xce_controller_election(state_dir: str, advertise: str, hung_timeout: float) -> Election:
    """Return the election for this controller candidate (built-in: a lock on the state dir).

    firstresult; the built-in answers last (``trylast``). Called once at controller start, on
    the event loop's thread, with the candidate's state directory, the address it advertises
    and ``[controller] hung_timeout`` (seconds without a heartbeat after which a standby may
    fence the primary; 0: never; an implementation may leave the argument out). The object
    keeps the :class:`xce_controller.election.Election` protocol: try/wait to become primary,
    publish ``advertise`` as the primary's address, read the current primary's address,
    register the candidate for ``status``, beat while primary, say before each
    acknowledgement whether it still may, release.
    """


@hookspec(firstresult=True)
def xce_controller_store(state_dir: str) -> Store:
    """Return the durable state store for a primary (built-in: SQLite in WAL mode).

    firstresult; the built-in answers last (``trylast``). Called once each time this
    candidate becomes primary, on the event loop's thread. The object keeps the
    :class:`Store` protocol: load the state, commit grouped writes with their idempotency
    keys, look keys up.
    """


def election(hook: pluggy.HookRelay, state_dir: str, advertise: str, hung_timeout: float) -> Election:
    """The election a plugin provides (typed facade of ``xce_controller_election``)."""
    found: Any = hook.xce_controller_election(state_dir=state_dir, advertise=advertise,
                                              hung_timeout=hung_timeout)
    if found is None:
        raise RuntimeError("no plugin provides a controller election (is the controller plugin "
                           "loaded?)")
    return found  # type: ignore[no-any-return]


def store(hook: pluggy.HookRelay, state_dir: str) -> Store:
    """The store a plugin provides (typed facade of ``xce_controller_store``)."""
    found: Any = hook.xce_controller_store(state_dir=state_dir)
    if found is None:
        raise RuntimeError("no plugin provides a controller store (is the controller plugin loaded?)")
    return found  # type: ignore[no-any-return]
