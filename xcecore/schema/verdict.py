"""What a candidate tells a client about itself in the handshake: the verdict.

Plain Python (no pydantic): the one-shot commands read it. The verdict rides in a standby's
hello and in the handshake's status (``docs/protocol.md``, "Handshake"); ``docs/protocol-ops.md``
renders :class:`StandbyVerdict` (``docs/gen_protocol_ops.py``).

``takeover_ms`` is the standby's refusal made useful: "I am not the primary, the primary I
watch has stopped beating, and I expect to take over in this many milliseconds". A client
waits that long against that standby instead of its generic back-off (and stops walking
towards the hung primary, whose handshake would only time out); see
:mod:`xcecore.client.dialer`. :func:`xcecore.schema.limits.takeover_of` is the one reader of
the field (with its bound :data:`~xcecore.schema.limits.TAKEOVER_MS_MAX`): the one-shot commands
read verdicts, and this module's ``TypedDict`` would make them import ``typing``.
"""

# No ``from __future__ import annotations``: TypedDict must see ``NotRequired`` itself
# (``__required_keys__``, which the generated page reads).
from typing import Annotated, Literal, NotRequired, TypedDict

from xcecore.schema.limits import TAKEOVER_MS_MAX as TAKEOVER_MS_MAX
from xcecore.schema.limits import takeover_of as takeover_of


class Doc:
    """A field's description, for the generated page (``Annotated[type, Doc("...")]``)."""

    __slots__ = ("description",)

    def __init__(self, description: str) -> None:
        self.description = description


class StandbyVerdict(TypedDict):
    """A standby's verdict, in its hello (step 1) and in the status (step 3) if the client
    authenticates anyway. A client goes to ``primary`` when it is set; when it is null and
    ``takeover_ms`` is present, it dials this standby again after that many milliseconds
    (at most its own re-check interval later); else it tries the next candidate."""

    server: Annotated[str, Doc("this candidate's advertised `host:port`")]
    state: Annotated[Literal["standby"], Doc("always `standby` here (a primary says `primary`)")]
    primary: Annotated[str | None, Doc(
        "the primary's `host:port`, or null: none known, or the one known has stopped "
        "beating (a standby does not send clients to a primary it is about to fence)")]
    takeover_ms: NotRequired[Annotated[int, Doc(
        "present only while this standby watches a primary that made no progress for half "
        "of `[controller] hung_timeout` and it can fence it (same host): milliseconds until "
        "it expects to have fenced it and promoted; 0 once the fence is under way. 0 to "
        f"{TAKEOVER_MS_MAX:,}")]]
