"""What a client call can raise besides an error reply (:class:`xcecore.wire.RemoteError`).

Cheap to import (no anyio, no loguru): the one-shot commands import it.

- :class:`BackendUnavailable`: the call's deadline or retry budget ran out and the controller
  certainly did not apply it (it was never sent, or every send got a definitive "not here").
- :class:`OutcomeUnknown`: a keyed write (``xcecore.protocol.KEYED_WRITES``) was sent and its
  reply was lost when the deadline or budget ran out; it may or may not have been applied. Its
  idempotency key answers that (``client.outcome(rid)``); retrying with the same key is safe.
- :class:`AuthenticationFailed` (a :class:`BackendUnavailable`): the primary refused this
  client's credential or claim (or none could be made): not an outage, so the call is not
  retried; its message is the controller's reason.
- :class:`ClientClosed`: the client is closed, or its role is stopping.
- :class:`HookContractError`: the client was called from where it would deadlock.
"""

from __future__ import annotations


class BackendUnavailable(Exception):
    """A call's retry budget or deadline ran out before any primary applied it.

    ``last_error`` is the last failure seen (also the ``__cause__``). The call was not applied:
    it never reached a primary, or every primary it reached answered that it is not one.
    """

    def __init__(self, message: str, last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.last_error = last_error


class AuthenticationFailed(BackendUnavailable):
    """The controller refused this client's credential or claim, or no credential could be
    made (munged is down): ``str()`` is the reason (``authentication failed: credential
    expired``), ``candidate`` who said it (None: this host). Nothing was sent, so nothing was
    applied; retrying with the same credential fails the same way.
    """

    def __init__(self, message: str, candidate: object = None) -> None:
        super().__init__(message)
        self.candidate = candidate


class OutcomeUnknown(Exception):
    """A write was sent but its reply never came before the deadline or budget ran out.

    ``rid`` is its idempotency key and ``op`` its op: ``outcome(rid)`` tells whether it was
    applied (and makes a "not applied" answer final), and a retry of the same call with
    ``rid=...`` is applied at most once. ``last_error`` is the last failure seen.
    """

    def __init__(self, message: str, *, rid: str, op: str,
                 last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.rid = rid
        self.op = op
        self.last_error = last_error


class HookContractError(RuntimeError):
    """The client was called from inside ``xce_reconnected`` (or the sync facade from the loop).

    Raised instead of deadlocking on the failover lock the hook's caller holds.
    """


class ClientClosed(RuntimeError):
    """The client is closed (or was never entered with ``async with``)."""
