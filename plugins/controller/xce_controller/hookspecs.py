"""The controller distribution's own hooks: its election and its durable store.

Only the controller role calls these, so they live here, not in the core: the controller's
plugin adds them to the plugin manager through the core's ``xce_addhooks`` (the way pytest
plugins add theirs), and :func:`election` / :func:`store` are their typed facade. A site
replaces the built-ins (a flock on the state directory, SQLite) by answering first; its plugin
implements these hooks like any other, marked with ``xcecore.hookspecs.hookimpl``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from xcecore.hookspecs import hookspec

if TYPE_CHECKING:
    import pluggy

    from xce_controller.changes import Change
    from xce_controller.election import Election
    from xce_controller.jobs import JobTable
    from xce_controller.store import Write
    from xce_controller.storeread import Delta, Head, Images
    from xcecore.config import Config


class Store(Protocol):
    """What the controller needs from a durable store (the ``xce_controller_store`` contract).

    Every write carries a *rev* (``Write.rev``, given on the event loop in commit order; 0
    for housekeeping that changes no record): the store keeps it with each row, keeps a
    removal record with it for each deleted record, keeps the highest committed rev, and can
    answer "what changed after rev R" (docs/protocol.md, "Words"). A standby uses
    :meth:`snapshot`, :meth:`wait_changed` and :meth:`changes_since` to keep a copy of the
    state current while it waits (a hot standby); a primary opens the store for writing at
    promotion, hands every write to :meth:`submit`, and one writer thread
    (:meth:`run_writer`) commits them in groups and reports each batch, in commit order.
    Every write's idempotency key is stored with its result in the same transaction. A
    multi-host backend does the same with a watch (``changes_since`` from its revision).
    """

    def open(self) -> None:
        """Open for writing (creating if needed); called on a thread at promotion."""
        ...

    def head(self) -> Head:
        """Meta (store id, rev, next job id), hosts and queues -- not the jobs; after
        :meth:`open`, on a thread. A primary without a loaded copy takes writes after this."""
        ...

    def load_jobs(self, upto: int, clean_width: float) -> JobTable:
        """Every job with id <= ``upto``, indexed; on a thread (the long part of a load)."""
        ...

    def load_window(self, capacity: int, floor: int) -> tuple[list[Change], int]:
        """The last ``capacity`` changes, oldest first, and the rev at or below which
        changes may be missing (at least ``floor``)."""
        ...

    def load_idem(self, since: float, add: Callable[[str, float], None]) -> int:
        """Call ``add(rid, ts)`` for each idempotency key stored at or after ``since``."""
        ...

    def load_events(self, limit: int) -> list[bytes]:
        """The newest ``limit`` cluster events (rows of table ``events``: their JSON), oldest
        first; on a thread, after :meth:`open`. Rows of ``events`` are written like any other
        table's (key: the zero-padded seq, so key order is seq order) but are no records: no
        rev follows them, no removal record is kept, a standby's follow ignores them."""
        ...

    def snapshot(self, ring_capacity: int, clean_width: float, idem_since: float,
                 add_idem: Callable[[str, float], None]) -> tuple[Head, JobTable] | None:
        """A standby's load: head (with the window in ``changes``/``floor``), jobs and
        idempotency keys at one rev; None while the store does not exist yet. Any thread
        but the writer's; never needs :meth:`open`."""
        ...

    def wait_changed(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until something may have been committed (True)."""
        ...

    def changes_since(self, rev: int) -> Delta | None:
        """What was committed after ``rev``: records (current versions), removals,
        idempotency keys, the new rev; None when the store can no longer say (the caller
        loads a snapshot again)."""
        ...

    def submit(self, write: Write) -> None:
        """Queue ``write`` for the writer (thread-safe, never blocks)."""
        ...

    def run_writer(self, on_done: Callable[[list[Write]], None]) -> None:
        """Commit queued writes in groups until :meth:`stop`; ``on_done(batch)`` after each
        commit, in commit order (the controller's ``on_done`` posts the report to its loop
        and returns at once: the writer may start the next transaction meanwhile). A failed
        commit sets every write's ``error`` and reports it; later writes of the same epoch
        are failed without an attempt until :meth:`resume`."""
        ...

    def stop(self) -> None:
        """Make :meth:`run_writer` commit what is queued and return."""
        ...

    def resume(self) -> None:
        """The caller rolled its state back to :meth:`committed`: attempt writes again."""
        ...

    def committed(self, keys: Iterable[tuple[str, Any]]) -> Images:
        """The committed ``(data, spec)`` of each ``(table, key)``, or None; any thread."""
        ...

    def lookup(self, rid: str, near: float | None = None) -> bytes | None:
        """The stored result (JSON) of idempotency key ``rid``, or None; any thread.
        ``near``: the time the caller remembered the key as committed at (the write's
        ``committed_at`` if the store set it, else the caller's clock after the commit; a
        key loaded or followed from the store: the time the store gave), to the second;
        None when the caller does not know it (a store that files keys by time then
        searches every key it keeps). Such a store says so with a true ``lookup_by_time``
        attribute: a cold primary then holds a keyed request until it has loaded the keys'
        times, rather than have the store search every key for each one."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


@hookspec(firstresult=True)
def xce_controller_election(state_dir: str, advertise: str, hung_timeout: float, backend: str,
                            config: Config) -> Election:
    """Return the election for this controller candidate (built-in: a lock on the state dir).

    firstresult; the built-in answers last (``trylast``), and only for ``backend`` "file".
    ``backend`` is ``[controller] backend``: an implementation answers for the backend it
    provides and returns None for the others; ``config`` is the validated configuration (its
    own section is there). Called once at controller start, on the event loop's thread, with
    the candidate's state directory, the address it advertises and ``[controller]
    hung_timeout`` (seconds without a heartbeat after which a standby may fence the primary;
    0: never; an implementation may leave any argument out). The object keeps the
    :class:`xce_controller.election.Election` protocol: try/wait to become primary, publish
    ``advertise`` as the primary's address, read the current primary's address, register the
    candidate for ``status``, beat while primary, say before each acknowledgement (and at
    every beat) whether it still may, release. Optionally ``takeover_in(primary)``: a
    standby's estimate of when it takes over from a primary that stopped beating (the
    handshake then tells clients ``takeover_ms`` instead of naming that primary); without it
    a standby names the primary it reads, hung or not.
    """


@hookspec(firstresult=True)
def xce_controller_store(state_dir: str, backend: str, config: Config, election: Election) -> Store:
    """Return the durable state store for a primary (built-in: SQLite in WAL mode).

    firstresult; the built-in answers last (``trylast``), and only for ``backend`` "file".
    Called once when this candidate starts, on the event loop's thread, after its election
    was made, with that election (a store may guard its writes with it): as a standby it
    follows the store through the object, and promoted it opens it for writing. The object
    keeps the :class:`Store` protocol: load and follow the state, commit grouped writes with
    their revs and idempotency keys, look keys up.
    """


def election(hook: pluggy.HookRelay, state_dir: str, advertise: str, hung_timeout: float,
             backend: str = "file", config: Config | None = None) -> Election:
    """The election a plugin provides (typed facade of ``xce_controller_election``)."""
    found: Any = hook.xce_controller_election(state_dir=state_dir, advertise=advertise,
                                              hung_timeout=hung_timeout, backend=backend,
                                              config=config)
    if found is None:
        raise RuntimeError(f"no plugin provides a controller election for backend {backend!r} "
                           "([controller] backend; is the plugin that provides it installed?)")
    return found  # type: ignore[no-any-return]


def store(hook: pluggy.HookRelay, state_dir: str, backend: str = "file",
          config: Config | None = None, election: Election | None = None) -> Store:
    """The store a plugin provides (typed facade of ``xce_controller_store``)."""
    found: Any = hook.xce_controller_store(state_dir=state_dir, backend=backend, config=config,
                                           election=election)
    if found is None:
        raise RuntimeError(f"no plugin provides a controller store for backend {backend!r} "
                           "([controller] backend; is the plugin that provides it installed?)")
    return found  # type: ignore[no-any-return]
