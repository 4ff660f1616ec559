"""The health state (circuit breaker) and the one backend wrapper."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from xce_apiserver.backend import REJOIN_POINTS, Backend, BackendUnavailableError
from xce_apiserver.health import BackendHealth

from xcecore.client import BackendUnavailable
from xcecore.wire import RemoteError

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_degraded_then_healthy_by_mark_healthy() -> None:
    h = BackendHealth()
    assert not h.is_degraded() and h.retry_after() == 0
    h.mark_degraded(30, "down")
    assert h.is_degraded() and h.reason == "down" and 29 < h.retry_after() <= 30
    h.mark_healthy()
    assert not h.is_degraded() and h.reason == ""


def test_degraded_then_healthy_by_ttl_expiry() -> None:
    clock = Clock()
    h = BackendHealth(clock)
    h.mark_degraded(5)
    clock.now += 4.9
    assert h.is_degraded()
    clock.now += 0.2
    assert not h.is_degraded() and h.retry_after() == 0


def test_a_shorter_mark_never_shortens_a_longer_one() -> None:
    clock = Clock()
    h = BackendHealth(clock)
    h.mark_degraded(10)
    h.mark_degraded(1)
    clock.now += 5
    assert h.is_degraded()
    h.mark_degraded(0)  # a non-positive TTL is no mark
    assert h.is_degraded()


@pytest.mark.anyio
async def test_concurrent_use_from_many_tasks() -> None:
    h = BackendHealth()
    seen: list[bool] = []

    async def worker(i: int) -> None:
        for n in range(200):
            if (i + n) % 3 == 0:
                h.mark_degraded(0.5, f"task {i}")
            elif (i + n) % 3 == 1:
                h.mark_healthy()
            seen.append(h.is_degraded())
            h.retry_after()
            if n % 50 == 0:
                await anyio.lowlevel.checkpoint()

    async def thread_worker() -> None:
        def hammer() -> None:
            for _ in range(2000):
                h.mark_degraded(0.5)
                h.is_degraded()
                h.mark_healthy()
        await anyio.to_thread.run_sync(hammer)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(worker, i)
        for _ in range(4):
            tg.start_soon(thread_worker)
    assert len(seen) == 50 * 200 and True in seen and False in seen
    h.mark_healthy()
    assert not h.is_degraded()


class Client:
    def __init__(self, result: Any = None, error: BaseException | None = None, delay: float = 0) -> None:
        self.result, self.error, self.delay = result, error, delay
        self.kwargs: list[dict[str, Any]] = []

    async def call(self, op: str, args: dict[str, Any] | None = None, *,
                   deadline: float | None = None, retry_budget: int | None = None) -> Any:
        self.kwargs.append({"op": op, "deadline": deadline, "retry_budget": retry_budget})
        if self.delay:
            await anyio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.anyio
async def test_degraded_call_fails_fast_without_touching_the_client(mocker: Any) -> None:
    client = Client({"jobid": 1})
    spy = mocker.spy(client, "call")
    health = BackendHealth()
    backend = Backend(client, health, timeout=2.0, degraded_ttl=5.0)
    health.mark_degraded(5.0, "it is down")
    with anyio.fail_after(0.5):
        for op in REJOIN_POINTS:
            with pytest.raises(BackendUnavailableError) as info:
                await backend.call(op, {})
            assert "it is down" in info.value.message and info.value.retry_after > 4
    spy.assert_not_called()


@pytest.mark.anyio
async def test_call_passes_a_bounded_budget_and_deadline() -> None:
    client = Client({"jobid": 1})
    backend = Backend(client, BackendHealth(), timeout=2.5, retries=4)
    assert await backend.call("jobsubmit", {"command": "x"}) == {"jobid": 1}
    assert client.kwargs == [{"op": "jobsubmit", "deadline": 2.5, "retry_budget": 4}]


@pytest.mark.anyio
async def test_exhausted_budget_marks_degraded_then_fails_fast(mocker: Any) -> None:
    client = Client(error=BackendUnavailable("retry budget of 4 exhausted"))
    health = BackendHealth()
    backend = Backend(client, health, timeout=1.0, degraded_ttl=9.0)
    with pytest.raises(BackendUnavailableError) as info:
        await backend.call("jobsubmit", {})
    assert "exhausted" in info.value.message
    assert health.is_degraded() and 8 < health.retry_after() <= 9
    spy = mocker.spy(client, "call")
    with pytest.raises(BackendUnavailableError):
        await backend.call("jobctrl", {})
    spy.assert_not_called()


@pytest.mark.anyio
async def test_a_client_that_ignores_its_deadline_is_bounded_anyway() -> None:
    client = Client({"ok": 1}, delay=30)
    health = BackendHealth()
    backend = Backend(client, health, timeout=0.05, degraded_ttl=3.0)
    with anyio.fail_after(5):
        with pytest.raises(BackendUnavailableError):
            await backend.call("hostctrl", {})
    assert health.is_degraded()


@pytest.mark.anyio
async def test_error_replies_pass_through_and_do_not_degrade() -> None:
    health = BackendHealth()
    backend = Backend(Client(error=RemoteError("CONFLICT", "queue closed")), health)
    with pytest.raises(RemoteError):
        await backend.call("jobsubmit", {})
    assert not health.is_degraded()


@pytest.mark.anyio
async def test_success_after_ttl_expiry_marks_healthy() -> None:
    clock = Clock()
    health = BackendHealth(clock)
    backend = Backend(Client({"x": 1}), health, degraded_ttl=2.0)
    health.mark_degraded(2.0)
    clock.now += 3
    assert await backend.call("queuectrl", {}) == {"x": 1}
    assert not health.is_degraded()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
