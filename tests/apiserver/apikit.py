"""The API server tests' kit: records as the controller pushes them, a fake core client that
answers like the controller (its argument schemas and idempotency table included), and
:class:`Api`, the app over a push-fed store. (A module of its own, not conftest: the
schemathesis test builds an :class:`Api` at import.)"""

from __future__ import annotations

from typing import Any

import httpx
from xce_apiserver.app import create_app
from xce_apiserver.auth import Authenticator, hash_password, parse_users
from xce_apiserver.backend import Backend
from xce_apiserver.health import BackendHealth
from xce_apiserver.store import Store

from xcecore.client import BackendUnavailable
from xcecore.resreq.evaluator import Evaluator
from xcecore.schema.delegated import compile_delegated
from xcecore.schema.ops import compile_all
from xcecore.wire import RemoteError

FAST = 1000  # PBKDF2 iterations for tests: the slow default is for real deployments


def job(jobid: int, user: str = "alice", state: str = "PEND", queue: str = "normal", **kw: Any) -> dict[str, Any]:
    """A job record as the controller pushes it."""
    rec = {"jobid": jobid, "name": "", "user": user, "project": "default", "queue": queue,
           "command": "sleep 1", "cwd": "", "env": {}, "resreq": "", "ntasks": 1, "state": state,
           "submit_time": 1700000000.0 + jobid, "start_time": None, "end_time": None, "alloc": [],
           "pid": None, "exit_status": None, "pend_reason": None, "reason": None, "signal": None,
           "attempt": 0, "forced": False, "usage": {}}
    rec.update(kw)
    return rec


def host(name: str, ncpus: int = 4, used: int = 0, state: str = "ok", **attrs: Any) -> dict[str, Any]:
    """A host record as the controller pushes it."""
    return {"name": name, "state": state, "available": state != "unavail", "closed": state == "closed",
            "comment": "", "max_slots": ncpus, "used_slots": used,
            "attrs": {"hname": name, "ncpus": ncpus, "maxmem": 8192, "type": "X86_64",
                      "model": "Intel", "cpuf": 1.0, **attrs},
            "resvals": {"r1m": 0.1 * ncpus, "mem": 4000.0}, "joined_at": 1700000000.0}


def queue(name: str, priority: int, open_: bool = True) -> dict[str, Any]:
    """A queue record."""
    return {"name": name, "priority": priority, "description": "", "open": open_, "active": True,
            "status": f"{'Open' if open_ else 'Closed'}:Active"}


def full_state(jobs: int = 3, hosts: int = 3) -> dict[str, Any]:
    """The records of a small cluster, by kind (:func:`load` syncs them into a store)."""
    resources = [{"name": "gpu", "type": "bool"}]
    return {
        "server": "127.0.0.1:7600",
        "cluster": {"name": "test", "resources": resources, "admins": ["root"],
                    "default_queue": "normal", "host_timeout": 30.0, "host_groups": {},
                    "user_groups": {}, "queues": ["priority", "normal", "closedq"]},
        "queues": [queue("normal", 30), queue("priority", 43), queue("closedq", 10, open_=False)],
        "hosts": [host(f"n{i}", ncpus=2 + i, resources=["gpu"] if i % 2 else []) for i in range(hosts)],
        "jobs": [job(i, user="alice" if i % 2 else "bob") for i in range(1, jobs + 1)],
        "members": [{"identity": "scheduler@ctl", "role": "scheduler", "joined_at": 1.0}],
    }


def load(store: Any, state: dict[str, Any], *, mode: str = "snapshot", rev: int = 1) -> None:
    """Feed ``store`` (anything with ``apply(event, data)``) ``state`` as one state sync:
    each key of ``state`` but ``server`` is a kind (``cluster``: one record)."""
    if "server" in state and hasattr(store, "server"):
        store.server = state["server"]  # what the session sets from the join's candidate
    store.apply("sync_begin", {"mode": mode, "store": "test-store", "rev": rev, "since": None})
    for kind, items in state.items():
        if kind == "server":
            continue
        store.apply("sync_records", {"kind": kind, "items": [items] if kind == "cluster" else items})
    store.apply("sync_end", {"rev": rev})


SCHEMAS = {**compile_all(), **compile_delegated()}


class FakeClient:
    """Stands in for the core client: answers like the controller would, including its
    argument schemas (the real ones: what the API server forwards must pass them) and its
    idempotency table (a repeated ``rid`` gets the stored result, not a second write)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.rids: list[str | None] = []
        self.applied: dict[str, Any] = {}
        self.next_jobid = 1000
        self.fail: BaseException | None = None
        self.connected = True

    async def connect(self, *, deadline: float | None = None, retry_budget: int | None = None) -> None:
        if not self.connected:
            raise BackendUnavailable("no primary (fake)")

    async def call(self, op: str, args: dict[str, Any] | None = None, *,
                   deadline: float | None = None, retry_budget: int | None = None,
                   rid: str | None = None) -> Any:
        args = dict(args or {})
        self.rids.append(rid)
        if self.fail is not None:
            raise self.fail
        if rid is not None and rid in self.applied:
            return self.applied[rid]
        SCHEMAS[op].check(args)  # RemoteError INVALID, as the controller would answer
        self.calls.append((op, args))
        result = getattr(self, f"op_{op.replace('.', '_')}")(args)
        if rid is not None:
            self.applied[rid] = result
        return result

    def op_jobsubmit(self, args: dict[str, Any]) -> Any:
        q = self.store.queues.get(args.get("queue", "normal"))
        if q is None:
            raise RemoteError("NOT_FOUND", f"no such queue {args.get('queue')!r}", {"what": "queue"})
        if not q["open"]:
            raise RemoteError("CONFLICT", f"queue {q['name']!r} is closed")
        self.next_jobid += 1
        return {"jobid": self.next_jobid, "queue": q["name"], "state": "PEND"}

    def op_jobctrl(self, args: dict[str, Any]) -> Any:
        rec = self.store.get_job(args["jobid"])
        if rec is None:
            raise RemoteError("NOT_FOUND", f"no such job {args['jobid']}", {"what": "job"})
        if rec["user"] != args["user"] and args["user"] != "root":
            raise RemoteError("DENIED", f"user {args['user']!r} does not own job {args['jobid']}")
        return {**rec, "state": "EXIT" if args["action"] == "kill" else rec["state"]}

    def op_queuectrl(self, args: dict[str, Any]) -> Any:
        q = self.store.queues.get(args["queue"])
        if q is None:
            raise RemoteError("NOT_FOUND", f"no such queue {args['queue']!r}")
        return {**q, "open": args["action"] != "close"}

    def op_hostctrl(self, args: dict[str, Any]) -> Any:
        h = self.store.hosts.get(args["host"])
        if h is None:
            raise RemoteError("NOT_FOUND", f"no such host {args['host']!r}")
        return {**h, "closed": args["action"] == "close", "comment": args["comment"],
                "state": "closed" if args["action"] == "close" else "ok"}

    def op_history_jobs(self, args: dict[str, Any]) -> Any:  # delegated: the accounting role
        return {"rows": [], "next": None}

    def op_history_summary(self, args: dict[str, Any]) -> Any:
        return {"jobs": 0, "done": 0, "exit": 0, "requeued": 0, "cpu_hours": 0.0, "wall_hours": 0.0,
                "wait": {"p50": None, "p90": None, "p99": None, "mean": None}, "failures": {}}

    def op_history_job(self, args: dict[str, Any]) -> Any:
        raise RemoteError("NOT_FOUND", f"history.job: nothing is recorded for job {args['jobid']}")

    def op_history_events(self, args: dict[str, Any]) -> Any:
        return {"events": [], "next": None}

    def op_status(self, args: dict[str, Any]) -> Any:
        return {"server": self.store.server, "state": "primary", "primary": self.store.server,
                "since": 1700000000.0, "candidates": [
                    {"address": self.store.server, "state": "primary", "pid": 1, "since": 1700000000.0}],
                "jobs": self.store.replica.count("jobs"), "hosts": len(self.store.hosts),
                "members": len(self.store.members), "roles": {}, "member_list": [], "next": None,
                "store": "test-store", "rev": 1, "loading": False, "promotion": {},
                "backend": {"backend": "file"}}

    def op_events(self, args: dict[str, Any]) -> Any:  # the controller's own event log, pure
        from xce_controller.events import PAGE_DEFAULT, EventLog

        log = EventLog()
        log.record("queue_state", 1.0, queue="normal", state="closed", by="root")
        return log.page(args.get("since_seq", 0), args.get("kind"), args.get("since_time"),
                        args.get("limit", PAGE_DEFAULT), bool(args.get("last", False)))

    def op_revoke_token(self, args: dict[str, Any]) -> Any:
        record = {"key": "t:" + args["jti"], "user": args["user"], "jti": args["jti"],
                  "expires": args["expires"], "at": 0.0, "by": args["user"], "rev": 1}
        return {"key": record["key"], "revoked": True, "record": record}

    def op_revoke_tokens(self, args: dict[str, Any]) -> Any:
        if args["target"] != args["user"] and args["user"] != "admin":  # as the controller's policy
            raise RemoteError("DENIED", f"revoke_tokens: {args['user']} may revoke only their own "
                                        f"tokens, not {args['target']}'s")
        record = {"key": "u:" + args["target"], "user": args["target"], "before": 1.0,
                  "expires": 2.0, "by": args["user"], "rev": 1}
        return {"key": record["key"], "revoked": True, "record": record}

    def op_jobdispatch(self, args: dict[str, Any]) -> Any:
        if self.store.get_job(args["jobid"]) is None:
            raise RemoteError("NOT_FOUND", f"no such job {args['jobid']}")
        return {"jobid": args["jobid"], "state": "RUN", "alloc": args["alloc"]}


class Api:
    """Everything a route test needs."""

    def __init__(self) -> None:
        self.store = Store()
        load(self.store, full_state())
        self.health = BackendHealth()
        self.fake = FakeClient(self.store)
        self.backend = Backend(self.fake, self.health, timeout=1.0)
        users = parse_users([
            {"name": "alice", "password_hash": hash_password("alice-pw", iterations=FAST), "role": "user"},
            {"name": "bob", "password_hash": hash_password("bob-pw", iterations=FAST), "role": "user"},
            {"name": "root", "password_hash": hash_password("root-pw", iterations=FAST), "role": "admin"},
        ])
        self.auth = Authenticator(users)
        self.app = create_app(self.store, self.backend, self.health, self.auth, Evaluator)
        self.client: httpx.AsyncClient

    def token(self, name: str) -> dict[str, str]:
        """An Authorization header for user ``name``."""
        return {"Authorization": f"Bearer {self.auth.issue(self.auth.users[name]).token}"}
