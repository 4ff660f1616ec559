"""Authorization by authenticated identity: who may claim which role, who administers, whom a
request acts for. Pure decisions over an :class:`xcecore.auth.Identity`; no I/O.

- **Roles.** The daemon roles (:data:`DAEMON_ROLES`) and every role holding grants are
  *service roles*: the handshake may claim one only from root or a configured service user
  (``[cluster] service_users``). Any other role name (``cli``, a third party's) is anyone's,
  and gives only a user's rights.
- **Administrators** are users, never a role: root, the users of ``[controller] admins``,
  and with ``auth = "key"`` the cluster's owner (every key holder is the owner, and the key
  lets its holder be any daemon anyway).
- **Whom a request acts for.** A direct caller acts for itself: its authenticated user.
  A front end (:data:`FRONT_ENDS`, the API server: a service role, so a trusted identity)
  acts for people and must name the user (``user``), whose rights then apply; the controller
  records both ("alice via apiserver@h1"). Nobody else may name another user.
- **Grants** (``[controller] grants = { healthcheck = ["hostctrl"] }``) let a role call the
  named ops (:data:`GRANTABLE`) with an administrator's rights for them.
"""

from __future__ import annotations

from collections.abc import Mapping

from xcecore.auth import AuthFailed, Identity
from xcecore.wire import ErrorCode, RemoteError

DAEMON_ROLES = frozenset({"controller", "worker", "scheduler", "apiserver"})
"""Roles only root or a service user may claim."""
FRONT_ENDS = frozenset({"apiserver"})
"""Roles that act for people: they name the user of each request."""
MEMBER_DAEMONS = DAEMON_ROLES - FRONT_ENDS
"""Daemons with ops of their own (a worker's reports, the scheduler's dispatches): never an
administrator, whoever runs them -- administering is a person's act."""
GRANTABLE = frozenset({"jobctrl", "queuectrl", "hostctrl", "jobdispatch", "jobdispatch_many",
                       "set_pend_reason", "clear_reason", "update_resvals", "shutdown"})
"""Ops a role may be granted (ops that need an administrator, or another user's job)."""
ROOT = "root"


class Policy:
    """The cluster's authorization settings, asked per handshake and per request.

    ``owner`` is the cluster's owner under ``auth = "key"`` (None under any other method).
    """

    __slots__ = ("admins", "grants", "owner", "service_users")

    def __init__(self, *, admins: frozenset[str] = frozenset(),
                 service_users: frozenset[str] = frozenset(),
                 grants: Mapping[str, frozenset[str]] | None = None,
                 owner: str | None = None) -> None:
        self.admins = frozenset(admins)
        self.service_users = frozenset(service_users)
        self.grants = dict(grants or {})
        self.owner = owner

    # -- handshake ----------------------------------------------------------------------------
    def is_service(self, who: Identity) -> bool:
        """Root, a service user, or (key mode) the owner."""
        return who.uid == 0 or who.user in self.service_users or who.user == self.owner

    def service_role(self, role: str) -> bool:
        """Whether claiming ``role`` needs a service identity."""
        return role in DAEMON_ROLES or role in self.grants

    def admit(self, who: Identity) -> None:
        """Refuse a service role claimed by anyone but root or a service user
        (:class:`AuthFailed`, reason ``role``)."""
        if self.service_role(who.role) and not self.is_service(who):
            kind = "a daemon role" if who.role in DAEMON_ROLES else "a role holding grants"
            raise AuthFailed("role", f"{who.role} is {kind}: only root or a service user "
                                     f"([cluster] service_users) may claim it, and {who.user} "
                                     f"(uid {who.uid}) is neither")

    # -- requests -----------------------------------------------------------------------------
    def is_admin(self, user: str) -> bool:
        """Whether ``user`` has administrator rights."""
        return user == ROOT or user in self.admins or user == self.owner

    def granted(self, role: str, op: str) -> bool:
        """Whether ``role`` holds a grant of ``op``."""
        ops = self.grants.get(role)
        return ops is not None and op in ops

    def may_administer(self, role: str, op: str, user: str) -> bool:
        """May a request of ``role`` acting for ``user`` do ``op`` as an administrator?"""
        if role in MEMBER_DAEMONS:
            return False
        return self.granted(role, op) or self.is_admin(user)

    def acting_for(self, op: str, who: Identity, named: object, *, must_name: bool) -> str:
        """The user a request acts for: the one a front end names, else the caller itself.

        ``must_name``: a front end must name the user (its writes and admin ops). Raises
        :class:`RemoteError` (INVALID, DENIED) naming what is wrong.
        """
        if who.role in FRONT_ENDS:
            if isinstance(named, str) and named:
                return named
            if must_name:
                raise RemoteError(ErrorCode.INVALID, f"{op}: a front end must name the user it "
                                                     "acts for (argument 'user')", {"arg": "user"})
            return who.user
        if named is not None and named != who.user:
            raise RemoteError(ErrorCode.DENIED, f"{op}: {who.user} (as {who.sender}) may not act "
                                                f"for {named}: only a front end names a user")
        return who.user


def via(who: Identity) -> str | None:
    """What a record says a request came through: the front end's ``role@host`` (None:
    the user called directly)."""
    return who.sender if who.role in FRONT_ENDS else None


def describe(user: str, who: Identity) -> str:
    """``alice via apiserver@h1`` or ``alice (uid 1001, cli@h2)``: who did it, for logs."""
    if who.role in FRONT_ENDS:
        return f"{user} via {who.sender} ({who.user})"
    return f"{user} (uid {who.uid}, {who.sender})"
