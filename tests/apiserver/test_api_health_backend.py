"""The breaker (health) and the one backend wrapper: unit tests with a clock and fakes.

The real-process behaviour (every candidate killed, a SIGSTOPped primary) is in
``test_api_cluster.py``; here each rule of :mod:`xce_apiserver.health` and each outcome of
:meth:`Backend.call` is pinned down.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from xce_apiserver.backend import REJOIN_POINTS, Backend, BackendUnavailableError, OutcomeUnknownError
from xce_apiserver.health import BackendHealth, verdict

from xcecore.client import BackendUnavailable, OutcomeUnknown
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------- the pure decision

def test_verdict_rules() -> None:
    assert verdict(10.0, True, 1.0, True, 0.25, "x").state == "closed"  # a live link wins
    v = verdict(10.0, False, 9.9, False, 0.25, "reconnecting: EOF")
    assert v.state == "grace" and v.remaining == pytest.approx(0.15) and not v.open
    v = verdict(10.0, False, 9.0, False, 0.25, "reconnecting: EOF")
    assert v.open and "reconnecting: EOF" in v.reason and "1.0 s ago" in v.reason
    assert verdict(10.0, False, 10.0, True, 0.25, "liveness timeout").open  # hung: no grace
    assert verdict(10.0, False, None, False, 0.0, "").open  # no grace configured


def test_grace_then_open_then_closed_by_a_link_up() -> None:
    clock = Clock()
    h = BackendHealth(clock, grace=0.25)
    assert h.verdict(True).state == "closed"
    h.link_lost("reconnecting: closed by the controller")
    clock.now += 0.1
    assert h.verdict(False).state == "grace"
    clock.now += 0.2
    v = h.verdict(False)
    assert v.open and "closed by the controller" in v.reason
    assert h.first_open() and not h.first_open() and h.announced  # announced once per outage
    clock.now += 3600  # no timer closes it: only a link up does
    assert h.verdict(False).open
    h.link_up()
    assert h.verdict(False).state == "grace" and not h.announced  # a new loss starts a new grace


def test_a_liveness_loss_opens_at_once_and_a_live_link_closes_it() -> None:
    clock = Clock()
    h = BackendHealth(clock, grace=5.0)
    h.link_lost("reconnecting: no frame for 2 s with 1 request(s) outstanding: liveness timeout")
    assert h.verdict(False).open
    assert h.verdict(True).state == "closed"  # connected before the hook said so
    assert h.verdict(False).state == "grace"  # and the old loss is forgotten


def test_the_first_loss_time_is_kept() -> None:
    clock = Clock()
    h = BackendHealth(clock, grace=1.0)
    h.link_lost("reconnecting: a")
    clock.now += 0.6
    h.link_lost("degraded: b")  # a later report of the same outage
    clock.now += 0.6
    assert h.verdict(False).open


def test_unknown_loss_starts_the_grace_when_first_seen() -> None:
    clock = Clock()
    h = BackendHealth(clock, grace=0.5)
    assert h.verdict(False).state == "grace"  # not connected, no hook yet
    clock.now += 0.6
    assert h.verdict(False).open


def test_bad_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="grace"):
        BackendHealth(grace=-1)


@pytest.mark.anyio
async def test_concurrent_use_from_tasks_and_threads() -> None:
    h = BackendHealth(grace=0.0)
    seen: list[str] = []

    async def task(i: int) -> None:
        for n in range(200):
            if (i + n) % 2:
                h.link_lost("reconnecting: x")
            else:
                h.link_up()
            seen.append(h.verdict(False).state)
            if n % 50 == 0:
                await anyio.lowlevel.checkpoint()

    def hammer() -> None:
        for _ in range(2000):
            h.link_lost("x")
            h.verdict(False)
            h.link_up()

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(task, i)
        for _ in range(2):
            tg.start_soon(anyio.to_thread.run_sync, hammer)
    assert len(seen) == 20 * 200 and set(seen) == {"open"}  # grace 0: down is open at once
    h.link_up()
    assert h.verdict(True).state == "closed"


# ---------------------------------------------------------------------- the wrapper

class Client:
    """A core client stand-in: ``connected``, ``connect``, and ``call`` with a ``rid``."""

    def __init__(self, result: Any = None, error: BaseException | None = None, delay: float = 0,
                 connected: bool = True, reconnects: bool = False) -> None:
        self.result, self.error, self.delay = result, error, delay
        self.connected, self.reconnects = connected, reconnects
        self.calls: list[dict[str, Any]] = []
        self.connects = 0

    async def connect(self, *, deadline: float | None = None, retry_budget: int | None = None) -> None:
        self.connects += 1
        if self.reconnects:
            self.connected = True
            return
        with anyio.fail_after(deadline or 1.0):
            await anyio.sleep(0.01)
        raise BackendUnavailable("no primary")

    async def call(self, op: str, args: dict[str, Any] | None = None, *, deadline: float | None = None,
                   retry_budget: int | None = None, rid: str | None = None) -> Any:
        self.calls.append({"op": op, "deadline": deadline, "retry_budget": retry_budget, "rid": rid,
                           "user": (args or {}).get("user")})
        if self.delay:
            await anyio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.anyio
async def test_call_passes_the_rid_a_bounded_budget_and_deadline() -> None:
    client = Client({"jobid": 1})
    backend = Backend(client, BackendHealth(), timeout=2.5, retries=4)
    assert await backend.call("jobsubmit", {"command": "x"}, rid="rest:k", user="alice") == {"jobid": 1}
    assert client.calls == [{"op": "jobsubmit", "deadline": 2.5, "retry_budget": 4, "rid": "rest:k",
                             "user": "alice"}]
    with pytest.raises(ValueError, match="must name one"):
        await backend.call("jobsubmit", {"command": "x"}, rid="rest:k2", user="")


@pytest.mark.anyio
async def test_open_breaker_fails_fast_without_touching_the_client() -> None:
    client = Client({"jobid": 1}, connected=False)
    health = BackendHealth(grace=0.0)
    health.link_lost("reconnecting: closed by the controller")
    backend = Backend(client, health, timeout=2.0)
    with anyio.fail_after(0.5):
        for op in REJOIN_POINTS:
            with pytest.raises(BackendUnavailableError) as info:
                await backend.call(op, {}, rid=f"r-{op}", user="alice")
            assert "closed by the controller" in info.value.message and "nothing was sent" in info.value.message
    assert client.calls == [] and client.connects == 0
    assert await backend.degraded() is not None


@pytest.mark.anyio
async def test_in_the_grace_a_write_waits_for_the_reconnect_then_goes() -> None:
    client = Client({"ok": 1}, connected=False, reconnects=True)
    health = BackendHealth(grace=5.0)
    health.link_lost("reconnecting: closed by the controller")
    backend = Backend(client, health)
    assert await backend.call("jobctrl", {}, rid="r1", user="alice") == {"ok": 1}
    assert client.connects == 1 and len(client.calls) == 1


@pytest.mark.anyio
async def test_no_primary_within_the_grace_is_503_and_nothing_sent() -> None:
    client = Client({"ok": 1}, connected=False)
    health = BackendHealth(grace=0.2)
    health.link_lost("reconnecting: closed by the controller")
    backend = Backend(client, health)
    with pytest.raises(BackendUnavailableError):
        await backend.call("jobsubmit", {}, rid="r1", user="alice")
    assert client.calls == [] and client.connects == 1


@pytest.mark.anyio
async def test_a_sent_write_without_answer_is_outcome_unknown_with_its_rid() -> None:
    client = Client(error=OutcomeUnknown("deadline passed after the send", rid="rest:abc:jobsubmit:k1",
                                         op="jobsubmit"))
    health = BackendHealth()
    backend = Backend(client, health, timeout=1.0)
    with pytest.raises(OutcomeUnknownError) as info:
        await backend.call("jobsubmit", {}, rid="rest:abc:jobsubmit:k1", user="alice")
    assert info.value.rid == "rest:abc:jobsubmit:k1" and info.value.op == "jobsubmit"
    assert not health.verdict(True).open  # the link is up: the breaker follows the link


@pytest.mark.anyio
async def test_a_write_the_client_reports_not_applied_is_503() -> None:
    backend = Backend(Client(error=BackendUnavailable("retry budget of 4 exhausted")), BackendHealth())
    with pytest.raises(BackendUnavailableError, match="budget of 4 exhausted"):
        await backend.call("jobsubmit", {}, rid="r", user="alice")


@pytest.mark.anyio
async def test_a_client_that_ignores_its_deadline_is_bounded_anyway() -> None:
    client = Client({"ok": 1}, delay=30)
    backend = Backend(client, BackendHealth(), timeout=0.05)
    with anyio.fail_after(5):
        with pytest.raises(OutcomeUnknownError):
            await backend.call("hostctrl", {}, rid="r", user="alice")


@pytest.mark.anyio
async def test_error_replies_pass_through_and_do_not_open_the_breaker() -> None:
    health = BackendHealth()
    backend = Backend(Client(error=RemoteError("CONFLICT", "queue closed")), health)
    with pytest.raises(RemoteError):
        await backend.call("jobsubmit", {}, rid="r", user="alice")
    assert health.verdict(True).state == "closed"


@pytest.mark.anyio
async def test_no_client_is_unavailable() -> None:
    with pytest.raises(BackendUnavailableError, match="no controller client"):
        await Backend(None, BackendHealth()).call("jobsubmit", {}, rid="r", user="alice")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_nobody_listening_only_when_every_candidate_refuses() -> None:
    import socket
    from types import SimpleNamespace

    from xce_apiserver.backend import nobody_listening

    from xcecore.candidates import Candidate

    with socket.socket() as closed, socket.socket() as listening:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        dead = Candidate("127.0.0.1", closed.getsockname()[1])
        alive = Candidate("127.0.0.1", listening.getsockname()[1])

        def client(*cands: Candidate) -> Any:
            return SimpleNamespace(config=SimpleNamespace(candidates=cands))

        assert await nobody_listening(client(dead, dead))
        assert not await nobody_listening(client(dead, alive))
        assert not await nobody_listening(SimpleNamespace())  # no candidate list: unknown


@pytest.mark.anyio
async def test_in_the_grace_a_dead_cluster_is_503_at_once() -> None:
    import socket
    from types import SimpleNamespace

    from xcecore.candidates import Candidate

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        client = Client({"ok": 1}, connected=False)
        client.config = SimpleNamespace(candidates=(Candidate("127.0.0.1", closed.getsockname()[1]),))
        health = BackendHealth(grace=60.0)
        health.link_lost("reconnecting: closed by the controller")
        with anyio.fail_after(5):  # not the 60 s grace
            with pytest.raises(BackendUnavailableError, match="no controller candidate is listening"):
                await Backend(client, health).call("jobsubmit", {}, rid="r", user="alice")
        assert client.connects == 0 and client.calls == []


@pytest.mark.anyio
async def test_without_heartbeats_a_write_probes_within_one_grace() -> None:
    from types import SimpleNamespace

    client = Client({"ok": 1}, connected=False, reconnects=True)
    client.config = SimpleNamespace(heartbeat_interval=0, candidates=())
    health = BackendHealth(grace=0.0)
    health.link_lost("reconnecting: closed by the controller")
    assert health.verdict(False).open  # nothing but a write would ever close it
    assert await Backend(client, health).call("jobsubmit", {}, rid="r", user="alice") == {"ok": 1}
    assert client.connects == 1
