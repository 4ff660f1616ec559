"""The built-in ``rejoin`` plugin: after a reconnect, re-join at the next rejoin point.

It keeps the ``xce_reconnected`` contract to the letter: it only records that a rejoin is
needed and returns. The connection manager re-joins after the next call whose op is one of the
role's rejoin points (or at once when heartbeats recover an idle client). Block it
(``[plugins] disable = ["rejoin"]``) only if another plugin takes over that duty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xcecore.hookspecs import hookimpl

if TYPE_CHECKING:
    from xcecore.candidates import Candidate
    from xcecore.client import Client


@hookimpl
def xce_reconnected(client: Client, candidate: Candidate) -> None:
    """Mark a rejoin pending on ``client``; never call the client from here."""
    client.mark_rejoin_pending()
