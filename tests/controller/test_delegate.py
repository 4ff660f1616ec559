"""Delegated ops through a real controller: a member declares the ops it serves at join, a
call from a client is pushed to it with the caller's identity attached, and its answer (or
error) is relayed; a member that leaves fails its waiting calls; no member can claim a
controller op; front ends serve nothing."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from xcecore.candidates import Candidate
from xcecore.client import Client, SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster
from xcecore.wire import RemoteError

pytestmark = [pytest.mark.timeout(120)]


class Hooks:
    """Collects the ``delegate`` pushes a member gets."""

    def __init__(self) -> None:
        self.calls: queue.Queue[dict[str, Any]] = queue.Queue()

    def reconnected(self, client: Client, candidate: Candidate) -> object:
        client.mark_rejoin_pending()
        return None

    def connection_state(self, client: Client, state: str, candidate: Candidate | None, detail: str) -> object:
        return None

    def push(self, client: Client, role: str, event: str, seq: int, data: Any) -> object:
        if event == "delegate":
            self.calls.put(data)
        return None


@contextmanager
def member(cl: LocalCluster, role: str, serves: list[str]) -> Iterator[tuple[SyncClient, Hooks]]:
    _, cfg = load(cl.config_path)
    hooks = Hooks()
    with SyncClient.open(client_config(cfg, f"{role}@t"), role=role, hooks=hooks,
                         join_attrs={"serves": serves}) as c:
        c.call("join", {"role": role, "attrs": {"serves": serves}, "subscribe": {"pushes": "none"}},
               deadline=30)
        yield c, hooks


@contextmanager
def front(cl: LocalCluster, role: str = "cli") -> Iterator[SyncClient]:
    _, cfg = load(cl.config_path)
    with SyncClient.open(client_config(cfg, f"{role}@{socket.gethostname()}"), role=role) as c:
        yield c


def test_a_call_is_forwarded_with_the_callers_identity_and_relayed(xce_cluster: Any) -> None:
    cl: LocalCluster = xce_cluster(1, extra_config='[controller]\nadmins = ["ops"]\n')
    # Only a front end may name the user a call is for (the identity rules); it is the API server.
    with ExitStack() as serving, front(cl, "apiserver") as c:
        m, hooks = serving.enter_context(member(cl, "historian", ["history.jobs", "jobinfo", "no.such"]))
        answers: queue.Queue[Any] = queue.Queue()

        def ask(user: str, **args: Any) -> None:
            try:
                answers.put(c.call("history.jobs", {"user": user, **args}, deadline=30))
            except RemoteError as exc:
                answers.put(exc)

        threading.Thread(target=ask, args=("alice",), kwargs={"queue": "normal"}).start()
        call = hooks.calls.get(timeout=30)
        assert call["op"] == "history.jobs" and call["args"] == {"user": "alice", "queue": "normal"}
        assert call["caller"]["user"] == "alice" and call["caller"]["admin"] is False
        assert call["caller"]["role"] == "apiserver"
        assert m.call("delegate_reply", {"call": call["call"], "result": {"rows": [1], "next": None}},
                      deadline=30) == {"relayed": True}
        assert answers.get(timeout=30) == {"rows": [1], "next": None}
        # an error is relayed as the call's error; an administrator is marked so
        threading.Thread(target=ask, args=("ops",)).start()
        call = hooks.calls.get(timeout=30)
        assert call["caller"]["admin"] is True
        m.call("delegate_reply", {"call": call["call"], "error": {"code": "DENIED", "message": "no"}},
               deadline=30)
        err = answers.get(timeout=30)
        assert isinstance(err, RemoteError) and (err.code, err.message) == ("DENIED", "no")
        # the arguments are checked by the controller before anything is forwarded
        with pytest.raises(RemoteError) as bad:
            c.call("history.jobs", {"user": "alice", "limit": 5000}, deadline=30)
        assert bad.value.code == "INVALID" and "limit" in bad.value.message
        # a controller op cannot be claimed: jobinfo is still the controller's
        assert "jobs" in c.call("jobinfo", {"user": "alice"}, deadline=30)
        # an answer from another connection is refused; a late or unknown one is dropped
        threading.Thread(target=ask, args=("alice",)).start()
        call = hooks.calls.get(timeout=30)
        with front(cl, "cli") as other:
            with pytest.raises(RemoteError) as denied:
                other.call("delegate_reply", {"call": call["call"], "result": {"rows": []}}, deadline=30)
            assert denied.value.code == "DENIED"
        m.call("delegate_reply", {"call": call["call"], "result": {"rows": [], "next": None}}, deadline=30)
        assert answers.get(timeout=30) == {"rows": [], "next": None}
        assert m.call("delegate_reply", {"call": call["call"], "result": {}}, deadline=30) == {"relayed": False}
        # a member that leaves fails its waiting call at once
        threading.Thread(target=ask, args=("alice",)).start()
        hooks.calls.get(timeout=30)
        serving.close()  # the member's connection closes
        err = answers.get(timeout=30)
        assert isinstance(err, RemoteError) and err.code == "UNAVAILABLE" and "disconnected" in err.message
        with pytest.raises(RemoteError) as none:
            c.call("history.jobs", {"user": "alice"}, deadline=30)
        assert none.value.code == "UNAVAILABLE" and "no member serves history.jobs" in none.value.message


def test_front_ends_serve_nothing_and_must_name_a_user(xce_cluster: Any) -> None:
    cl: LocalCluster = xce_cluster(1)
    with member(cl, "apiserver", ["history.jobs"]), front(cl, "apiserver") as c:
        with pytest.raises(RemoteError) as none:
            c.call("history.jobs", {"user": "alice"}, deadline=30)
        assert none.value.code == "UNAVAILABLE"
        with pytest.raises(RemoteError) as anon:
            c.call("history.jobs", {}, deadline=30)
        assert anon.value.code == "INVALID" and "user" in anon.value.message


def test_a_member_that_does_not_answer_within_delegate_timeout_fails_the_call(xce_cluster: Any) -> None:
    cl: LocalCluster = xce_cluster(1, extra_config="[controller]\ndelegate_timeout = 0.5\n")
    with member(cl, "historian", ["history.jobs"]) as (_, hooks), front(cl, "apiserver") as c:
        with pytest.raises(RemoteError) as late:
            c.call("history.jobs", {"user": "alice"}, deadline=30)
        assert late.value.code == "UNAVAILABLE" and "0.5 s" in late.value.message, late.value
        assert hooks.calls.get(timeout=30)["op"] == "history.jobs"  # it was forwarded, not answered
